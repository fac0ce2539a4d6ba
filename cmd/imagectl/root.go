package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

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

Exit codes: 0 success, 1 error, 3 the image was rejected by validation.`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "log debug details to stderr")
	root.AddCommand(newInspectCmd(g), newConvertCmd(g), newImportCmd(g),
		newListCmd(g), newExportCmd(g), newDeleteCmd(g), newCopyCmd(g),
		newTemplateCmd(g), newVMCmd(g), newVolumeCmd(g))
	return root
}
