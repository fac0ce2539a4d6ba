package registry

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// Publishing one tag for several platforms: `imagectl import --append`
// pushes the platform's image by digest, untagged, and only then rewrites
// the index at the tag with it (Client.AddToIndex). The tag thus moves
// from one complete index to the next, never to a partial image.
//
// The distribution protocol has no conditional manifest PUT (the
// distribution registry ignores If-Match), so two publishers adding
// different platforms to one tag at the same moment can lose one entry:
// both read index A, one writes A+arm64, the other A+s390x over it. The
// window is kept to about one round trip: the index is read after the
// image is pushed, checked again (HEAD) just before it is written, and
// read back after; an entry found missing then is merged again. A
// publisher that loses the race after its own read-back does not know;
// its entry can be added again with the same command, which then only
// updates the index.

// indexTries bounds how often AddToIndex merges and writes the index
// when the tag keeps changing under it.
const indexTries = 4

// errTagMoved means the tag changed between reading it and writing it.
var errTagMoved = errors.New("the tag changed while the index was being updated")

// referenceDigestAnnotation is how buildx ties an attestation manifest in
// an index to the image it is about.
const referenceDigestAnnotation = "vnd.docker.reference.digest"

// indexBase is what a tag holds, as the entries of an index.
type indexBase struct {
	digest      string // "" when the tag does not exist
	index       bool   // the tag holds an index (else one image, or nothing)
	manifests   []v1.Descriptor
	annotations map[string]string
}

// readIndexBase reads what ref holds as index entries: an index's
// entries, or one entry for an image, with the platform its config names
// (platform, when false, skips reading the config). An image whose config
// names no platform, or a manifest that is not an image's (an artifact),
// cannot be an entry and is an error.
func (c *Client) readIndexBase(ctx context.Context, ref name.Tag, platform bool) (indexBase, error) {
	ropts, err := c.remoteOptions(ctx, ref.Registry)
	if err != nil {
		return indexBase{}, err
	}
	desc, err := remote.Get(ref, ropts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return indexBase{}, nil
	}
	if err != nil {
		return indexBase{}, fmt.Errorf("fetching %s: %w", ref, err)
	}
	base := indexBase{digest: desc.Digest.String()}
	if desc.MediaType.IsIndex() {
		im, err := parseIndex(desc.Manifest)
		if re := reject.As(err); re != nil {
			// The index is too large to add to; the disk is not at fault.
			return indexBase{}, fmt.Errorf("%s: %s", ref, re.Detail)
		}
		if err != nil {
			return indexBase{}, fmt.Errorf("%s: %w", ref, err)
		}
		base.index, base.manifests, base.annotations = true, im.Manifests, im.Annotations
		return base, nil
	}
	if !desc.MediaType.IsImage() {
		return indexBase{}, fmt.Errorf("%s holds a %s, neither an image nor an image index", ref, desc.MediaType)
	}
	entry := desc.Descriptor
	if !platform {
		return base, nil
	}
	img, err := desc.Image()
	if err != nil {
		return indexBase{}, fmt.Errorf("reading %s: %w", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return indexBase{}, fmt.Errorf("reading the manifest of %s: %w", ref, err)
	}
	if !m.Config.MediaType.IsConfig() {
		return indexBase{}, fmt.Errorf("%s holds an artifact (config %s), not an image; it cannot go into an index", ref, m.Config.MediaType)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return indexBase{}, fmt.Errorf("reading the config of %s: %w", ref, err)
	}
	if cfg.OS == "" || cfg.Architecture == "" {
		return indexBase{}, fmt.Errorf("%s holds an image whose config names no platform, so it cannot be one of an index's platforms: import it again with --platform, or import without --append to replace it", ref)
	}
	entry.Platform = &v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
	entry.Annotations, entry.URLs, entry.Data = nil, nil, nil
	base.manifests = []v1.Descriptor{entry}
	return base, nil
}

// mergeIndex returns the entries of an index that holds entry for its
// platform: entries for the same platform (any number, so that an
// ambiguous index is healed) and attestations of the images they named
// are dropped, entry is added, and the entries are sorted by platform
// (stably; entries without one last), so that the same images give the
// same index whatever order they were added in.
func mergeIndex(manifests []v1.Descriptor, entry v1.Descriptor) []v1.Descriptor {
	dropped := map[string]bool{}
	out := slices.DeleteFunc(slices.Clone(manifests), func(d v1.Descriptor) bool {
		if samePlatform(d.Platform, entry.Platform) {
			dropped[d.Digest.String()] = true
			return true
		}
		return false
	})
	out = slices.DeleteFunc(out, func(d v1.Descriptor) bool { return dropped[d.Annotations[referenceDigestAnnotation]] })
	out = append(out, entry)
	slices.SortStableFunc(out, func(a, b v1.Descriptor) int {
		pa, pb := platformString(a.Platform), platformString(b.Platform)
		if (pa == "unknown") != (pb == "unknown") {
			if pa == "unknown" {
				return 1
			}
			return -1
		}
		return cmp.Compare(pa, pb)
	})
	return out
}

// AddToIndex makes the tag ref hold an OCI image index with image (a
// manifest digest in ref's repository) as its one image for p, keeping
// the index's other entries (or the image the tag held, as the entry of
// its own platform). It returns the index's digest and platforms.
func (c *Client) AddToIndex(ctx context.Context, ref name.Tag, image string, p Platform) (index string, platforms []string, err error) {
	if err := p.validate(); err != nil {
		return "", nil, err
	}
	ropts, err := c.remoteOptions(ctx, ref.Registry)
	if err != nil {
		return "", nil, err
	}
	pinned := ref.Context().Digest(image)
	desc, err := remote.Head(pinned, ropts...)
	if err != nil {
		return "", nil, fmt.Errorf("checking %s: %w", pinned, err)
	}
	entry := v1.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size,
		Platform: &v1.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}}
	for try := 1; ; try++ {
		index, platforms, err := c.writeIndex(ctx, ref, entry, ropts)
		if err == nil {
			c.opts.logger.Info("added to the index", "reference", ref.String(), "platform", p.String(), "digest", index)
			return index, platforms, nil
		}
		if !errors.Is(err, errTagMoved) {
			return "", nil, err
		}
		if try == indexTries {
			return "", nil, fmt.Errorf("adding %s to the index at %s: the tag changed %d times while it was being written (another publisher?); the image is pushed (%s), run the import again to add it: %w",
				p, ref, indexTries, pinned.DigestStr(), err)
		}
		c.opts.logger.Info("the tag changed while the index was written; merging again", "reference", ref.String(), "try", try)
	}
}

// writeIndex reads what ref holds, writes the index that adds entry to it
// and reads ref back. It returns the digest and platforms of the index
// that holds entry, or errTagMoved when the tag changed before the write
// or lost entry after it.
func (c *Client) writeIndex(ctx context.Context, ref name.Tag, entry v1.Descriptor, ropts []remote.Option) (string, []string, error) {
	base, err := c.readIndexBase(ctx, ref, true)
	if err != nil {
		return "", nil, err
	}
	merged := mergeIndex(base.manifests, entry)
	if len(merged) > MaxIndexEntries {
		return "", nil, fmt.Errorf("%s would list %d manifests; imagepipe writes indexes of at most %d", ref, len(merged), MaxIndexEntries)
	}
	body, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: merged, Annotations: base.annotations})
	if err != nil {
		return "", nil, err
	}
	if len(body) > MaxIndexSize {
		return "", nil, fmt.Errorf("%s would be an index of %d bytes; imagepipe writes indexes of at most %d", ref, len(body), MaxIndexSize)
	}
	digest := fmt.Sprintf("sha256:%x", sha256.Sum256(body))
	// The last look before the write: the tag must still be what was
	// merged.
	now, err := c.tagDigest(ref, ropts)
	if err != nil {
		return "", nil, err
	}
	if now != base.digest {
		return "", nil, errTagMoved
	}
	if err := c.putManifest(ctx, ref, body, types.OCIImageIndex); err != nil {
		return "", nil, err
	}
	// Read back: another publisher may have written over it meanwhile,
	// with or without entry.
	now, err = c.tagDigest(ref, ropts)
	if err != nil {
		return "", nil, err
	}
	if now != digest {
		after, err := c.readIndexBase(ctx, ref, false)
		if err != nil {
			return "", nil, err
		}
		if !after.index || !slices.ContainsFunc(after.manifests, func(d v1.Descriptor) bool {
			return d.Digest == entry.Digest && samePlatform(d.Platform, entry.Platform)
		}) {
			return "", nil, errTagMoved
		}
		merged, digest = after.manifests, after.digest
	}
	platforms := make([]string, len(merged))
	for i, m := range merged {
		platforms[i] = platformString(m.Platform)
	}
	return digest, platforms, nil
}

// tagDigest is the digest ref names now, "" when it does not exist.
func (c *Client) tagDigest(ref name.Tag, ropts []remote.Option) (string, error) {
	d, err := remote.Head(ref, ropts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("checking %s: %w", ref, err)
	}
	return d.Digest.String(), nil
}
