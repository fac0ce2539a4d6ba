package registry

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sync/errgroup"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// listConcurrency is how many registry requests List and Delete have in
// flight at once.
const listConcurrency = 8

// List returns every tag of every repository of tenant on reg, sorted by
// repository and tag, without the build-key tags. The catalog and the tag
// lists are read page by page; each tag's manifest and config are fetched
// with up to 8 requests at a time. Images imagepipe did not build are
// listed with the annotation fields empty.
func (c *Client) List(ctx context.Context, reg name.Registry, tenant string) ([]api.ImageListing, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	ropts, err := c.remoteOptions(gctx, reg)
	if err != nil {
		return nil, err
	}
	catalog, err := remote.Catalog(gctx, reg, ropts...)
	if err != nil {
		return nil, &CatalogError{Registry: reg.String(), Tenant: tenant, Err: err}
	}
	var repos []name.Repository
	for _, r := range catalog {
		if strings.HasPrefix(r, tenant+"/") {
			repos = append(repos, reg.Repo(r))
		}
	}

	tags := make([][]string, len(repos))
	for i, repo := range repos {
		g.Go(func() error {
			var err error
			tags[i], err = listTags(repo, ropts)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}

	return c.describeAll(ctx, reg, repos, tags)
}

// ListRepository returns every tag of repo, sorted, without the build-key
// tags, described like List's. It needs no catalog API, which registries
// such as Harbor and GHCR restrict.
func (c *Client) ListRepository(ctx context.Context, repo name.Repository) ([]api.ImageListing, error) {
	ropts, err := c.remoteOptions(ctx, repo.Registry)
	if err != nil {
		return nil, err
	}
	tags, err := listTags(repo, ropts)
	if err != nil {
		return nil, err
	}
	return c.describeAll(ctx, repo.Registry, []name.Repository{repo}, [][]string{tags})
}

// describeAll describes tags[i] of each repos[i], with up to
// listConcurrency requests at a time, sorted by repository and tag.
func (c *Client) describeAll(ctx context.Context, reg name.Registry, repos []name.Repository, tags [][]string) ([]api.ImageListing, error) {
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
	ropts, err := c.remoteOptions(gctx, reg)
	if err != nil {
		return nil, err
	}
	for i := range listings {
		g.Go(func() error { return describe(&listings[i], refs[i], ropts) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	slices.SortFunc(listings, func(a, b api.ImageListing) int {
		return cmp.Or(strings.Compare(a.Repository, b.Repository), strings.Compare(a.Tag, b.Tag))
	})
	return listings, nil
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

// listTags lists a repository's tags without the build-key tags. A
// repository the catalog still names but that holds no tag has none.
func listTags(repo name.Repository, ropts []remote.Option) ([]string, error) {
	all, err := remote.List(repo, ropts...)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the tags of %s: %w", repo, err)
	}
	return slices.DeleteFunc(all, api.IsAttachmentTag), nil
}

// describe fills l from its tag's manifest annotations, falling back to
// the config's labels and creation time.
func describe(l *api.ImageListing, ref name.Tag, ropts []remote.Option) error {
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", ref, err)
	}
	l.Digest = desc.Digest.String()
	if !desc.MediaType.IsImage() {
		return nil // an index, or something that is no image at all
	}
	m, err := v1.ParseManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		return fmt.Errorf("parsing the manifest of %s: %w", ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
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

// isNotFound reports a registry's 404 answer.
func isNotFound(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}
