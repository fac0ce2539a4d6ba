package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/diskimage"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

type exportOptions struct {
	*globalOptions
	registryFlags
	ref, file string
	to        string
	sync      bool
	out       outputFlags
	platform  *registry.Platform
	quiet     bool
}

func newExportCmd(g *globalOptions) *cobra.Command {
	o := &exportOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "export REGISTRY/TENANT/NAME:TAG FILE|-",
		Short: "Pull a containerDisk and write its disk to a file",
		Long: `Pulls the containerDisk REF, verifying every digest, and writes disk/disk.img to
FILE: as it is, or converted with --to. The layer streams straight into a
temporary file next to FILE; the disk is then validated like any untrusted
image. FILE appears only once it is complete: a failure or a rejection
leaves nothing behind. FILE "-" writes the disk to standard output, once it
is validated (it is held in a temporary file in $TMPDIR until then).

When REF names an image index (one tag for several platforms), the disk of
its image for --platform is written, linux/amd64 by default (the platform
import builds by default, not this machine's: the disk is for the cluster's
nodes). An index without exactly one image for it, or whose image's config
names another platform, is rejected, naming the platforms it holds. With
--platform, an image outside an index must be built for that platform.

Exit codes: 0 success, 3 the image or its disk is rejected, 1 other errors.`,
		Example: `  imagectl export registry.example.com/acme/rhel:10 rhel.qcow2
  imagectl export registry.example.com/acme/rhel@sha256:... rhel.raw --to raw
  imagectl export registry.example.com/acme/rhel:10 - --to raw | dd of=/dev/vdb bs=1M
  imagectl export --platform linux/arm64 registry.example.com/acme/rhel:10 rhel-arm64.qcow2`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.ref, o.file = args[0], args[1]
			return runExport(cmd, o)
		},
	}
	addRegistryFlags(cmd, &o.registryFlags)
	cmd.Flags().StringVar(&o.to, "to", "", "format of FILE: qcow2 or raw (default: the disk's own format)")
	cmd.Flags().BoolVar(&o.sync, "sync", false, "flush FILE to disk before it appears")
	addOutputFlag(cmd, &o.out, resultFormats...)
	addPlatformFlag(cmd, &o.platform, "the platform (os/arch[/variant], e.g. linux/arm64) whose disk to take from an image index, and that an image must be built for (default: an index's linux/amd64 image; an image as it is)")
	cmd.Flags().BoolVarP(&o.quiet, "quiet", "q", false, "no progress bars")
	return cmd
}

func runExport(cmd *cobra.Command, o *exportOptions) error {
	ctx := cmd.Context()
	if err := o.out.validate(); err != nil {
		return err
	}
	toStdout := o.file == "-"
	if toStdout && o.out.format != outputTable {
		return &usageError{errors.New("FILE \"-\" takes standard output for the disk; -o prints nothing then")}
	}
	to := convert.Format(o.to)
	if to != "" && to != convert.FormatQCOW2 && to != convert.FormatRaw {
		return fmt.Errorf("unknown format %q for --to (qcow2 or raw)", o.to)
	}
	client, err := o.registryFlags.client(o.globalOptions, platformOption(o.platform)...)
	if err != nil {
		return err
	}
	ref, err := o.registryFlags.parseImage(o.ref)
	if err != nil {
		return err
	}

	// The layer streams straight into the output's temporary file; for
	// standard output, into one in a private temporary directory.
	target := o.file
	if toStdout {
		dir, err := os.MkdirTemp("", "imagectl-export-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		target = filepath.Join(dir, "disk")
	}
	out, err := convert.CreateOutput(target, o.sync)
	if err != nil {
		return err
	}
	defer out.Discard()
	pullBar := newProgressBar("pulling   ", o.quiet)
	disk, err := diskimage.Extract(ctx, client, ref, out, diskimage.ExtractOptions{Progress: pullBar.update})
	pullBar.finish()
	if err != nil {
		return err
	}
	if err := out.Finish(); err != nil {
		return err
	}
	// The disk came from a registry: untrusted like any upload. The format
	// the image records is the one it must have.
	img, err := convert.Open(out.File, disk.Size, convert.OpenOptions{Format: convert.Format(disk.Format), AllowISO: true})
	if err != nil {
		return err
	}
	if _, err := img.Verify(ctx); err != nil {
		return err
	}
	info := img.Info()
	if to == "" {
		to = info.Format
	}
	if toStdout {
		return writeStdout(cmd, img, out.File, disk.Size, to, info.Format, o.quiet)
	}
	if to == info.Format {
		err = out.Commit()
	} else {
		err = o.convert(cmd, img, to)
	}
	if err != nil {
		return err
	}
	pinned := ref.Context().Digest(disk.Digest).String()
	res := api.ExportResult{File: o.file, Format: string(to), VirtualSize: info.VirtualSize, Reference: pinned, Platform: disk.Platform}
	from := ""
	if disk.Index != nil {
		from = fmt.Sprintf(" (%s, from the index %s@%s of %s)", orDash(disk.Platform), ref.Context(), disk.Index.Digest, strings.Join(disk.Index.Platforms, ", "))
	}
	return o.out.show(cmd.OutOrStdout(), view{data: res, names: []string{o.file}, table: func(w io.Writer, _ bool) error {
		_, err := fmt.Fprintf(w, "%s: %s, virtual size %s, from %s%s\n", o.file, to, humanBytes(info.VirtualSize), pinned, from)
		return err
	}})
}

// writeStdout writes the validated disk in file (size bytes, format from)
// to standard output in format to.
func writeStdout(cmd *cobra.Command, img *convert.Image, file *os.File, size int64, to, from convert.Format, quiet bool) error {
	w := cmd.OutOrStdout()
	if to == from {
		_, err := io.Copy(w, io.NewSectionReader(file, 0, size))
		return err
	}
	bar := newProgressBar("converting", quiet)
	defer bar.finish()
	plan, err := img.Plan(cmd.Context(), convert.Options{To: to, Progress: bar.update})
	if err != nil {
		return err
	}
	return plan.Write(cmd.Context(), w)
}

// convert writes the disk to FILE in format to.
func (o *exportOptions) convert(cmd *cobra.Command, img *convert.Image, to convert.Format) error {
	bar := newProgressBar("converting", o.quiet)
	defer bar.finish()
	plan, err := img.Plan(cmd.Context(), convert.Options{To: to, Logger: o.logger(), Progress: bar.update})
	if err != nil {
		return err
	}
	return convert.WriteFileAtomic(o.file, o.sync, func(f *convert.OutputFile) error { return plan.Write(cmd.Context(), f.File) })
}
