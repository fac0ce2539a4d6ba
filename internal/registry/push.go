package registry

import (
	"bytes"
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Push puts m at ref (a tag, or m's own digest) and returns ref's
// repository pinned by m's digest. What is sent depends on m:
//
//   - a v1.ImageIndex: the index, every image it names and their blobs;
//   - a v1.Image: the image and its blobs. An image whose manifest names a
//     subject (an SBOM or a signature) is also listed among the subject's
//     referrers: by the registry's referrers API where it has one, else in
//     the referrers tag ("sha256-HEX") of the OCI distribution
//     specification's fallback;
//   - anything else, such as a RawManifest: the manifest bytes alone, so
//     what they name must be in the repository already. A manifest with a
//     subject also updates the subject's referrers tag on registries
//     without the referrers API.
//
// Blobs the registry already holds are not sent again, so pushing the same
// image twice costs a few HEAD requests. The digest of a pushed image or
// index is read back from the registry and must be m's; manifest bytes
// alone cost one request, the PUT.
func (c *Client) Push(ctx context.Context, ref name.Reference, m remote.Taggable) (name.Digest, error) {
	switch m := m.(type) {
	case v1.ImageIndex:
		want, err := m.Digest()
		if err != nil {
			return name.Digest{}, fmt.Errorf("computing the index digest: %w", err)
		}
		return c.push(ctx, ref, want, func(ropts []remote.Option) error {
			return remote.WriteIndex(ref, m, ropts...)
		})
	case v1.Image:
		want, err := m.Digest()
		if err != nil {
			return name.Digest{}, fmt.Errorf("computing the image digest: %w", err)
		}
		return c.push(ctx, ref, want, func(ropts []remote.Option) error {
			return remote.Write(ref, m, append(ropts, remote.WithReferrersTagFallback(true))...)
		})
	}
	b, mt, err := manifestBytes(m)
	if err != nil {
		return name.Digest{}, fmt.Errorf("pushing %s: %w", ref, err)
	}
	want, _, err := v1.SHA256(bytes.NewReader(b))
	if err != nil {
		return name.Digest{}, fmt.Errorf("computing the manifest digest: %w", err)
	}
	if d, ok := ref.(name.Digest); ok && d.DigestStr() != want.String() {
		return name.Digest{}, fmt.Errorf("pushing %s: the manifest's digest is %s", ref, want)
	}
	if err := c.putManifest(ctx, ref, b, mt); err != nil {
		return name.Digest{}, err
	}
	return ref.Context().Digest(want.String()), nil
}

// RawManifest makes a RawManifest a remote.Taggable, for Push.
func (m RawManifest) RawManifest() ([]byte, error) { return m.Bytes, nil }

// manifestBytes are the bytes and media type of a manifest Push puts as
// it is. A RawManifest whose Digest is set must hold those bytes.
func manifestBytes(m remote.Taggable) ([]byte, types.MediaType, error) {
	switch m := m.(type) {
	case *RawManifest:
		return manifestBytes(*m)
	case RawManifest:
		if m.Digest != "" {
			if want, _, err := v1.SHA256(bytes.NewReader(m.Bytes)); err != nil || want.String() != m.Digest {
				return nil, "", fmt.Errorf("the manifest's bytes are not its digest %s", m.Digest)
			}
		}
		return m.Bytes, m.MediaType, nil
	case *remote.Descriptor:
		return m.Manifest, m.MediaType, nil
	case interface {
		remote.Taggable
		MediaType() (types.MediaType, error)
	}:
		mt, err := m.MediaType()
		if err != nil {
			return nil, "", fmt.Errorf("reading the manifest's media type: %w", err)
		}
		b, err := m.RawManifest()
		if err != nil {
			return nil, "", fmt.Errorf("reading the manifest: %w", err)
		}
		return b, mt, nil
	}
	return nil, "", fmt.Errorf("a %T does not say its media type", m)
}

func (c *Client) push(ctx context.Context, ref name.Reference, want v1.Hash, write func([]remote.Option) error) (name.Digest, error) {
	if d, ok := ref.(name.Digest); ok && d.DigestStr() != want.String() {
		return name.Digest{}, fmt.Errorf("pushing %s: the manifest's digest is %s", ref, want)
	}
	ropts, err := c.remoteOptions(ctx, ref.Context().Registry)
	if err != nil {
		return name.Digest{}, err
	}
	if err := write(ropts); err != nil {
		return name.Digest{}, fmt.Errorf("pushing %s: %w", ref, err)
	}
	got, err := remote.Head(ref, ropts...)
	if err != nil {
		return name.Digest{}, fmt.Errorf("checking %s: %w", ref, err)
	}
	if got.Digest != want {
		return name.Digest{}, fmt.Errorf("%s holds %s after the push, not %s", ref, got.Digest, want)
	}
	pinned := ref.Context().Digest(want.String())
	c.opts.logger.Info("pushed", "ref", ref.String(), "digest", want.String())
	return pinned, nil
}

// rawManifest lets go-containerregistry put manifest bytes as they are.
type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.b, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// putManifest puts manifest, of media type mt, at ref: a tag, or a digest
// (then the manifest's own).
func (c *Client) putManifest(ctx context.Context, ref name.Reference, manifest []byte, mt types.MediaType) error {
	ropts, err := c.remoteOptions(ctx, ref.Context().Registry)
	if err != nil {
		return err
	}
	if err := remote.Put(ref, rawManifest{manifest, mt}, ropts...); err != nil {
		return fmt.Errorf("pushing the manifest to %s: %w", ref, err)
	}
	return nil
}
