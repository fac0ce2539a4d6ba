package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/convert"
)

type exportOptions struct {
	*globalOptions
	registryFlags
	ref, file string
	to        string
	sync      bool
}

func newExportCmd(g *globalOptions) *cobra.Command {
	o := &exportOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "export REGISTRY/TENANT/NAME:TAG FILE",
		Short: "Pull a containerDisk and write its disk to a file",
		Long: `Pulls the containerDisk REF, verifying every digest, and writes disk/disk.img to
FILE: as it is, or converted with --to. The layer streams straight into a
temporary file next to FILE; the disk is then validated like any untrusted
image. FILE appears only once it is complete: a failure or a rejection
leaves nothing behind.

Exit codes: 0 success, 3 the image or its disk is rejected, 1 other errors.`,
		Example: `  imagectl export registry.example.com/acme/rhel:10 rhel.qcow2
  imagectl export registry.example.com/acme/rhel@sha256:... rhel.raw --to raw`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.ref, o.file = args[0], args[1]
			return runExport(cmd, o)
		},
	}
	addRegistryFlags(cmd, &o.registryFlags)
	cmd.Flags().StringVar(&o.to, "to", "", "format of FILE: qcow2 or raw (default: the disk's own format)")
	cmd.Flags().BoolVar(&o.sync, "sync", false, "flush FILE to disk before it appears")
	return cmd
}

func runExport(cmd *cobra.Command, o *exportOptions) (err error) {
	ctx := cmd.Context()
	to := convert.Format(o.to)
	if to != "" && to != convert.FormatQCOW2 && to != convert.FormatRaw {
		return fmt.Errorf("unknown format %q for --to (qcow2 or raw)", o.to)
	}
	client, err := o.registryFlags.client(o.globalOptions)
	if err != nil {
		return err
	}
	ref, err := client.ParseReference(o.ref)
	if err != nil {
		return err
	}

	tmp, err := os.CreateTemp(filepath.Dir(o.file), "."+filepath.Base(o.file)+".pull-*")
	if err != nil {
		return err
	}
	defer func() {
		tmp.Close()
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	sparse := &sparseWriter{f: tmp}
	disk, err := client.ExtractDisk(ctx, ref, sparse)
	if err != nil {
		return err
	}
	if err := sparse.finish(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	// The disk came from a registry: untrusted like any upload. The format
	// the image records is the one it must have.
	img, err := convert.Open(tmp, disk.Size, convert.OpenOptions{Format: disk.Format, AllowISO: true})
	if err != nil {
		return err
	}
	if _, err := img.Map(ctx); err != nil {
		return err
	}
	info := img.Info()
	if to == "" {
		to = info.Format
	}
	if to == info.Format {
		err = o.keep(tmp)
	} else {
		err = o.convert(cmd, img, to)
		if err == nil {
			err = os.Remove(tmp.Name())
		}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: %s, virtual size %s, from %s@%s\n",
		o.file, to, humanBytes(info.VirtualSize), ref.Context(), disk.Digest)
	return nil
}

// keep renames the pulled disk into place.
func (o *exportOptions) keep(tmp *os.File) error {
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if o.sync {
		if err := tmp.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", o.file, err)
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), o.file)
}

// convert writes the disk to FILE in format to.
func (o *exportOptions) convert(cmd *cobra.Command, img *convert.Image, to convert.Format) error {
	plan, err := img.Plan(cmd.Context(), convert.Options{To: to, Logger: o.logger()})
	if err != nil {
		return err
	}
	return writeAtomically(o.file, o.sync, func(f *os.File) error { return plan.Write(cmd.Context(), f) })
}

// sparseWriter writes a stream to a new file, leaving holes where whole
// 4 KiB blocks are zero, as qemu-img does for raw output.
type sparseWriter struct {
	f   *os.File
	off int64
}

const sparseBlock = 4096

var zeroBlock = make([]byte, sparseBlock)

func (s *sparseWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		// One run of blocks that are all data, or all zero, aligned to
		// the file's blocks.
		first := min(len(p), sparseBlock-int(s.off%sparseBlock))
		zero := bytes.Equal(p[:first], zeroBlock[:first])
		end := first
		for end < len(p) {
			k := min(len(p)-end, sparseBlock)
			if bytes.Equal(p[end:end+k], zeroBlock[:k]) != zero {
				break
			}
			end += k
		}
		if !zero {
			if _, err := s.f.WriteAt(p[:end], s.off); err != nil {
				return n - len(p), err
			}
		}
		s.off += int64(end)
		p = p[end:]
	}
	return n, nil
}

// finish sets the file's size, which trailing holes did not.
func (s *sparseWriter) finish() error { return s.f.Truncate(s.off) }
