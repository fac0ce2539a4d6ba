package main

import (
	"fmt"
	"io"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/cachefile"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/registry"
)

type copyOptions struct {
	*globalOptions
	registryFlags
	src, dst string
	out      outputFlags
	platform *registry.Platform
	quiet    bool
}

func newCopyCmd(g *globalOptions) *cobra.Command {
	o := &copyOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "copy SRC_REF DST_REF",
		Short: "Copy an image between repositories or registries, keeping its digest",
		Long: `Copies the image SRC_REF names to DST_REF, manifest byte for byte, so that it
keeps its digest. Blobs DST already holds are not sent again, and within one
registry they are mounted rather than copied. When this machine built the
image, DST is added to its build record, so importing the same source there
only tags it.

An image index (one tag for several platforms) is copied whole, every image it
lists with it, and keeps its digest too. With --platform, only the index's
image for that platform is copied: DST then holds that image, with the
image's own digest, not an index. The copy fails, naming the platforms the
index holds, when it holds no image for the platform or more than one, or
when that image's config names another platform; an image outside an index
must be built for the platform.

The registry flags apply to both registries. Prints DST@DIGEST.

Exit codes: 0 copied, 3 --platform found no single image for the platform,
1 other errors.`,
		Example: `  imagectl copy registry.example.com/acme/rhel:10 registry.example.com/acme/rhel-stable:10
  imagectl copy staging.example.com/acme/rhel:10 registry.example.com/acme/rhel:10
  imagectl copy --platform linux/arm64 registry.example.com/acme/rhel:10 registry.example.com/acme/rhel:10-arm64`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.src, o.dst = args[0], args[1]
			return runCopy(cmd, o)
		},
	}
	addRegistryFlags(cmd, &o.registryFlags)
	addOutputFlag(cmd, &o.out, resultFormats...)
	addPlatformFlag(cmd, &o.platform, "copy only the image for this platform (os/arch[/variant], e.g. linux/arm64) from an index (default: the whole index)")
	cmd.Flags().BoolVarP(&o.quiet, "quiet", "q", false, "no progress bar")
	return cmd
}

func runCopy(cmd *cobra.Command, o *copyOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	client, err := o.registryFlags.client(o.globalOptions)
	if err != nil {
		return err
	}
	src, err := o.registryFlags.parseImage(o.src)
	if err != nil {
		return err
	}
	dst, err := o.registryFlags.parseImage(o.dst)
	if err != nil {
		return err
	}
	bar := newProgressBar("copying", o.quiet)
	pinned, err := client.Copy(cmd.Context(), src, dst, registry.CopyOptions{Platform: o.platform, Progress: bar.update})
	bar.finish()
	if err != nil {
		return err
	}
	(&publish.Importer{CacheDir: cachefile.Dir(), Logger: o.logger()}).RecordCopy(pinned.DigestStr(), pinned.Context())
	res := api.CopyResult{Source: o.src, Reference: pinned.String(), Digest: pinned.DigestStr()}
	return o.out.show(cmd.OutOrStdout(), view{data: res, names: []string{res.Reference}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintln(w, res.Reference)
		return err
	}})
}
