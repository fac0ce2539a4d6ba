package publish

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/registry"
)

// Registry is what writing an image needs of a registry;
// *registry.Client implements it.
type Registry interface {
	Upload(ctx context.Context, repo name.Repository, b registry.Blob) (registry.Uploaded, error)
	Push(ctx context.Context, ref name.Reference, m remote.Taggable) (name.Digest, error)
}

var _ Registry = (*registry.Client)(nil)

// Layer writes disk's layer into repo and returns it. Nothing is kept for
// a later run: a failed push starts over.
func Layer(ctx context.Context, reg Registry, repo name.Repository, disk Disk) (containerdisk.LayerInfo, error) {
	var layer containerdisk.LayerInfo
	_, err := reg.Upload(ctx, repo, registry.Blob{
		Write: func(ctx context.Context, w io.Writer) (string, map[string]string, error) {
			var err error
			layer, err = disk.WriteLayer(ctx, w, nil)
			return layer.Digest, nil, err
		},
		Discard: func(error) bool { return true },
	})
	return layer, err
}

// Image writes img, whose layer the repository of where holds already:
// its config, unless the repository has it, and then its manifest at
// where (a tag, or the manifest's own digest), which makes the image
// appear whole.
func Image(ctx context.Context, reg Registry, where name.Reference, img *containerdisk.Image) error {
	repo := where.Context()
	_, err := reg.Upload(ctx, repo, registry.Blob{
		Digest: img.ConfigDesc.Digest.String(),
		Write: func(ctx context.Context, w io.Writer) (string, map[string]string, error) {
			_, err := io.Copy(w, bytes.NewReader(img.Config))
			return img.ConfigDesc.Digest.String(), nil, err
		},
		Discard: func(error) bool { return true }, // a few hundred bytes: sent again, never resumed
	})
	if err != nil {
		return fmt.Errorf("pushing the config of %s: %w", where, err)
	}
	_, err = reg.Push(ctx, where, registry.RawManifest{Digest: img.Digest, MediaType: types.OCIManifestSchema1, Bytes: img.Manifest})
	return err
}
