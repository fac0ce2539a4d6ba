package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/retry"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// maxTemplateManifest bounds a template's manifest, read before its layer.
const maxTemplateManifest = 64 << 10

// ErrTemplateNotFound is returned (wrapped) for a template ID the catalog
// does not hold.
var ErrTemplateNotFound = errors.New("template not found")

// Template is one template in a catalog: its ID (the tag), the digest of
// its manifest, and the document.
type Template struct {
	ID     string
	Digest string
	Doc    []byte
}

// catalog opens a template catalog repository with oras-go, authenticated
// and over TLS as the rest of the client.
func (c *Client) catalog(ctx context.Context, repo name.Repository) (*remote.Repository, error) {
	r, err := remote.NewRepository(repo.Name())
	if err != nil {
		return nil, fmt.Errorf("catalog %s: %w", repo, err)
	}
	scheme, err := c.scheme(ctx, repo.Registry)
	if err != nil {
		return nil, err
	}
	r.PlainHTTP = scheme == "http"
	authr, err := c.authenticator(repo.Registry)
	if err != nil {
		return nil, err
	}
	cfg, err := authr.Authorization()
	if err != nil {
		return nil, fmt.Errorf("reading credentials for %s: %w", repo.Registry, err)
	}
	cred := auth.Credential{Username: cfg.Username, Password: cfg.Password, RefreshToken: cfg.IdentityToken, AccessToken: cfg.RegistryToken}
	r.Client = &auth.Client{
		Client:     &http.Client{Transport: retry.NewTransport(c.base)},
		Header:     http.Header{"User-Agent": {c.opts.userAgent}},
		Cache:      auth.NewCache(),
		Credential: auth.StaticCredential(repo.RegistryStr(), cred),
	}
	r.ManifestMediaTypes = []string{ocispec.MediaTypeImageManifest}
	return r, nil
}

// PublishTemplate stores doc (a validated template as JSON) in repo under
// the tag id, as an OCI artifact of type api.TemplateArtifactType. When
// the tag already holds the same document nothing is pushed and unchanged
// is true.
func (c *Client) PublishTemplate(ctx context.Context, repo name.Repository, id string, doc []byte) (dgst string, unchanged bool, err error) {
	if err := checkTemplateID(repo, id); err != nil {
		return "", false, err
	}
	r, err := c.catalog(ctx, repo)
	if err != nil {
		return "", false, err
	}
	layer := content.NewDescriptorFromBytes(api.TemplateMediaType, doc)
	layer.Annotations = map[string]string{ocispec.AnnotationTitle: id + ".json"}
	if cur, err := c.fetchTemplate(ctx, r, id); err == nil {
		if bytes.Equal(cur.Doc, doc) {
			return cur.Digest, true, nil
		}
	} else if !errors.Is(err, ErrTemplateNotFound) {
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

// FetchTemplate reads the template id from repo.
func (c *Client) FetchTemplate(ctx context.Context, repo name.Repository, id string) (*Template, error) {
	if err := checkTemplateID(repo, id); err != nil {
		return nil, err
	}
	r, err := c.catalog(ctx, repo)
	if err != nil {
		return nil, err
	}
	return c.fetchTemplate(ctx, r, id)
}

// maxCatalogTags bounds the tags read from a catalog repository.
const maxCatalogTags = 10000

// ListTemplates reads every template in repo, in tag order. Tags that are
// not templates, and tags listed whose manifest is gone (deleted since the
// listing), are skipped.
func (c *Client) ListTemplates(ctx context.Context, repo name.Repository) ([]Template, error) {
	r, err := c.catalog(ctx, repo)
	if err != nil {
		return nil, err
	}
	tags, err := catalogTags(ctx, r, repo)
	if err != nil {
		return nil, err
	}
	var out []Template
	for _, tag := range tags {
		t, err := c.fetchTemplate(ctx, r, tag)
		if errors.Is(err, errNotATemplate) || errors.Is(err, ErrTemplateNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *t)
	}
	return out, nil
}

// TemplateIDs returns the tags of repo, which name its templates, in one
// listing and without reading any template: for shell completion, where
// ListTemplates would read every one.
func (c *Client) TemplateIDs(ctx context.Context, repo name.Repository) ([]string, error) {
	r, err := c.catalog(ctx, repo)
	if err != nil {
		return nil, err
	}
	return catalogTags(ctx, r, repo)
}

// catalogTags lists the tags of a catalog repository; a repository that
// does not exist yet has none.
func catalogTags(ctx context.Context, r *remote.Repository, repo name.Repository) ([]string, error) {
	var tags []string
	err := r.Tags(ctx, "", func(page []string) error {
		tags = append(tags, page...)
		if len(tags) > maxCatalogTags {
			return fmt.Errorf("more than %d tags", maxCatalogTags)
		}
		return nil
	})
	if errors.Is(err, errdef.ErrNotFound) {
		return nil, nil // no catalog yet
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates in %s: %w", repo, err)
	}
	return tags, nil
}

// DeleteTemplate removes the template id from repo and returns the digest
// of the manifest deleted. It refuses an ID the catalog does not hold
// (ErrTemplateNotFound) or whose tag is not a template, and, as Delete
// does for images, a manifest other tags also name (*SharedImageError):
// registries delete manifests by digest, which would remove those tags
// too. After the deletion it checks that the tag no longer resolves, so
// that the catalog's tag list never names a template that is gone.
func (c *Client) DeleteTemplate(ctx context.Context, repo name.Repository, id string) (string, error) {
	if err := checkTemplateID(repo, id); err != nil {
		return "", err
	}
	r, err := c.catalog(ctx, repo)
	if err != nil {
		return "", err
	}
	t, err := c.fetchTemplate(ctx, r, id)
	if errors.Is(err, errNotATemplate) {
		return "", fmt.Errorf("%s:%s is not a template (artifact type %s); imagectl template delete deletes only templates", repo, id, api.TemplateArtifactType)
	}
	if err != nil {
		return "", err
	}
	deleted, err := c.Delete(ctx, repo.Tag(id), DeleteOptions{})
	if err != nil {
		return "", err
	}
	if deleted.Digest.DigestStr() != t.Digest {
		// Published again between the read and the deletion: what was
		// deleted is the newer document, which is gone all the same.
		c.opts.logger.Info("template changed while deleting", "id", id, "read", t.Digest, "deleted", deleted.Digest.DigestStr())
	}
	dgst, found, err := c.Resolve(ctx, repo.Tag(id))
	if err != nil {
		return "", fmt.Errorf("checking that template %s is gone: %w", id, err)
	}
	if found {
		return "", fmt.Errorf("deleted manifest %s, but the registry still resolves %s:%s (to %s); it may keep tags of deleted manifests, or the template was published again meanwhile", deleted.Digest.DigestStr(), repo, id, dgst)
	}
	return deleted.Digest.DigestStr(), nil
}

// checkTemplateID checks that id is a tag (the OCI grammar's), so that it
// never resolves as a digest or reaches the registry malformed.
func checkTemplateID(repo name.Repository, id string) error {
	if !tagPattern.MatchString(id) {
		return &ReferenceError{Input: repo.Name() + ":" + id, Part: "tag",
			Rule: fmt.Sprintf("template ID %q is not a tag: letters, digits, '_', '.' and '-' starting with a letter, digit or '_', at most 128", id)}
	}
	return nil
}

var errNotATemplate = errors.New("not a template artifact")

// fetchTemplate resolves id and reads its document, checking sizes and
// digests before use.
func (c *Client) fetchTemplate(ctx context.Context, r *remote.Repository, id string) (*Template, error) {
	desc, rc, err := r.FetchReference(ctx, id)
	if errors.Is(err, errdef.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s in %s", ErrTemplateNotFound, id, r.Reference)
	}
	if err != nil {
		return nil, fmt.Errorf("fetching template %s: %w", id, err)
	}
	defer rc.Close()
	if desc.Size > maxTemplateManifest {
		return nil, fmt.Errorf("template %s: manifest of %d bytes, over %d", id, desc.Size, maxTemplateManifest)
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
	return &Template{ID: id, Digest: desc.Digest.String(), Doc: doc}, nil
}
