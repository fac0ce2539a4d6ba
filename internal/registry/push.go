package registry

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PushIndex pushes idx, every image it names and their blobs to ref (a
// tag, or the index's own digest), and returns ref's repository pinned by
// the index's digest. Blobs the registry already holds are not sent again,
// so pushing the same index twice costs a few HEAD requests. The digest is
// read back from the registry and must be the index's.
func (c *Client) PushIndex(ctx context.Context, ref name.Reference, idx v1.ImageIndex) (name.Digest, error) {
	want, err := idx.Digest()
	if err != nil {
		return name.Digest{}, fmt.Errorf("computing the index digest: %w", err)
	}
	return c.push(ctx, ref, want, func(ropts []remote.Option) error {
		return remote.WriteIndex(ref, idx, ropts...)
	})
}

// PushImage pushes img and its blobs to ref as PushIndex pushes an index.
// An image whose manifest names a subject (an SBOM or a signature) is
// also listed among the subject's referrers: by the registry's referrers
// API where it has one, else in the referrers tag ("sha256-HEX") of the
// OCI distribution specification's fallback.
func (c *Client) PushImage(ctx context.Context, ref name.Reference, img v1.Image) (name.Digest, error) {
	want, err := img.Digest()
	if err != nil {
		return name.Digest{}, fmt.Errorf("computing the image digest: %w", err)
	}
	return c.push(ctx, ref, want, func(ropts []remote.Option) error {
		return remote.Write(ref, img, append(ropts, remote.WithReferrersTagFallback(true))...)
	})
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
