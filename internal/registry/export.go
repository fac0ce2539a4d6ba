package registry

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// ExtractedDisk describes the disk ExtractDisk wrote.
type ExtractedDisk struct {
	// Digest is the manifest digest of the image ("sha256:...").
	Digest string
	// Format is the disk format the image's annotations record; empty for
	// images imagepipe did not build.
	Format convert.Format
	// Size is the size of disk/disk.img in bytes.
	Size int64
}

// ExtractDisk pulls the containerDisk at ref and writes disk/disk.img to w
// as the layer streams in; nothing else of the layer is kept. The layer
// must have the shape CheckContainerDisk checks, and nothing may follow the
// disk in it (else a *ShapeError). The layer is read to its last byte, so
// its digest is verified, and its uncompressed digest is compared with the
// config's diff ID. On an error, w holds a partial disk the caller discards.
// The disk itself is not validated: open it with convert.Open.
func (c *Client) ExtractDisk(ctx context.Context, ref name.Reference, w io.Writer) (*ExtractedDisk, error) {
	img, err := c.remoteImage(ctx, ref)
	if err != nil {
		return nil, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("reading the manifest of %s: %w", ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the config of %s: %w", ref, err)
	}
	if len(m.Layers) != 1 {
		return nil, shapeError(api.ReasonLayerCount, "the image has %d layers; a containerDisk has exactly one", len(m.Layers))
	}
	desc := m.Layers[0]
	layer, err := img.LayerByDigest(desc.Digest)
	if err != nil {
		return nil, err
	}
	rc, err := layer.Compressed()
	if err != nil {
		return nil, fmt.Errorf("fetching layer %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	src := &trackedReader{r: rc}
	tarStream, err := decompressLayer(desc.MediaType, src)
	if err != nil {
		return nil, layerError(err, src)
	}
	defer tarStream.Close()
	diff := sha256.New()
	tarIn := io.TeeReader(tarStream, diff)
	tr := tar.NewReader(tarIn)
	file, err := diskEntry(tr)
	if err != nil {
		return nil, layerError(err, src)
	}
	if err := copyDisk(ctx, w, tr, src); err != nil {
		return nil, err
	}
	next, err := tr.Next()
	if err == nil {
		return nil, shapeError(api.ReasonTarEntry, "the layer holds %q after %s; a containerDisk holds nothing else", next.Name, api.DiskPath)
	}
	if !errors.Is(err, io.EOF) {
		return nil, layerError(err, src)
	}
	// Read the tar's padding, the compression trailer and whatever the
	// blob holds after them: the digest is checked at the blob's end.
	if _, err := io.Copy(io.Discard, tarIn); err != nil {
		return nil, layerError(err, src)
	}
	if _, err := io.Copy(io.Discard, src); err != nil {
		return nil, fmt.Errorf("reading layer %s: %w", desc.Digest, err)
	}
	if ids := cfg.RootFS.DiffIDs; len(ids) == 1 {
		if got := fmt.Sprintf("sha256:%x", diff.Sum(nil)); got != ids[0].String() {
			return nil, fmt.Errorf("layer %s uncompresses to %s, but the config's diff ID is %s", desc.Digest, got, ids[0])
		}
	}
	return &ExtractedDisk{
		Digest: digest.String(),
		Format: convert.Format(m.Annotations[api.AnnotationDiskFormat]),
		Size:   file.Size,
	}, nil
}

// copyDisk copies the current tar entry to w, stopping when ctx is done.
func copyDisk(ctx context.Context, w io.Writer, tr *tar.Reader, src *trackedReader) error {
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := tr.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return fmt.Errorf("writing the disk: %w", err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return layerError(rerr, src)
		}
	}
}
