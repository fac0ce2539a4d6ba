package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/diskimage"
	"github.com/imagepipe/imagepipe/internal/guest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/source"
	"github.com/imagepipe/imagepipe/pkg/api"
)

type inspectOptions struct {
	*globalOptions
	imageFlags
	registryFlags
	sourceFlags
	source   string
	out      outputFlags
	platform *registry.Platform
	gateKeys string
	sbom     string
}

func newInspectCmd(g *globalOptions) *cobra.Command {
	o := &inspectOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "inspect SOURCE | docker://REGISTRY/TENANT/NAME:TAG",
		Short: "Describe a disk image or a pushed containerDisk and say whether imagepipe accepts it",
		Long: `Detects the format of a local disk image by content, validates it as untrusted
input, and prints its format, sizes and the verdict. Of an accepted image it
also says what the disk holds, read as hostile input within bounds: its
partition table and partitions, the firmware it can boot with (bios, uefi)
and its EFI loaders, the CPU architecture, the operating system its
os-release names, how many packages dpkg lists, its kernels and their virtio
drivers, and whether cloud-init, qemu-guest-agent and a serial console are
there; what cannot be read is a guest note, never a rejection. With --sbom
FILE, the installed packages are written to FILE as a CycloneDX 1.5 SBOM
(JSON, each package with its package URL), which trivy sbom and grype scan.

With docker://REF, describes the image in the registry instead: manifest,
platform, layer, io.imagepipe annotations and environment, and checks that it
is a containerDisk imagepipe accepts (one layer holding only disk/ and
disk/disk.img, 0444, owned 107:107) and that the disk's header passes
validation. Only the start of the layer is downloaded, so the disk's tables
and data are not checked; "imagectl export" reads and validates all of it.
With --gate-keys, the gate's signed verdict shows what the gate read inside
the disk; with --sbom FILE too, the SBOM the gate attached to the image (a
CycloneDX attestation, as cosign verify-attestation --type cyclonedx checks
it) is checked against those keys and the image's digest and written to FILE.

When REF names an image index (one tag for several platforms), the report
lists the platforms it holds and describes its image for --platform,
linux/amd64 by default (the platform import builds by default, not this
machine's). An index without exactly one image for it, or whose image's
config names another platform than the index says, is rejected. With
--platform, an image outside an index must be built for that platform.

A downloaded or compressed raw image is read once, through the digest and
format detection, and never written to disk; a downloaded or compressed
qcow2 image is copied to a sparse temporary file in --temp-dir first (its
tables may be anywhere in the file), within --max-spool.

Exit codes: 0 the image is acceptable, 3 it is rejected, 1 other errors.`,
		Example: `  imagectl inspect disk.qcow2
  imagectl inspect disk.raw.zst -o json
  imagectl inspect disk.qcow2 --sbom disk.cdx.json
  imagectl inspect docker://registry.example.com/acme/rhel:10
  imagectl inspect --gate-keys gate.pub --sbom rhel.cdx.json docker://registry.example.com/acme/rhel:10
  imagectl inspect --platform linux/arm64 docker://registry.example.com/acme/rhel:10`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.source = args[0]
			return runInspect(cmd, o)
		},
	}
	addImageFlags(cmd, &o.imageFlags)
	addSourceFlags(cmd, &o.sourceFlags)
	addRegistryFlags(cmd, &o.registryFlags)
	addOutputFlag(cmd, &o.out, outputTable, outputJSON, outputYAML)
	cmd.Flags().StringVar(&o.gateKeys, "gate-keys", "", "with docker://: the provider's public keys (PEM): show the gate's signed verdict on the image, which hubs require before they import it")
	cmd.Flags().StringVar(&o.sbom, "sbom", "", "write the guest's installed packages as a CycloneDX SBOM (JSON) to this file: of a disk file, read here (its subject is the disk's SHA-256); with docker://, the gate's SBOM attestation on the image, checked against --gate-keys (signed by one of them, about this image's digest)")
	addPlatformFlag(cmd, &o.platform, "with docker://: the platform (os/arch[/variant], e.g. linux/arm64) whose image to describe from an index, and that an image must be built for (default: an index's linux/amd64 image; an image as it is)")
	return cmd
}

func addImageFlags(cmd *cobra.Command, f *imageFlags) {
	cmd.Flags().StringVar(&f.format, "format", "", "declared input format (qcow2 or raw); content of another format is rejected")
	cmd.Flags().BoolVar(&f.allowISO, "allow-iso", false, "accept an ISO 9660 image as raw")
	cmd.Flags().Int64Var(&f.maxVirtualSize, "max-virtual-size", convert.DefaultMaxVirtualSize, "largest virtual disk size accepted, in bytes")
}

func runInspect(cmd *cobra.Command, o *inspectOptions) error {
	if err := o.out.validate(); err != nil {
		return err
	}
	if ref, ok := strings.CutPrefix(o.source, "docker://"); ok {
		return runInspectRemote(cmd, o, ref)
	}
	if o.platform != nil {
		return fmt.Errorf("--platform applies to images in a registry (docker://REF); a disk file has no platform")
	}
	if err := refuseTerminalStdin(cmd, o.source); err != nil {
		return err
	}
	ctx := cmd.Context()
	report := api.ImageReport{Source: source.DisplayName(o.source), Verdict: api.VerdictAccepted}
	img, err := openSource(ctx, o.globalOptions, &o.sourceFlags, o.source, o.maxVirtualSize, true, nil)
	if err != nil {
		if reject.As(err) == nil {
			return err
		}
		report.Format = "unknown"
	} else {
		defer img.close()
		report.Wrapper = string(img.wrapper)
		report.FileSize = img.size
		var pkgs []guest.Package
		if pkgs, err = inspectImage(cmd, o, img, &report); err == nil && o.sbom != "" {
			if err := writeLocalSBOM(cmd.Context(), o, img, &report, pkgs); err != nil {
				return err
			}
		}
	}
	if err != nil {
		re := reject.As(err)
		if re == nil {
			return err
		}
		report.Verdict = api.VerdictRejected
		report.Reasons = []api.Rejection{rejection(re)}
	}
	if err := printReport(cmd.OutOrStdout(), &o.out, &report); err != nil {
		return err
	}
	if report.Verdict == api.VerdictRejected {
		return &reportedError{code: exitRejected}
	}
	return nil
}

// inspectImage fills report from the image and returns the guest's
// packages, or its rejection.
func inspectImage(cmd *cobra.Command, o *inspectOptions, img *openedSource, report *api.ImageReport) ([]guest.Package, error) {
	det, err := convert.Detect(img.file, img.size)
	if err != nil {
		return nil, err
	}
	report.Format = string(det.Format)
	image, err := convert.Open(img.file, img.size, o.openOptions())
	if err != nil {
		return nil, err
	}
	info := image.Info()
	report.Format = string(info.Format)
	report.VirtualSize = info.VirtualSize
	report.ClusterSize = info.ClusterSize
	report.Compat = info.Compat
	report.CompressionType = info.CompressionType
	sum, err := image.Verify(cmd.Context()) // the verdict convert and import reach too
	if err != nil {
		return nil, err
	}
	report.AllocatedSize = sum.AllocatedBytes
	if img.src.Streamed {
		// A streamed raw image has no file to ask for holes; its non-zero
		// 4 KiB blocks were counted as it went by.
		report.AllocatedSize = img.src.DataBytes
	}
	report.CompressedClusters = sum.CompressedClusters
	var pkgs []guest.Package
	report.Guest, pkgs = inspectGuest(cmd.Context(), image, img)
	return pkgs, nil
}

// inspectGuest reads what the verified image holds, and its packages; a
// raw image streamed through (compressed, or downloaded) was read once
// and is not kept, so its guest is not read.
func inspectGuest(ctx context.Context, image *convert.Image, img *openedSource) (*api.GuestReport, []guest.Package) {
	if img.src.Streamed {
		return &api.GuestReport{PartitionTable: "unknown", Notes: []string{guestNotStreamed}}, nil
	}
	g, err := image.Guest(ctx)
	if err != nil {
		return &api.GuestReport{PartitionTable: "unknown", Notes: []string{"not read: " + err.Error()}}, nil
	}
	return guest.InspectPackages(g, image.Info().VirtualSize)
}

// guestNotStreamed is the guest note of a streamed image.
const guestNotStreamed = "not read: a compressed or downloaded raw image is read once as it streams; convert it to a file first to look inside"

// writeLocalSBOM writes to --sbom the SBOM of the disk file img, whose
// guest report lists pkgs: the generator the gate uses, with the disk's
// SHA-256 (of its bytes, unwrapped) as the subject.
func writeLocalSBOM(ctx context.Context, o *inspectOptions, img *openedSource, report *api.ImageReport, pkgs []guest.Package) error {
	if img.src.Streamed {
		return fmt.Errorf("--sbom: the guest of %s was %s", report.Source, strings.TrimPrefix(guestNotStreamed, "not read: "))
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(img.file, 0, img.size)); err != nil {
		return fmt.Errorf("hashing %s for its SBOM: %w", report.Source, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var osr *api.GuestOS
	if report.Guest != nil {
		osr = report.Guest.OS
	}
	bom, err := guest.BOM(guest.BOMSubject{Digest: fmt.Sprintf("sha256:%x", h.Sum(nil)), Name: filepath.Base(report.Source)}, osr, pkgs, "")
	if err != nil {
		return fmt.Errorf("--sbom: %w", err)
	}
	return writeSBOM(o.sbom, bom)
}

// writeSBOM writes bom to path.
func writeSBOM(path string, bom []byte) error {
	if err := os.WriteFile(path, append(bom, '\n'), 0o644); err != nil {
		return fmt.Errorf("--sbom: %w", err)
	}
	return nil
}

// printReport prints an inspection as the pkg/api model or as rows.
func printReport(w io.Writer, out *outputFlags, r *api.ImageReport) error {
	return out.print(w, r, table(func(tw *tabwriter.Writer) { reportRows(tw, r) }))
}

func reportRows(tw *tabwriter.Writer, r *api.ImageReport) {
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("source", r.Source)
	if r.Wrapper != "" {
		row("wrapper", r.Wrapper)
	}
	row("format", r.Format)
	if r.VirtualSize > 0 {
		row("virtual size", humanBytes(r.VirtualSize))
		row("allocated size", humanBytes(r.AllocatedSize))
	}
	row("file size", humanBytes(r.FileSize))
	if r.ClusterSize > 0 {
		row("cluster size", humanBytes(r.ClusterSize))
		row("compat", r.Compat)
		row("compression", fmt.Sprintf("%s (%d compressed clusters)", r.CompressionType, r.CompressedClusters))
	}
	row("verdict", r.Verdict)
	for _, reason := range r.Reasons {
		row("reason", reason.Code+": "+reason.Message)
	}
	if r.Guest != nil {
		guestRows(row, r.Guest)
	}
}

// guestRows shows what a disk holds.
func guestRows(row func(string, any), g *api.GuestReport) {
	row("partition table", g.PartitionTable)
	if g.Filesystem != "" {
		row("filesystem", g.Filesystem)
	}
	for _, p := range g.Partitions {
		row(fmt.Sprintf("partition %d", p.Number), strings.Join(nonEmpty(humanBytes(p.Size), p.Role, p.Filesystem), " "))
	}
	var fw []string
	if g.Firmware.BIOS {
		fw = append(fw, "bios")
	}
	if g.Firmware.UEFI {
		fw = append(fw, "uefi")
	}
	if len(fw) == 0 {
		fw = append(fw, "none found")
	}
	firmware := strings.Join(fw, ", ")
	if len(g.Firmware.Loaders) > 0 {
		firmware += " (" + strings.Join(g.Firmware.Loaders, ", ") + ")"
	}
	row("firmware", firmware)
	if g.Architecture != "" {
		row("architecture", g.Architecture)
	}
	if g.OS != nil {
		row("os", strings.Join(nonEmpty(g.OS.PrettyName, "("+strings.Join(nonEmpty(g.OS.ID, g.OS.VersionID), " ")+")"), " "))
	}
	if g.Packages != nil {
		row("packages", fmt.Sprintf("%d (%s)", g.Packages.Count, g.Packages.Manager))
	}
	for _, k := range g.Kernels {
		row("kernel", k.Version+" (virtio: "+orNone(strings.Join(k.Virtio, ", "))+")")
	}
	if g.OS != nil {
		row("cloud-init", yesNo(g.CloudInit))
		if g.CloudbaseInit {
			row("cloudbase-init", "yes")
		}
		if g.Ignition {
			row("ignition", "yes")
		}
		row("guest agent", yesNo(g.GuestAgent))
		row("serial console", yesNo(g.SerialConsole))
	}
	for _, n := range g.Notes {
		row("guest note", n)
	}
	if b := g.Boot; b != nil {
		if b.Booted {
			row("boot check", fmt.Sprintf("booted with %s under %s in %.0fs: %q", b.Firmware, b.Accelerator, b.Seconds, b.Signal))
		} else {
			row("boot check", "did not boot: "+b.Reason)
			if n := len(b.LastLines); n > 0 {
				row("console", fmt.Sprintf("%q", b.LastLines[n-1]))
			}
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// nonEmpty drops the empty strings of ss.
func nonEmpty(ss ...string) []string {
	return slices.DeleteFunc(ss, func(s string) bool { return s == "" || s == "()" })
}

// runInspectRemote describes and checks the containerDisk at ref.
func runInspectRemote(cmd *cobra.Command, o *inspectOptions, ref string) error {
	if o.sbom != "" && o.gateKeys == "" {
		return fmt.Errorf("--sbom with docker:// writes the gate's signed SBOM: give the provider's keys with --gate-keys")
	}
	client, err := o.registryFlags.client(o.globalOptions, platformOption(o.platform)...)
	if err != nil {
		return err
	}
	parsed, err := o.registryFlags.parseImage(ref)
	if err != nil {
		return err
	}
	r, err := diskimage.Check(cmd.Context(), client, parsed)
	if err != nil {
		return err
	}
	if o.gateKeys != "" {
		if r.Gate, err = gateReport(cmd.Context(), client, parsed, o.gateKeys); err != nil {
			return err
		}
	}
	if o.sbom != "" {
		if r.Digest == "" {
			return fmt.Errorf("--sbom: %s names no image to read the SBOM of", ref)
		}
		bom, err := gateSBOM(cmd.Context(), client, parsed.Context().Digest(r.Digest), o.gateKeys)
		if err != nil {
			return fmt.Errorf("--sbom: %w", err)
		}
		if err := writeSBOM(o.sbom, bom); err != nil {
			return err
		}
	}
	err = o.out.print(cmd.OutOrStdout(), r, table(func(tw *tabwriter.Writer) {
		row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
		row("reference", r.Reference)
		if r.Index {
			row("index", r.IndexDigest)
			row("platforms", orDash(strings.Join(r.Platforms, ", ")))
		}
		if r.Digest != "" {
			row("digest", r.Digest)
			row("media type", r.MediaType)
			row("platform", orDash(r.Platform))
		}
		if r.LayerDigest != "" {
			row("layer", fmt.Sprintf("%s, %s, %s", r.LayerMediaType, humanBytes(r.LayerSize), r.LayerDigest))
		}
		for _, k := range slices.Sorted(maps.Keys(r.Annotations)) {
			row("annotation", k+"="+r.Annotations[k])
		}
		for _, e := range r.Env {
			row("env", e)
		}
		if r.DiskFormat != "" {
			row("disk", fmt.Sprintf("%s, %s, %s", api.DiskPath, r.DiskFormat, humanBytes(r.DiskSize)))
		}
		if r.VirtualSize > 0 {
			row("virtual size", humanBytes(r.VirtualSize))
		}
		if r.Checked == api.CheckedHeader {
			row("checked", "header checks passed (the disk's tables and data were not downloaded)")
		}
		row("verdict", r.Verdict)
		for _, reason := range r.Reasons {
			row("reason", reason.Code+": "+reason.Message)
		}
		gateRows(row, r.Gate)
	}))
	if err != nil {
		return err
	}
	if r.Verdict == api.VerdictRejected || (r.Gate != nil && r.Gate.Verdict != nil && r.Gate.Verdict.Verdict == api.VerdictRejected) {
		return &reportedError{code: exitRejected}
	}
	return nil
}
