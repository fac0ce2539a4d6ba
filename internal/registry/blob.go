package registry

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// pushSmallBlob uploads a small blob (a config) in one request, unless the
// repository already has it, and returns its descriptor.
func (c *Client) pushSmallBlob(ctx context.Context, repo name.Repository, mediaType string, b []byte) (ocispec.Descriptor, error) {
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.Digest(fmt.Sprintf("sha256:%x", sha256.Sum256(b))), Size: int64(len(b))}
	u, err := c.startUpload(ctx, repo, nil)
	if err != nil {
		return desc, err
	}
	if ok, err := c.blobExists(ctx, u.client, u.base, repo, desc.Digest.String()); err == nil && ok {
		u.cancel(ctx)
		return desc, nil
	}
	loc := *u.location
	q := loc.Query()
	q.Set("digest", desc.Digest.String())
	loc.RawQuery = q.Encode()
	resp, err := u.do(ctx, http.MethodPut, loc.String(), http.Header{"Content-Type": {"application/octet-stream"}}, b)
	if err != nil {
		return desc, fmt.Errorf("uploading %s: %w", desc.Digest, err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusCreated); err != nil {
		return desc, fmt.Errorf("uploading %s: %w", desc.Digest, err)
	}
	return desc, nil
}
