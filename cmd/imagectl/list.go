package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/diskimage"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

type listOptions struct {
	*globalOptions
	registryFlags
	target string // REGISTRY/TENANT or REGISTRY/TENANT/NAME
	out    outputFlags
}

func newListCmd(g *globalOptions) *cobra.Command {
	o := &listOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "list REGISTRY/TENANT[/NAME]",
		Short: "List the tags of a repository, or of every repository of a tenant",
		Long: `Lists every tag of the repository REGISTRY/TENANT/NAME (like crane ls), or of
every repository under REGISTRY/TENANT, with its digest and, for images
imagepipe built, the disk's virtual size, format and creation time ("-" where
an image does not record them). Build-key tags are not shown.

Listing a whole tenant needs the registry's catalog API (/v2/_catalog), which
some registries (Harbor, GHCR) restrict; listing one repository does not.
-o name prints one REGISTRY/TENANT/NAME:TAG per line; -o wide adds the full
digest and the source's digest.`,
		Example: `  imagectl list registry.example.com/acme/rhel
  imagectl list registry.example.com/acme
  imagectl list registry.example.com/acme -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.target = args[0]
			return runList(cmd, o)
		},
	}
	addRegistryFlags(cmd, &o.registryFlags)
	addOutputFlag(cmd, &o.out, listFormats...)
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
	listings, err := list(cmd, &o.registryFlags, client, o.target)
	if err != nil {
		return err
	}
	if listings == nil {
		listings = []api.ImageListing{} // [] rather than null
	}
	names := make([]string, len(listings))
	for i, l := range listings {
		names[i] = l.Repository + ":" + l.Tag
	}
	return o.out.show(cmd.OutOrStdout(), view{data: listings, names: names, table: func(w io.Writer, wide bool) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		if wide {
			fmt.Fprintln(tw, "REPOSITORY\tTAG\tDIGEST\tVIRTUAL SIZE\tFORMAT\tCREATED\tSOURCE DIGEST")
		} else {
			fmt.Fprintln(tw, "REPOSITORY\tTAG\tDIGEST\tVIRTUAL SIZE\tFORMAT\tCREATED")
		}
		for _, l := range listings {
			size := "-"
			if l.VirtualSize > 0 {
				size = shortBytes(l.VirtualSize)
			}
			if wide {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Repository, l.Tag, l.Digest, size, orDash(l.DiskFormat), orDash(l.Created), orDash(l.SourceDigest))
			} else {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Repository, l.Tag, shortDigest(l.Digest), size, orDash(l.DiskFormat), orDash(l.Created))
			}
		}
		return tw.Flush()
	}})
}

// list lists one repository when target names one, else the tenant's
// every repository through the catalog. f are the flags client was built
// from.
func list(cmd *cobra.Command, f *registryFlags, client *registry.Client, target string) ([]api.ImageListing, error) {
	last := target[strings.LastIndex(target, "/")+1:]
	if strings.Contains(target, "@") || strings.Contains(target, "/") && strings.Contains(last, ":") {
		return nil, &usageError{fmt.Errorf("list takes REGISTRY/TENANT or REGISTRY/TENANT/NAME, not a tag or digest: drop the :TAG or @DIGEST from %q, or use imagectl inspect docker://%s", target, target)}
	}
	if strings.Count(strings.TrimSuffix(target, "/"), "/") > 1 { // REGISTRY/TENANT/NAME...
		ref, err := imageref.Parse(target, imageref.FormRepository)
		if err != nil {
			return nil, err
		}
		if _, err := ref.Tenant(); err != nil {
			return nil, err
		}
		repo, err := f.names().Repository(ref)
		if err != nil {
			return nil, err
		}
		return diskimage.ListRepository(cmd.Context(), client, repo)
	}
	ref, err := imageref.Parse(target, imageref.FormTenant)
	if err != nil {
		return nil, err
	}
	reg, err := f.names().Registry(ref)
	if err != nil {
		return nil, err
	}
	listings, err := diskimage.List(cmd.Context(), client, reg, ref.Repository)
	var cat *diskimage.CatalogError
	if errors.As(err, &cat) {
		return nil, &hintedError{explain(f.user, err, false), fmt.Sprintf("the registry may restrict its catalog; list one repository instead: imagectl list %s/%s/NAME", cat.Registry, cat.Tenant)}
	}
	return listings, err
}
