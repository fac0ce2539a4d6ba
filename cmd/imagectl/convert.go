package main

import (
	"context"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/convert"
)

type convertOptions struct {
	*globalOptions
	imageFlags
	sourceFlags
	in, out     string
	to          string
	clusterSize int64
	sync        bool
}

func newConvertCmd(g *globalOptions) *cobra.Command {
	o := &convertOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "convert IN OUT",
		Short: "Validate a disk image and convert it to qcow2 or raw",
		Long: `Validates IN as untrusted input and writes it to OUT as a sparse qcow2 v3 image
(the default) or a raw image. OUT appears only once it is complete: a failed or
interrupted conversion leaves nothing behind. OUT may be "-" for standard output.

Exit codes: 0 success, 3 the image is rejected, 1 other errors.`,
		Example: `  imagectl convert disk.vmdk.raw disk.qcow2
  imagectl convert cloud.qcow2 cloud.raw --to raw`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.in, o.out = args[0], args[1]
			return runConvert(cmd.Context(), o)
		},
	}
	addImageFlags(cmd, &o.imageFlags)
	addSourceFlags(cmd, &o.sourceFlags)
	cmd.Flags().StringVar(&o.to, "to", "qcow2", "output format: qcow2 or raw")
	cmd.Flags().BoolVar(&o.sync, "sync", false, "flush OUT to disk before it appears (like qemu-img, the default leaves that to the kernel)")
	cmd.Flags().Int64Var(&o.clusterSize, "cluster-size", convert.DefaultClusterSize, "qcow2 output cluster size in bytes (512 to 2097152, a power of two)")
	return cmd
}

func runConvert(ctx context.Context, o *convertOptions) error {
	log := o.logger()
	start := time.Now()
	src, err := openSource(ctx, o.globalOptions, &o.sourceFlags, o.in, o.maxVirtualSize, false)
	if err != nil {
		return err
	}
	defer src.close()
	img, err := convert.Open(src.file, src.size, o.openOptions())
	if err != nil {
		return err
	}
	copts := convert.Options{
		To:          convert.Format(o.to),
		ClusterSize: o.clusterSize,
		Logger:      log,
	}
	// Both ways give Verify's verdict, the one inspect and import give: Plan
	// runs it before anything is written; WriteFile decompresses while it
	// writes to a temporary file, which only a verified image replaces OUT
	// with.
	if o.out == "-" {
		// A stream needs its size fixed first: plan, then write.
		plan, err := img.Plan(ctx, copts)
		if err != nil {
			return err
		}
		return plan.Write(ctx, os.Stdout)
	}
	var size int64
	err = convert.WriteFileAtomic(o.out, o.sync, func(f *convert.OutputFile) error {
		size, err = img.WriteFile(ctx, f.File, copts)
		return err
	})
	if err != nil {
		return err
	}
	log.Debug("converted", "out", o.out, "bytes", size, "elapsed", time.Since(start))
	return nil
}
