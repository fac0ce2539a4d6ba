package registry

import (
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// pushSmallBlob uploads a small blob (a config) with go-containerregistry,
// unless the repository already has it, and returns its descriptor.
func (c *Client) pushSmallBlob(ctx context.Context, repo name.Repository, mediaType string, b []byte) (ocispec.Descriptor, error) {
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.Digest(fmt.Sprintf("sha256:%x", sha256.Sum256(b))), Size: int64(len(b))}
	ropts, err := c.remoteOptions(ctx, repo.Registry)
	if err != nil {
		return desc, err
	}
	if err := remote.WriteLayer(repo, static.NewLayer(b, types.MediaType(mediaType)), ropts...); err != nil {
		return desc, fmt.Errorf("uploading %s: %w", desc.Digest, err)
	}
	return desc, nil
}
