// Package catalog keeps a provider's VM templates in a registry
// repository, the template catalog: each template is an OCI artifact of
// type api.TemplateArtifactType whose one layer is the template document
// (JSON), tagged with the template's ID.
//
// Every read is bounded before use: a manifest of at most 64 KiB, one
// layer of at most api.MaxTemplateSize, both checked against their digests,
// and at most 10,000 tags in a listing. Tags that hold something else than
// a template are skipped by List and refused by Fetch and Delete.
// Deleting a template never deletes a manifest another tag also names.
package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

const (
	// maxManifest bounds a template's manifest, read before its layer.
	maxManifest = 64 << 10
	// maxTags bounds the tags read from a catalog repository.
	maxTags = 10000
)

// ErrNotFound is returned (wrapped) for a template ID the catalog does not
// hold.
var ErrNotFound = errors.New("template not found")

// errNotATemplate is returned (wrapped) for a tag that holds another
// artifact.
var errNotATemplate = errors.New("not a template artifact")

// Entry is one template in a catalog: its ID (the tag), the digest of its
// manifest, and the document.
type Entry struct {
	ID     string
	Digest string
	Doc    []byte
}

// Catalog is the template catalog in one repository.
type Catalog struct {
	client *registry.Client
	repo   name.Repository
}

// Open returns the catalog in repo, reached through client. It makes no
// request.
func Open(client *registry.Client, repo name.Repository) *Catalog {
	return &Catalog{client: client, repo: repo}
}

// String is the catalog's repository, REGISTRY/REPO.
func (c *Catalog) String() string { return c.repo.String() }

// Ref is a template's entry as REGISTRY/REPO:ID.
func (c *Catalog) Ref(id string) string { return c.repo.Tag(id).String() }

// open opens the catalog's repository with oras-go.
func (c *Catalog) open(ctx context.Context) (*remote.Repository, error) {
	r, err := c.client.ORASRepository(ctx, c.repo)
	if err != nil {
		return nil, err
	}
	r.ManifestMediaTypes = []string{ocispec.MediaTypeImageManifest}
	return r, nil
}

// Publish stores doc (a validated template as JSON) under the tag id. When
// the tag already holds the same document nothing is pushed and unchanged
// is true.
func (c *Catalog) Publish(ctx context.Context, id string, doc []byte) (dgst string, unchanged bool, err error) {
	if err := c.checkID(id); err != nil {
		return "", false, err
	}
	r, err := c.open(ctx)
	if err != nil {
		return "", false, err
	}
	layer := content.NewDescriptorFromBytes(api.TemplateMediaType, doc)
	layer.Annotations = map[string]string{ocispec.AnnotationTitle: id + ".json"}
	if cur, err := fetch(ctx, r, id); err == nil {
		if bytes.Equal(cur.Doc, doc) {
			return cur.Digest, true, nil
		}
	} else if !errors.Is(err, ErrNotFound) {
		return "", false, err
	}
	if err := pushIfMissing(ctx, r, layer, doc); err != nil {
		return "", false, fmt.Errorf("pushing template %s: %w", id, err)
	}
	desc, err := oras.PackManifest(ctx, r, oras.PackManifestVersion1_1, api.TemplateArtifactType, oras.PackManifestOptions{
		Layers:              []ocispec.Descriptor{layer},
		ManifestAnnotations: map[string]string{"io.imagepipe.template.id": id},
	})
	if err != nil {
		return "", false, fmt.Errorf("pushing the manifest of template %s: %w", id, err)
	}
	if err := r.Tag(ctx, desc, id); err != nil {
		return "", false, fmt.Errorf("tagging template %s: %w", id, err)
	}
	return desc.Digest.String(), false, nil
}

func pushIfMissing(ctx context.Context, r *remote.Repository, desc ocispec.Descriptor, data []byte) error {
	ok, err := r.Exists(ctx, desc)
	if err != nil || ok {
		return err
	}
	err = r.Push(ctx, desc, bytes.NewReader(data))
	if errors.Is(err, errdef.ErrAlreadyExists) {
		return nil
	}
	return err
}

// Fetch reads the template id.
func (c *Catalog) Fetch(ctx context.Context, id string) (*Entry, error) {
	if err := c.checkID(id); err != nil {
		return nil, err
	}
	r, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	return fetch(ctx, r, id)
}

// List reads every template, in tag order. Tags that are not templates,
// and tags listed whose manifest is gone (deleted since the listing), are
// skipped.
func (c *Catalog) List(ctx context.Context) ([]Entry, error) {
	r, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	tags, err := c.tags(ctx, r)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, tag := range tags {
		t, err := fetch(ctx, r, tag)
		if errors.Is(err, errNotATemplate) || errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *t)
	}
	return out, nil
}

// IDs returns the tags of the catalog, which name its templates, in one
// listing and without reading any template: for shell completion, where
// List would read every one.
func (c *Catalog) IDs(ctx context.Context) ([]string, error) {
	r, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	return c.tags(ctx, r)
}

// tags lists the tags of the catalog's repository; a repository that does
// not exist yet has none.
func (c *Catalog) tags(ctx context.Context, r *remote.Repository) ([]string, error) {
	var tags []string
	err := r.Tags(ctx, "", func(page []string) error {
		tags = append(tags, page...)
		if len(tags) > maxTags {
			return fmt.Errorf("more than %d tags", maxTags)
		}
		return nil
	})
	if errors.Is(err, errdef.ErrNotFound) {
		return nil, nil // no catalog yet
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates in %s: %w", c.repo, err)
	}
	return tags, nil
}

// Delete removes the template id and returns the digest of the manifest
// deleted. It refuses an ID the catalog does not hold (ErrNotFound) or
// whose tag is not a template, and, as registry.Client.Delete does for
// images, a manifest other tags also name (*registry.SharedImageError):
// registries delete manifests by digest, which would remove those tags
// too. After the deletion it checks that the tag no longer resolves, so
// that the catalog's tag list never names a template that is gone. A
// template published again between the read and the deletion is deleted
// all the same: the digest returned is the one deleted.
func (c *Catalog) Delete(ctx context.Context, id string) (string, error) {
	if err := c.checkID(id); err != nil {
		return "", err
	}
	r, err := c.open(ctx)
	if err != nil {
		return "", err
	}
	if _, err := fetch(ctx, r, id); errors.Is(err, errNotATemplate) {
		return "", fmt.Errorf("%s is not a template (artifact type %s); imagectl template delete deletes only templates", c.Ref(id), api.TemplateArtifactType)
	} else if err != nil {
		return "", err
	}
	deleted, err := c.client.Delete(ctx, c.repo.Tag(id), registry.DeleteOptions{})
	if err != nil {
		return "", err
	}
	dgst, found, err := c.client.Resolve(ctx, c.repo.Tag(id))
	if err != nil {
		return "", fmt.Errorf("checking that template %s is gone: %w", id, err)
	}
	if found {
		return "", fmt.Errorf("deleted manifest %s, but the registry still resolves %s (to %s); it may keep tags of deleted manifests, or the template was published again meanwhile", deleted.Digest.DigestStr(), c.Ref(id), dgst)
	}
	return deleted.Digest.DigestStr(), nil
}

// checkID checks that id is a tag, so that it never resolves as a digest
// or reaches the registry malformed.
func (c *Catalog) checkID(id string) error {
	if imageref.CheckTag(id) != nil {
		return &imageref.Error{Input: c.repo.Name() + ":" + id, Part: "tag",
			Rule: fmt.Sprintf("template ID %q is not a tag: letters, digits, '_', '.' and '-' starting with a letter, digit or '_', at most 128", id)}
	}
	return nil
}

// fetch resolves id and reads its document, checking sizes and digests
// before use.
func fetch(ctx context.Context, r *remote.Repository, id string) (*Entry, error) {
	desc, rc, err := r.FetchReference(ctx, id)
	if errors.Is(err, errdef.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s in %s", ErrNotFound, id, r.Reference)
	}
	if err != nil {
		return nil, fmt.Errorf("fetching template %s: %w", id, err)
	}
	defer rc.Close()
	if desc.Size > maxManifest {
		return nil, fmt.Errorf("template %s: manifest of %d bytes, over %d", id, desc.Size, maxManifest)
	}
	raw, err := content.ReadAll(rc, desc)
	if err != nil {
		return nil, fmt.Errorf("reading template %s: %w", id, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("template %s: manifest: %w", id, err)
	}
	if m.ArtifactType != api.TemplateArtifactType || len(m.Layers) != 1 || m.Layers[0].MediaType != api.TemplateMediaType {
		return nil, fmt.Errorf("%w: %s", errNotATemplate, id)
	}
	layer := m.Layers[0]
	if layer.Size > api.MaxTemplateSize || layer.Size < 0 {
		return nil, fmt.Errorf("template %s: %d bytes, over the limit of %d", id, layer.Size, api.MaxTemplateSize)
	}
	if err := layer.Digest.Validate(); err != nil || layer.Digest.Algorithm() != digest.SHA256 {
		return nil, fmt.Errorf("template %s: invalid layer digest %q", id, layer.Digest)
	}
	lrc, err := r.Fetch(ctx, layer)
	if err != nil {
		return nil, fmt.Errorf("fetching template %s: %w", id, err)
	}
	defer lrc.Close()
	doc, err := content.ReadAll(io.LimitReader(lrc, api.MaxTemplateSize+1), layer)
	if err != nil {
		return nil, fmt.Errorf("reading template %s: %w", id, err)
	}
	return &Entry{ID: id, Digest: desc.Digest.String(), Doc: doc}, nil
}
