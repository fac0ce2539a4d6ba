package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/pkg/api"
)

type listOptions struct {
	*globalOptions
	registryFlags
	tenant string
	out    outputFlags
}

func newListCmd(g *globalOptions) *cobra.Command {
	o := &listOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "list REGISTRY/TENANT",
		Short: "List a tenant's images: every tag of every repository",
		Long: `Lists every tag of every repository under REGISTRY/TENANT with its digest and,
for images imagepipe built, the disk's virtual size, format and creation time
("-" where an image does not record them). Build-key tags are not shown.

The registry must offer the catalog API (/v2/_catalog) to the user.`,
		Example: `  imagectl list registry.example.com/acme
  imagectl list registry.example.com/acme -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.tenant = args[0]
			return runList(cmd, o)
		},
	}
	addRegistryFlags(cmd, &o.registryFlags)
	addOutputFlag(cmd, &o.out, outputTable, outputJSON, outputYAML)
	return cmd
}

func runList(cmd *cobra.Command, o *listOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	client, err := o.registryFlags.client(o.globalOptions)
	if err != nil {
		return err
	}
	reg, tenant, err := client.ParseTenant(o.tenant)
	if err != nil {
		return err
	}
	listings, err := client.List(cmd.Context(), reg, tenant)
	if err != nil {
		return err
	}
	if listings == nil {
		listings = []api.ImageListing{} // [] rather than null
	}
	return o.out.print(cmd.OutOrStdout(), listings, table(func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "REPOSITORY\tTAG\tDIGEST\tVIRTUAL SIZE\tFORMAT\tCREATED")
		for _, l := range listings {
			size := "-"
			if l.VirtualSize > 0 {
				size = shortBytes(l.VirtualSize)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Repository, l.Tag, shortDigest(l.Digest), size, orDash(l.DiskFormat), orDash(l.Created))
		}
	}))
}
