package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/imagepipe/imagepipe/internal/version"
)

// globalOptions are the flags every command shares.
type globalOptions struct {
	verbose bool
}

func (g *globalOptions) logger() *slog.Logger {
	if !g.verbose {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newRootCmd() *cobra.Command {
	g := &globalOptions{}
	root := &cobra.Command{
		Use:   "imagectl",
		Short: "Validate, convert and publish VM disk images",
		Long: `imagectl validates untrusted qcow2 and raw disk images and converts them natively.

Exit codes: 0 success, 1 error, 3 the image was rejected by validation,
130 and 143 interrupted by SIGINT (Ctrl-C) and SIGTERM.`,
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	groupCommand(root)
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "log debug details to stderr")
	root.PersistentPreRun = func(*cobra.Command, []string) {
		// client-go logs through klog, which would print its retries
		// and warnings on stderr beside the command's own error; they go
		// to the one logger instead, shown with --verbose.
		klog.SetLogger(logr.FromSlogHandler(g.logger().Handler()))
	}
	root.AddCommand(newInspectCmd(g), newConvertCmd(g), newImportCmd(g),
		newListCmd(g), newExportCmd(g), newDeleteCmd(g), newCopyCmd(g), newSignCmd(g),
		newTemplateCmd(g), newVMCmd(g), newVolumeCmd(g), newNetworkCmd(g), newLoadBalancerCmd(g), newStatusCmd(g), newVersionCmd(),
		newLoginCmd(g), newLogoutCmd(g))
	// cobra's own completion and help commands, which Execute would add,
	// get the same refusal of unknown subcommands and topics.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			groupCommand(c)
		}
	}
	root.SetHelpCommand(newHelpCmd())
	markUsageErrors(root)
	return root
}

// markUsageErrors makes the flag and argument errors of cmd and every
// command below it usageErrors, which -o json reports with code "usage".
func markUsageErrors(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				return &usageError{err}
			}
			return nil
		}
	}
	for _, c := range cmd.Commands() {
		markUsageErrors(c)
	}
}

// newHelpCmd is "imagectl help [COMMAND...]": cobra's, except that an
// unknown topic fails like an unknown command instead of printing the
// root's usage with exit code 0.
func newHelpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Long:  "Help provides help for any command in the application.",
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil {
				return err
			}
			if len(rest) > 0 && cmd.HasSubCommands() {
				return unknownCommandError(cmd, rest[0])
			}
			return cmd.Help()
		},
	}
}

// groupCommand makes cmd, a command that only holds subcommands, fail on
// an unknown subcommand (cobra would print the help and exit 0 for any
// but the root) and suggest the nearest ones; without arguments it prints
// its help.
func groupCommand(cmd *cobra.Command) {
	if !strings.Contains(cmd.Use, " ") {
		cmd.Use += " COMMAND"
	}
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		return unknownCommandError(c, args[0])
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
}

// unknownCommandError says that typed is not a subcommand of c, with the
// subcommands it may have meant.
func unknownCommandError(c *cobra.Command, typed string) error {
	msg := fmt.Sprintf("unknown command %q for %q", typed, c.CommandPath())
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2
	}
	if s := c.SuggestionsFor(typed); len(s) > 0 {
		quoted := make([]string, len(s))
		for i, name := range s {
			quoted[i] = fmt.Sprintf("%q", name)
		}
		return fmt.Errorf("%s; did you mean %s?", msg, strings.Join(quoted, " or "))
	}
	return fmt.Errorf("%s; %q lists its commands", msg, c.CommandPath()+" --help")
}
