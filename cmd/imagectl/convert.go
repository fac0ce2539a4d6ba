package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/pkg/api"
)

type convertOptions struct {
	*globalOptions
	imageFlags
	sourceFlags
	in, out     string
	to          string
	clusterSize int64
	sync        bool
	output      outputFlags
	quiet       bool
}

func newConvertCmd(g *globalOptions) *cobra.Command {
	o := &convertOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "convert IN OUT",
		Short: "Validate a disk image and convert it to qcow2 or raw",
		Long: `Validates IN as untrusted input and writes it to OUT as a sparse qcow2 v3 image
(the default) or a raw image. OUT appears only once it is complete: a failed or
interrupted conversion leaves nothing behind. OUT may be "-" for standard output. OUT may not be IN.

Exit codes: 0 success, 3 the image is rejected, 1 other errors.`,
		Example: `  imagectl convert disk.vmdk.raw disk.qcow2
  imagectl convert cloud.qcow2 cloud.raw --to raw`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.in, o.out = args[0], args[1]
			return runConvert(cmd, o)
		},
	}
	addImageFlags(cmd, &o.imageFlags)
	addSourceFlags(cmd, &o.sourceFlags)
	cmd.Flags().StringVar(&o.to, "to", "qcow2", "output format: qcow2 or raw")
	cmd.Flags().BoolVar(&o.sync, "sync", false, "flush OUT to disk before it appears (like qemu-img, the default leaves that to the kernel)")
	addOutputFlag(cmd, &o.output, outputTable, outputJSON, outputYAML)
	cmd.Flags().Int64Var(&o.clusterSize, "cluster-size", convert.DefaultClusterSize, "qcow2 output cluster size in bytes (512 to 2097152, a power of two)")
	cmd.Flags().BoolVarP(&o.quiet, "quiet", "q", false, "no progress bars")
	return cmd
}

func runConvert(cmd *cobra.Command, o *convertOptions) error {
	ctx := cmd.Context()
	if err := o.output.validate(); err != nil {
		return err
	}
	if o.out == "-" && o.output.machine() {
		return &usageError{errors.New("-o json and -o yaml need standard output, which OUT \"-\" takes for the disk")}
	}
	if err := refuseSameFile(o.in, o.out); err != nil {
		return err
	}
	if err := refuseTerminalStdin(cmd, o.in); err != nil {
		return err
	}
	log := o.logger()
	start := time.Now()
	// A download or a compressed file is read (and spooled) first; a
	// local uncompressed file is not read until the conversion.
	readBar := newProgressBar("reading   ", o.quiet)
	src, err := openSource(ctx, o.globalOptions, &o.sourceFlags, o.in, o.maxVirtualSize, false, readBar.update)
	readBar.finish()
	if err != nil {
		return err
	}
	defer src.close()
	img, err := convert.Open(src.file, src.size, o.openOptions())
	if err != nil {
		return err
	}
	convertBar := newProgressBar("converting", o.quiet)
	defer convertBar.finish()
	copts := convert.Options{
		To:          convert.Format(o.to),
		ClusterSize: o.clusterSize,
		Logger:      log,
		Progress:    convertBar.update,
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
	convertBar.finish()
	if err != nil {
		return err
	}
	log.Debug("converted", "out", o.out, "bytes", size, "elapsed", time.Since(start))
	res := api.ConvertResult{Output: o.out, Format: o.to, VirtualSize: img.Info().VirtualSize, FileSize: size}
	// A converter is silent on success, as qemu-img and cp are.
	return o.output.print(cmd.OutOrStdout(), res, func(io.Writer) error { return nil })
}

// refuseSameFile refuses to write out over in: the temporary file that
// replaces OUT would replace the input, which is then lost if the
// conversion is wrong. Two names of one file (a hard or symbolic link,
// "./x" and "x") count as the same.
func refuseSameFile(in, out string) error {
	if in == "-" || out == "-" {
		return nil
	}
	inInfo, err := os.Stat(in)
	if err != nil {
		return nil // not a local file (a URL), or missing: the source says so
	}
	outInfo, err := os.Stat(out)
	if err != nil {
		return nil
	}
	if os.SameFile(inInfo, outInfo) {
		return &usageError{fmt.Errorf("OUT %s is the input file; write to another file and rename it if you mean to replace the input", out)}
	}
	return nil
}
