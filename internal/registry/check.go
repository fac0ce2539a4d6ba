package registry

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// CheckContainerDisk describes the image at ref and checks that it is a
// containerDisk imagepipe accepts, without downloading its layer: the
// layer is streamed only until the tar headers and the first cluster of
// disk/disk.img have been read. The disk's header then goes through the
// disk engine's checks against the size in its tar header; its L1/L2
// tables and data are not read (the report says so in Checked).
//
// A rejection is a verdict in the report, not an error; errors are for
// images that cannot be read at all. An image index resolves to its
// linux/amd64 image.
func (c *Client) CheckContainerDisk(ctx context.Context, ref name.Reference) (*api.ContainerDiskReport, error) {
	img, err := c.remoteImage(ctx, ref)
	if err != nil {
		return nil, err
	}
	report := &api.ContainerDiskReport{Reference: ref.String(), Verdict: api.VerdictAccepted}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	report.Digest = digest.String()
	mt, err := img.MediaType()
	if err != nil {
		return nil, err
	}
	report.MediaType = string(mt)
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("reading the manifest of %s: %w", ref, err)
	}
	report.Annotations = m.Annotations
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the config of %s: %w", ref, err)
	}
	if p := cfg.Platform(); p != nil {
		report.Platform = p.String()
	}
	report.Env = cfg.Config.Env
	if len(m.Layers) > 0 {
		l := m.Layers[0]
		report.LayerMediaType, report.LayerSize, report.LayerDigest = string(l.MediaType), l.Size, l.Digest.String()
	}

	err = checkLayer(img, m, report)
	if se := AsShapeError(err); se != nil {
		report.Verdict = api.VerdictRejected
		report.Reasons = append(report.Reasons, api.Rejection{Code: se.Reason, Message: se.Detail})
		return report, nil
	}
	if re := convert.AsReject(err); re != nil {
		report.Verdict = api.VerdictRejected
		report.Reasons = append(report.Reasons, api.Rejection{Code: string(re.Reason), Message: re.Detail})
		return report, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checking %s: %w", ref, err)
	}
	return report, nil
}

// checkLayer streams the single layer up to the disk's head and validates
// both, filling the disk fields of report.
func checkLayer(img v1.Image, m *v1.Manifest, report *api.ContainerDiskReport) error {
	if len(m.Layers) != 1 {
		return shapeError(api.ReasonLayerCount, "the image has %d layers; a containerDisk has exactly one", len(m.Layers))
	}
	desc := m.Layers[0]
	layer, err := img.LayerByDigest(desc.Digest)
	if err != nil {
		return err
	}
	rc, err := layer.Compressed()
	if err != nil {
		return fmt.Errorf("fetching layer %s: %w", desc.Digest, err)
	}
	defer rc.Close() // before the end: the rest of the blob is never sent
	src := &trackedReader{r: rc}
	tarStream, err := decompressLayer(desc.MediaType, src)
	if err != nil {
		return layerError(err, src)
	}
	defer tarStream.Close()
	tr := tar.NewReader(tarStream)
	file, err := diskEntry(tr)
	if err != nil {
		return layerError(err, src)
	}
	report.DiskSize = file.Size
	head, err := readDiskHead(tr, file.Size)
	if err != nil {
		return layerError(err, src)
	}

	hr := &headReaderAt{head: head}
	if det, err := convert.Detect(hr, file.Size); err == nil {
		report.DiskFormat = string(det.Format)
	}
	// The declared format is the one imagepipe recorded; an ISO imported
	// with --allow-iso is stored as raw and was accepted then.
	opts := convert.OpenOptions{Format: convert.Format(m.Annotations[api.AnnotationDiskFormat]), AllowISO: true}
	disk, err := convert.Open(hr, file.Size, opts)
	if err != nil {
		return err
	}
	info := disk.Info()
	report.DiskFormat = string(info.Format)
	report.VirtualSize = info.VirtualSize
	if s, ok := m.Annotations[api.AnnotationVirtualSize]; ok {
		if n, err := strconv.ParseInt(s, 10, 64); err != nil || n != info.VirtualSize {
			return shapeError(api.ReasonAnnotationMismatch, "the annotation %s is %q but the disk's virtual size is %d bytes", api.AnnotationVirtualSize, s, info.VirtualSize)
		}
	}
	report.Checked = api.CheckedHeader
	return nil
}

// readDiskHead reads the first 64 KiB of the disk (size bytes), or its
// whole first cluster when it is a qcow2 image with larger clusters: the
// header and its extensions fill at most that cluster, 2 MiB.
func readDiskHead(r io.Reader, size int64) ([]byte, error) {
	head := make([]byte, min(size, convert.ProbeSize))
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	if len(head) >= 24 && string(head[:4]) == "QFI\xfb" {
		if bits := binary.BigEndian.Uint32(head[20:]); bits > 16 && bits <= 21 {
			more := make([]byte, min(size, 1<<bits)-int64(len(head)))
			if _, err := io.ReadFull(r, more); err != nil {
				return nil, err
			}
			head = append(head, more...)
		}
	}
	return head, nil
}

// remoteImage resolves ref to an image (an index to its linux/amd64 image).
func (c *Client) remoteImage(ctx context.Context, ref name.Reference) (v1.Image, error) {
	ropts, err := c.remoteOptions(ctx, ref.Context().Registry)
	if err != nil {
		return nil, err
	}
	img, err := remote.Image(ref, ropts...)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", ref, err)
	}
	return img, nil
}
