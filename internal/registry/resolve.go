package registry

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// Limits on the image indexes imagepipe reads and writes. An index names
// one image per platform; a containerDisk index holds a handful (KubeVirt
// builds for three architectures), and a buildx index about twice as many
// with its attestations. go-containerregistry reads at most 100 MiB of a
// manifest; past these limits the index is refused before anything it
// names is fetched.
const (
	// MaxIndexSize is the most bytes of an index document: 4 MiB, the
	// manifest limit of the distribution registry and of most others.
	MaxIndexSize = 4 << 20
	// MaxIndexEntries is the most manifests one index may list.
	MaxIndexEntries = 64
)

// IndexInfo describes the image index a reference named.
type IndexInfo struct {
	// Digest is the index's digest ("sha256:...").
	Digest string
	// Platforms are its entries' platforms in index order, "unknown" for
	// an entry without one.
	Platforms []string
}

// resolved is the image a reference names for a platform.
type resolved struct {
	desc  *remote.Descriptor // the image manifest's
	image v1.Image
	// index is set when the reference named an index, also when no image
	// could be picked from it.
	index *IndexInfo
}

// resolve fetches the image at ref. An image index resolves to its one
// image for want (a want without a variant matches every variant): none,
// several, or one whose config names another platform than the index
// entry are PlatformMismatch rejections, as is an index past the limits.
// With strict, an image that is not in an index must be for want too (a
// config naming no platform passes); otherwise it is taken as it is.
// why ends a mismatch's message: who asked for want.
//
// On a rejection, the result still says what is known: the index, and
// the image when the rejection is about the image itself.
func (c *Client) resolve(ctx context.Context, ref name.Reference, want Platform, strict bool, why string) (*resolved, error) {
	ropts, err := c.remoteOptions(ctx, ref.Context().Registry)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", ref, err)
	}
	if !desc.MediaType.IsIndex() {
		img, err := desc.Image()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", ref, err)
		}
		if strict {
			cfg, err := img.ConfigFile()
			if err != nil {
				return nil, fmt.Errorf("reading the config of %s: %w", ref, err)
			}
			if !want.acceptsConfig(cfg) {
				return &resolved{desc: desc, image: img}, reject.New(reject.PlatformMismatch, "the image is built for %s; %s", configPlatform(cfg), why)
			}
		}
		return &resolved{desc: desc, image: img}, nil
	}
	im, err := parseIndex(desc.Manifest)
	res := &resolved{index: &IndexInfo{Digest: desc.Digest.String()}}
	if err != nil {
		return res, err
	}
	var matches, others []v1.Descriptor
	for _, m := range im.Manifests {
		res.index.Platforms = append(res.index.Platforms, platformString(m.Platform))
		switch {
		case !want.matches(m.Platform):
		case m.MediaType.IsImage():
			matches = append(matches, m)
		default:
			others = append(others, m)
		}
	}
	switch len(matches) {
	case 0:
		if len(others) > 0 {
			// A nested index, an artifact: nothing imagepipe or CDI pulls.
			return res, reject.New(reject.PlatformMismatch, "the image index's %s entry %s is a %s, not an image", platformString(others[0].Platform), others[0].Digest, others[0].MediaType)
		}
		return res, reject.New(reject.PlatformMismatch, "the image index holds no %s image (it holds: %s)", want, orNone(res.index.Platforms))
	case 1:
	default:
		// Which one a puller picks is up to it: the one checked here might
		// not be the one imported.
		digests := make([]string, len(matches))
		for i, m := range matches {
			digests[i] = m.Digest.String()
		}
		return res, reject.New(reject.PlatformMismatch, "the image index holds %d %s images; it must hold one (%s)", len(matches), want, strings.Join(digests, ", "))
	}
	entry := matches[0]
	child, err := remote.Get(ref.Context().Digest(entry.Digest.String()), ropts...)
	if err != nil {
		return res, fmt.Errorf("fetching %s's %s image %s: %w", ref, platformString(entry.Platform), entry.Digest, err)
	}
	if !child.MediaType.IsImage() {
		return res, reject.New(reject.PlatformMismatch, "the image index lists %s as a %s image, but it is a %s", entry.Digest, platformString(entry.Platform), child.MediaType)
	}
	img, err := child.Image()
	if err != nil {
		return res, fmt.Errorf("reading %s: %w", entry.Digest, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return res, fmt.Errorf("reading the config of %s: %w", entry.Digest, err)
	}
	res.desc, res.image = child, img
	if !agrees(entry.Platform, cfg) {
		return res, reject.New(reject.PlatformMismatch, "the image index lists %s as %s, but its config says %s", entry.Digest, platformString(entry.Platform), configPlatform(cfg))
	}
	return res, nil
}

// parseIndex reads an index document within the limits.
func parseIndex(b []byte) (*v1.IndexManifest, error) {
	if len(b) > MaxIndexSize {
		return nil, reject.New(reject.PlatformMismatch, "the image index is %d bytes; imagepipe reads indexes of at most %d", len(b), MaxIndexSize)
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("reading the image index: %w", err)
	}
	if len(im.Manifests) > MaxIndexEntries {
		return nil, reject.New(reject.PlatformMismatch, "the image index lists %d manifests; imagepipe reads indexes of at most %d", len(im.Manifests), MaxIndexEntries)
	}
	return im, nil
}

// acceptsConfig reports whether an image whose config is cfg is for p:
// every platform field the config sets is p's, the variant only when p
// names one.
func (p Platform) acceptsConfig(cfg *v1.ConfigFile) bool {
	if cfg.OS != "" && cfg.OS != p.OS {
		return false
	}
	if cfg.Architecture != "" && cfg.Architecture != p.Architecture {
		return false
	}
	return p.Variant == "" || cfg.Variant == "" || normalVariant(p.Architecture, p.Variant) == normalVariant(cfg.Architecture, cfg.Variant)
}

// configPlatform is the platform an image config names, "-" for parts it
// leaves out.
func configPlatform(cfg *v1.ConfigFile) string {
	p := Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
	if p.OS == "" {
		p.OS = "-"
	}
	if p.Architecture == "" {
		p.Architecture = "-"
	}
	return p.String()
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}

// PlatformImage fetches the image ref names for the client's platform: an
// image index resolves to its one image for WithPlatform's or
// WithArchitecture's platform, else linux/amd64; an image outside an
// index is checked only against a platform the client was given. A
// mismatch is a *reject.Error (PlatformMismatch) that still comes with
// what is known: the index, when ref named one, and the image, when the
// rejection is about the image itself.
func (c *Client) PlatformImage(ctx context.Context, ref name.Reference) (v1.Image, *IndexInfo, error) {
	want, strict, why := DefaultPlatform, false, ""
	if c.opts.platform != nil {
		want, strict, why = *c.opts.platform, true, c.opts.platformWhy
	}
	res, err := c.resolve(ctx, ref, want, strict, why)
	if res == nil {
		return nil, nil, err
	}
	return res.image, res.index, err
}
