package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/cachefile"
	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/internal/version"
)

type importOptions struct {
	*globalOptions
	imageFlags
	registryFlags
	sourceFlags
	src, ref     string
	diskFormat   string
	compression  string
	platform     *registry.Platform
	append       bool
	labels       []string
	instancetype string
	preference   string
	osName       string
	created      string
	signKey      string
	out          outputFlags
	quiet        bool
}

func newImportCmd(g *globalOptions) *cobra.Command {
	o := &importOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "import SOURCE REGISTRY/TENANT/NAME:TAG",
		Short: "Validate a disk image and push it to a registry as a KubeVirt containerDisk",
		Long: `Validates SOURCE as untrusted input, converts it, and streams it to the registry
as a KubeVirt containerDisk: one layer holding disk/disk.img (0444, owned 107:107).
SOURCE is a local file, an http(s):// URL, s3://BUCKET/KEY or "-" for standard
input, optionally gzip-, zstd- or xz-compressed.

The tag is written only after every blob is committed. An interrupted upload
resumes where the registry left off, also in a later run. An identical
re-import (same source bytes and options) on the machine that pushed the image
only tags it, once the registry is found to hold exactly what was pushed.

--platform (default linux/amd64) is the platform of the nodes the VM runs on,
recorded in the image config; the guest's own OS does not matter. Without
--append the tag is overwritten, as crane push does (a warning says so when
it held an image index). With --append the image is pushed by digest and then
added to the image index at the tag, replacing the entry of its platform and
keeping the others; an image the tag held becomes the entry of its own
platform. Run it once per platform to publish one tag for several
architectures; the tag only ever moves from one complete index to the next.
Two --append imports to one tag at the same moment can lose one entry (the
registry protocol has no conditional write): publish one tag's platforms one
after the other, or run a lost one again, which then only updates the index.

Exit codes: 0 pushed, 3 the image is rejected (nothing is pushed), 1 other
errors, 130 and 143 interrupted by SIGINT and SIGTERM (the upload is kept: run
the same command again to resume).`,
		Example: `  imagectl import ./rhel.qcow2 registry.example.com/acme/rhel:10
  imagectl import --append --platform linux/amd64 ./fedora-x86_64.qcow2 registry.example.com/acme/fedora:41
  imagectl import --append --platform linux/arm64 ./fedora-aarch64.qcow2 registry.example.com/acme/fedora:41
  imagectl import s3://images/fedora.raw.zst registry.example.com/acme/fedora:41 --disk-format raw
  curl -sL https://example.com/disk.qcow2 | imagectl import - registry.example.com/acme/disk:1 -o json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.src, o.ref = args[0], args[1]
			return runImport(cmd, o)
		},
	}
	addImageFlags(cmd, &o.imageFlags)
	addRegistryFlags(cmd, &o.registryFlags)
	addChunkFlag(cmd, &o.registryFlags)
	addSourceFlags(cmd, &o.sourceFlags)
	f := cmd.Flags()
	f.StringVar(&o.diskFormat, "disk-format", "qcow2", "format of disk/disk.img: qcow2 or raw")
	f.StringVar(&o.compression, "compression", "gzip", "layer compression: gzip, zstd or none")
	addPlatformFlag(cmd, &o.platform, "platform of the nodes the VM runs on, recorded in the image config, e.g. linux/arm64 (default linux/amd64)")
	f.BoolVar(&o.append, "append", false, "add the image to the image index at the tag (made from what the tag holds), replacing its entry for the platform, instead of overwriting the tag")
	f.StringArrayVar(&o.labels, "label", nil, "label KEY=VALUE for the image config (repeatable)")
	f.StringVar(&o.instancetype, "default-instancetype", "", "default KubeVirt instancetype for VMs from this image")
	f.StringVar(&o.preference, "default-preference", "", "default KubeVirt preference for VMs from this image")
	f.StringVar(&o.osName, "os-name", "", "operating system name recorded in the annotations, e.g. fedora-41")
	f.StringVar(&o.created, "created", "", `creation time to record: "now" or RFC 3339 (default none, which keeps images reproducible)`)
	f.StringVar(&o.signKey, "sign-key", "", "after the push, sign what the tag holds with this private key, as imagectl sign --key does")
	addOutputFlag(cmd, &o.out, resultFormats...)
	f.BoolVarP(&o.quiet, "quiet", "q", false, "no progress bars")
	return cmd
}

func runImport(cmd *cobra.Command, o *importOptions) error {
	ctx := cmd.Context()
	if err := o.out.validate(); err != nil {
		return err
	}
	if o.src == "-" && o.passwordStdin {
		return &usageError{errors.New(`SOURCE "-" and --password-stdin both read standard input; give the source as a file or URL, or log in first with imagectl login`)}
	}
	if err := refuseTerminalStdin(cmd, o.src); err != nil {
		return err
	}
	iopts, dopts, err := o.importOptions()
	if err != nil {
		return err
	}
	dopts.Logger = o.logger()
	client, err := o.registryFlags.client(o.globalOptions)
	if err != nil {
		return err
	}
	ref, err := imageref.Parse(o.ref, imageref.FormTag)
	if err != nil {
		return err
	}
	repo, err := o.names().Repository(ref)
	if err != nil {
		return err
	}
	tag := repo.Tag(ref.Tag)
	var signer *attest.Signer
	if o.signKey != "" {
		// A key that cannot be read is found before anything is pushed.
		if signer, err = loadSigningKey(o.signKey); err != nil {
			return err
		}
	}
	// A wrong password or an unreachable registry is found before the
	// source is read, not after a long download.
	if err := client.CheckAccess(ctx, repo.Registry, repo.RepositoryStr()); err != nil {
		return err
	}

	readBar := newProgressBar("reading ", o.quiet)
	sopts := o.sourceFlags.options(o.globalOptions, o.maxVirtualSize, readBar.update)
	sopts.DeferDigest = true // a local file is hashed while the layer is built
	src, err := source.Open(ctx, o.src, sopts)
	readBar.finish()
	if err != nil {
		return reportRejection(cmd, &o.out, o.src, explainSource(err))
	}
	defer src.Close()
	img, err := convert.Open(src.ReaderAt, src.Size, o.openOptions())
	if err != nil {
		return err
	}
	// The whole verdict (tables, shared clusters, every compressed cluster)
	// before anything is sent to the registry.
	if _, err := img.Verify(ctx); err != nil {
		return err
	}
	disk, err := containerdisk.NewDisk(img, dopts)
	if err != nil {
		return err
	}
	pushBar := newProgressBar("pushing ", o.quiet)
	iopts.Progress = pushBar.update
	importer := &publish.Importer{Registry: client, CacheDir: cachefile.Dir(), Logger: o.logger()}
	result, err := importer.Import(ctx, tag, disk, src, iopts)
	pushBar.finish()
	if err != nil {
		return interrupted(ctx, err, errors.Is(err, registry.ErrResumable))
	}
	if signer != nil {
		if _, err := signImage(ctx, client, signer, tag.Context().Digest(result.Digest)); err != nil {
			return fmt.Errorf("the image is pushed (%s) but not signed: %w; sign it with imagectl sign", result.Pinned, err)
		}
	}
	if result.Reused && !o.quiet && !o.out.machine() {
		if o.append {
			fmt.Fprintln(cmd.ErrOrStderr(), "an identical image was already in the repository; only the index was written")
		} else {
			fmt.Fprintln(cmd.ErrOrStderr(), "an identical image was already in the repository; only the tag was written")
		}
	}
	if len(result.ReplacedIndex) > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s held an image index of %s; it now holds only this %s image (--append adds an image to the index)\n",
			result.Reference, strings.Join(result.ReplacedIndex, ", "), result.Platform)
	}
	if o.append && !o.quiet && !o.out.machine() {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s image %s is in the index, which holds %s\n", result.Platform, result.ImageDigest, strings.Join(result.Platforms, ", "))
	}
	return o.out.show(cmd.OutOrStdout(), view{data: result, names: []string{result.Pinned}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintf(w, "%s@%s\n", result.Reference, result.Digest)
		return err
	}})
}

// importOptions turns the flags into the image's and the disk's options.
func (o *importOptions) importOptions() (publish.ImportOptions, containerdisk.Options, error) {
	comp, err := containerdisk.ParseCompression(o.compression)
	if err != nil {
		return publish.ImportOptions{}, containerdisk.Options{}, err
	}
	labels := map[string]string{}
	for _, kv := range o.labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return publish.ImportOptions{}, containerdisk.Options{}, fmt.Errorf("--label %q is not KEY=VALUE", kv)
		}
		labels[k] = v
	}
	var created time.Time
	switch o.created {
	case "":
	case "now":
		created = time.Now()
	default:
		if created, err = time.Parse(time.RFC3339, o.created); err != nil {
			return publish.ImportOptions{}, containerdisk.Options{}, fmt.Errorf("--created: %w", err)
		}
	}
	platform := registry.DefaultPlatform
	if o.platform != nil {
		platform = *o.platform
	}
	dopts := containerdisk.Options{DiskFormat: convert.Format(o.diskFormat), Compression: comp}
	return publish.ImportOptions{
		OS:                  platform.OS,
		Architecture:        platform.Architecture,
		Variant:             platform.Variant,
		Append:              o.append,
		Labels:              labels,
		DefaultInstancetype: o.instancetype,
		DefaultPreference:   o.preference,
		OSName:              o.osName,
		Created:             created,
		Creator:             "imagectl " + version.Version,
	}, dopts, nil
}
