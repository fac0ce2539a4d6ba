package registry

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/reject"
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
	report := &api.ContainerDiskReport{Reference: ref.String(), Verdict: api.VerdictAccepted}
	img, err := c.platformImage(ctx, ref, report)
	if containerdisk.AddRejection(report, err) {
		return report, nil
	}
	if err != nil {
		return nil, err
	}
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
	if c.opts.arch != "" && cfg.Architecture != "" && cfg.Architecture != c.opts.arch {
		containerdisk.AddRejection(report, reject.New(reject.PlatformMismatch, "the image is built for %s; this hub runs %s", report.Platform, c.opts.arch))
		return report, nil
	}
	report.Env = cfg.Config.Env
	if len(m.Layers) > 0 {
		l := m.Layers[0]
		report.LayerMediaType, report.LayerSize, report.LayerDigest = string(l.MediaType), l.Size, l.Digest.String()
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

// platformImage fetches the image at ref; an image index resolves to its
// image for the client's architecture (linux/amd64 by default), and one
// without such an image is a PlatformMismatch rejection.
func (c *Client) platformImage(ctx context.Context, ref name.Reference, report *api.ContainerDiskReport) (v1.Image, error) {
	ropts, err := c.remoteOptions(ctx, ref.Context().Registry)
	if err != nil {
		return nil, err
	}
	arch := cmp.Or(c.opts.arch, "amd64")
	ropts = append(ropts, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: arch}))
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", ref, err)
	}
	if !desc.MediaType.IsIndex() {
		return desc.Image()
	}
	report.Index = true
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("reading the index %s: %w", ref, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading the index %s: %w", ref, err)
	}
	var have []string
	matches := 0
	for _, m := range im.Manifests {
		if p := m.Platform; p != nil {
			if p.OS == "linux" && p.Architecture == arch {
				matches++
			}
			have = append(have, p.String())
		}
	}
	switch {
	case matches == 0:
		return nil, reject.New(reject.PlatformMismatch, "the image index holds no linux/%s image (it holds: %s)", arch, strings.Join(have, ", "))
	case matches > 1:
		// Which one an importer picks is up to it: the one checked here
		// might not be the one imported.
		return nil, reject.New(reject.PlatformMismatch, "the image index holds %d linux/%s images; it must hold one", matches, arch)
	}
	return desc.Image()
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
