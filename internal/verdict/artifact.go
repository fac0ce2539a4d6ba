package verdict

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/registry"
)

// fetchArtifact fetches the referrer manifest d of repo and its one layer,
// which must have mediaType and be at most max bytes: the bundle of a
// verdict or a signature.
func fetchArtifact(ctx context.Context, reg Registry, repo name.Repository, d string, mediaType string, max int64) ([]byte, error) {
	raw, err := reg.FetchManifest(ctx, repo.Digest(d))
	if err != nil {
		return nil, err
	}
	return artifactLayer(ctx, reg, repo, raw, mediaType, max)
}

// artifactLayer fetches the one layer of repo's artifact manifest raw, as
// FetchManifest returns it (raw's bytes must be those of raw.Digest),
// which must have mediaType and be at most max bytes; its digest and size
// are checked against the manifest's descriptor.
func artifactLayer(ctx context.Context, reg Registry, repo name.Repository, raw *registry.RawManifest, mediaType string, max int64) ([]byte, error) {
	d := raw.Digest
	if digest.FromBytes(raw.Bytes).String() != d {
		return nil, fmt.Errorf("the manifest given as %s is another's", d)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw.Bytes, &m); err != nil {
		return nil, fmt.Errorf("reading the artifact manifest %s: %w", d, err)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != mediaType {
		return nil, fmt.Errorf("the artifact %s does not hold one %s blob", d, mediaType)
	}
	l := m.Layers[0]
	if l.Size < 0 || l.Size > max {
		return nil, fmt.Errorf("the artifact %s holds %d bytes, over the limit of %d", d, l.Size, max)
	}
	rc, err := reg.OpenBlob(ctx, repo, l.Digest.String())
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, fmt.Errorf("reading the artifact %s: %w", d, err)
	}
	if int64(len(b)) != l.Size || digest.FromBytes(b).String() != l.Digest.String() {
		return nil, fmt.Errorf("the artifact %s's blob does not match its descriptor", d)
	}
	return bytes.Clone(b), nil
}
