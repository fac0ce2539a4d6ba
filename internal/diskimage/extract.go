package diskimage

import (
	"context"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// ExtractedDisk describes the disk Extract wrote.
type ExtractedDisk struct {
	// Digest is the manifest digest of the image ("sha256:...").
	Digest string
	// Format is the disk format the image's annotations record; empty for
	// images imagepipe did not build.
	Format string
	// Size is the size of disk/disk.img in bytes.
	Size int64
	// Platform is the platform the image's config names, e.g.
	// "linux/arm64"; empty when it names none.
	Platform string
	// Index describes the index the reference named, if it named one.
	Index *registry.IndexInfo
}

// ExtractOptions tune Extract. The zero value reports nothing.
type ExtractOptions struct {
	// Progress, when set, is called as the layer is pulled, with its
	// bytes read so far as stored in the registry (compressed) and its
	// size from the manifest. It is called from Extract's goroutine.
	Progress func(done, total int64)
}

// Extract pulls the containerDisk at ref and writes disk/disk.img to w
// as the layer streams in; nothing else of the layer is kept. The layer
// must have the shape Check checks, and nothing may follow the
// disk in it (else a *reject.Error with a shape reason). The layer is read to its
// last byte, so its digest is verified, and its uncompressed digest is
// compared with the config's diff ID. On an error, w holds a partial disk
// the caller discards. The disk itself is not validated: open it with
// convert.Open.
//
// An image index resolves as in Check: to its one image for
// the client's platform, else linux/amd64; when there is no such image,
// the rejection names the platforms the index holds.
func Extract(ctx context.Context, reg Registry, ref name.Reference, w io.Writer, opts ExtractOptions) (*ExtractedDisk, error) {
	img, index, err := reg.PlatformImage(ctx, ref)
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
	if err := containerdisk.CheckLayerCount(len(m.Layers)); err != nil {
		return nil, err
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
	var layerBytes io.Reader = rc
	if opts.Progress != nil {
		layerBytes = &progressReader{r: rc, total: desc.Size, progress: opts.Progress}
	}
	lr, err := containerdisk.OpenLayer(string(desc.MediaType), layerBytes)
	if err != nil {
		return nil, err
	}
	defer lr.Close()
	diffID, err := lr.CopyDisk(ctx, w)
	if err != nil {
		return nil, err
	}
	if ids := cfg.RootFS.DiffIDs; len(ids) == 1 && diffID != ids[0].String() {
		return nil, fmt.Errorf("layer %s uncompresses to %s, but the config's diff ID is %s", desc.Digest, diffID, ids[0])
	}
	out := &ExtractedDisk{
		Digest: digest.String(),
		Format: m.Annotations[api.AnnotationDiskFormat],
		Size:   lr.DiskSize(),
		Index:  index,
	}
	if p := cfg.Platform(); p != nil {
		out.Platform = p.String()
	}
	return out, nil
}

// progressReader reports the bytes read through it.
type progressReader struct {
	r        io.Reader
	done     int64
	total    int64
	progress func(done, total int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.done += int64(n)
		p.progress(p.done, p.total)
	}
	return n, err
}
