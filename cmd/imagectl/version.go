package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/version"
	"github.com/imagepipe/imagepipe/pkg/api"
)

type versionOptions struct {
	out outputFlags
}

func newVersionCmd() *cobra.Command {
	o := &versionOptions{}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print which build of imagectl this is",
		Long: `Prints imagectl's release version, the commit it was built from (with
"(modified)" when the working tree had uncommitted changes), the Go toolchain
and the platform. "imagectl --version" prints the same on one line.`,
		Example: `  imagectl version
  imagectl version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runVersion(cmd.OutOrStdout(), o)
		},
	}
	addOutputFlag(cmd, &o.out, outputTable, outputJSON, outputYAML)
	return cmd
}

func runVersion(w io.Writer, o *versionOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	info := api.VersionInfo(version.Get())
	return o.out.print(w, info, table(func(tw *tabwriter.Writer) {
		commit := orDash(info.Commit)
		if info.Modified {
			commit += " (modified)"
		}
		fmt.Fprintf(tw, "Version:\t%s\n", info.Version)
		fmt.Fprintf(tw, "Commit:\t%s\n", commit)
		fmt.Fprintf(tw, "Go:\t%s\n", info.GoVersion)
		fmt.Fprintf(tw, "Platform:\t%s\n", info.Platform)
	}))
}
