package diskimage

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Registry is what checking and extracting need of a registry;
// *registry.Client implements it.
type Registry interface {
	PlatformImage(ctx context.Context, ref name.Reference) (v1.Image, *registry.IndexInfo, error)
}

var _ Registry = (*registry.Client)(nil)

// Check describes the image at ref and checks that it is a
// containerDisk imagepipe accepts, without downloading its layer: the
// layer is streamed only until the tar headers and the first cluster of
// disk/disk.img have been read. The disk's header then goes through the
// disk engine's checks against the size in its tar header; its L1/L2
// tables and data are not read (the report says so in Checked).
//
// A rejection is a verdict in the report, not an error; errors are for
// images that cannot be read at all. An image index resolves to its image
// for the client's platform (WithPlatform, WithArchitecture; linux/amd64
// by default; see registry.Client.PlatformImage), and the report lists
// the platforms the index holds.
func Check(ctx context.Context, reg Registry, ref name.Reference) (*api.ContainerDiskReport, error) {
	report := &api.ContainerDiskReport{Reference: ref.String(), Verdict: api.VerdictAccepted}
	img, index, err := reg.PlatformImage(ctx, ref)
	if index != nil {
		report.Index = true
		report.IndexDigest = index.Digest
		report.Platforms = index.Platforms
	}
	if err != nil && img == nil {
		if containerdisk.AddRejection(report, err) {
			return report, nil
		}
		return nil, err
	}
	// err, if any, is a rejection of the image itself: it is described
	// first.
	rejected := err
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
	if containerdisk.AddRejection(report, rejected) {
		return report, nil
	}
	if rejected != nil {
		return nil, rejected
	}

	err = checkLayer(img, m, report)
	if containerdisk.AddRejection(report, err) {
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
	if err := containerdisk.CheckLayerCount(len(m.Layers)); err != nil {
		return err
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
	lr, err := containerdisk.OpenLayer(string(desc.MediaType), rc)
	if err != nil {
		return err
	}
	defer lr.Close()
	return lr.CheckHead(m.Annotations, report)
}
