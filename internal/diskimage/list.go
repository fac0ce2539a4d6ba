package diskimage

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/errgroup"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
)

const (
	// listConcurrency is how many registry requests List has in flight at
	// once.
	listConcurrency = 8
	// maxConfigSize bounds a config read for a listing: imagectl's are
	// under 2 KiB, and a registry accepts manifests up to 4 MiB.
	maxConfigSize = 4 << 20
)

// Lister is what listing needs of a registry; *registry.Client
// implements it.
type Lister interface {
	Repositories(ctx context.Context, reg name.Registry) ([]string, error)
	ListTags(ctx context.Context, repo name.Repository, etag string) (tags []string, newETag string, notModified bool, err error)
	FetchManifest(ctx context.Context, ref name.Reference) (*registry.RawManifest, error)
	OpenBlob(ctx context.Context, repo name.Repository, digest string) (io.ReadCloser, error)
}

var _ Lister = (*registry.Client)(nil)

// List returns every tag of every repository of tenant on reg, sorted by
// repository and tag, without the build-key tags. The catalog and the tag
// lists are read page by page; each tag's manifest and config are fetched
// with up to 8 requests at a time. Images imagepipe did not build are
// listed with the annotation fields empty.
func List(ctx context.Context, reg Lister, on name.Registry, tenant string) ([]api.ImageListing, error) {
	catalog, err := reg.Repositories(ctx, on)
	if err != nil {
		return nil, &CatalogError{Registry: on.String(), Tenant: tenant, Err: err}
	}
	var repos []name.Repository
	for _, r := range catalog {
		if strings.HasPrefix(r, tenant+"/") {
			repos = append(repos, on.Repo(r))
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	tags := make([][]string, len(repos))
	for i, repo := range repos {
		g.Go(func() error {
			var err error
			tags[i], _, _, err = reg.ListTags(gctx, repo, "")
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return describeAll(ctx, reg, repos, tags)
}

// ListRepository returns every tag of repo, sorted, without the build-key
// tags, described like List's. It needs no catalog API, which registries
// such as Harbor and GHCR restrict.
func ListRepository(ctx context.Context, reg Lister, repo name.Repository) ([]api.ImageListing, error) {
	tags, _, _, err := reg.ListTags(ctx, repo, "")
	if err != nil {
		return nil, err
	}
	return describeAll(ctx, reg, []name.Repository{repo}, [][]string{tags})
}

// CatalogError is List's failure to read the registry's catalog, which
// many registries restrict; listing one repository needs no catalog.
type CatalogError struct {
	Registry, Tenant string
	Err              error
}

func (e *CatalogError) Error() string {
	return fmt.Sprintf("listing the repositories of %s: %v", e.Registry, e.Err)
}

func (e *CatalogError) Unwrap() error { return e.Err }

// describeAll describes tags[i] of each repos[i], with up to
// listConcurrency requests at a time, sorted by repository and tag.
func describeAll(ctx context.Context, reg Lister, repos []name.Repository, tags [][]string) ([]api.ImageListing, error) {
	var listings []api.ImageListing
	var refs []name.Tag
	for i, repo := range repos {
		for _, tag := range tags[i] {
			listings = append(listings, api.ImageListing{Repository: repo.Name(), Tag: tag})
			refs = append(refs, repo.Tag(tag))
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	for i := range listings {
		g.Go(func() error { return describe(gctx, reg, &listings[i], refs[i]) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	slices.SortFunc(listings, func(a, b api.ImageListing) int {
		return cmp.Or(strings.Compare(a.Repository, b.Repository), strings.Compare(a.Tag, b.Tag))
	})
	return listings, nil
}

// describe fills l from its tag's manifest annotations, falling back to
// the config's labels and creation time.
func describe(ctx context.Context, reg Lister, l *api.ImageListing, ref name.Tag) error {
	raw, err := reg.FetchManifest(ctx, ref)
	if err != nil {
		return err
	}
	l.Digest = raw.Digest
	if !raw.MediaType.IsImage() {
		return nil // an index, or something that is no image at all
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw.Bytes))
	if err != nil {
		return fmt.Errorf("parsing the manifest of %s: %w", ref, err)
	}
	cfg, err := readConfig(ctx, reg, ref.Context(), m.Config)
	if err != nil {
		return fmt.Errorf("reading the config of %s: %w", ref, err)
	}
	get := func(key string) string {
		if v, ok := m.Annotations[key]; ok {
			return v
		}
		return cfg.Config.Labels[key]
	}
	l.DiskFormat = get(api.AnnotationDiskFormat)
	l.SourceDigest = get(api.AnnotationSourceDigest)
	l.Created = get(api.AnnotationCreated)
	if l.Created == "" && !cfg.Created.IsZero() {
		l.Created = cfg.Created.UTC().Format(time.RFC3339)
	}
	if s := get(api.AnnotationVirtualSize); s != "" {
		l.VirtualSize, _ = strconv.ParseInt(s, 10, 64) // not a number: not shown
	}
	return nil
}

// readConfig reads the config desc names, at most maxConfigSize bytes;
// OpenBlob checks its digest as it is read to its end.
func readConfig(ctx context.Context, reg Lister, repo name.Repository, desc v1.Descriptor) (*v1.ConfigFile, error) {
	if desc.Size > maxConfigSize {
		return nil, fmt.Errorf("the config is %d bytes, over the limit of %d", desc.Size, maxConfigSize)
	}
	rc, err := reg.OpenBlob(ctx, repo, desc.Digest.String())
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxConfigSize+1))
	if err != nil {
		return nil, err
	}
	return v1.ParseConfigFile(bytes.NewReader(b))
}
