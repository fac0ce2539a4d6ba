package registry

import (
	"context"
	"fmt"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sync/errgroup"
)

// Repositories lists every repository of a registry (the catalog, all pages).
func (c *Client) Repositories(ctx context.Context, reg name.Registry) ([]string, error) {
	ropts, err := c.remoteOptions(ctx, reg)
	if err != nil {
		return nil, err
	}
	repos, err := remote.Catalog(ctx, reg, ropts...)
	if err != nil {
		return nil, fmt.Errorf("listing the repositories of %s: %w", reg, err)
	}
	return repos, nil
}

// TagDigests returns every tag of repo (build-key tags excluded) with the
// digest it points at: one listing and one HEAD per tag.
func (c *Client) TagDigests(ctx context.Context, repo name.Repository) (map[string]string, error) {
	ropts, err := c.remoteOptions(ctx, repo.Registry)
	if err != nil {
		return nil, err
	}
	tags, err := listTags(repo, ropts)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(tags))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	ropts, err = c.remoteOptions(gctx, repo.Registry)
	if err != nil {
		return nil, err
	}
	for _, tag := range tags {
		g.Go(func() error {
			desc, err := remote.Head(repo.Tag(tag), ropts...)
			if isNotFound(err) {
				return nil // deleted between the listing and now
			}
			if err != nil {
				return fmt.Errorf("resolving %s:%s: %w", repo, tag, err)
			}
			mu.Lock()
			out[tag] = desc.Digest.String()
			mu.Unlock()
			return nil
		})
	}
	return out, g.Wait()
}

// Resolve looks a tag up directly. found is false only when the registry
// answered that the tag does not exist; any other failure is an error.
func (c *Client) Resolve(ctx context.Context, ref name.Tag) (digest string, found bool, err error) {
	ropts, err := c.remoteOptions(ctx, ref.Registry)
	if err != nil {
		return "", false, err
	}
	desc, err := remote.Head(ref, ropts...)
	if isNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("resolving %s: %w", ref, err)
	}
	return desc.Digest.String(), true, nil
}
