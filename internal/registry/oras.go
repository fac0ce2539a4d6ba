package registry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/retry"
)

// ORASRepository opens repo with oras-go, authenticated and over the same
// scheme, TLS settings, User-Agent and credentials as the rest of the
// client, for artifacts that are not disk images (internal/catalog,
// internal/verdict). On registries without the referrers API, a manifest
// pushed with a subject extends the subject's referrers tag; the index the
// tag pointed at before is never deleted, since others (the gate, hubs)
// may be reading it.
func (c *Client) ORASRepository(ctx context.Context, repo name.Repository) (*remote.Repository, error) {
	r, err := remote.NewRepository(repo.Name())
	if err != nil {
		return nil, fmt.Errorf("repository %s: %w", repo, err)
	}
	scheme, err := c.scheme(ctx, repo.Registry)
	if err != nil {
		return nil, err
	}
	r.PlainHTTP = scheme == "http"
	r.SkipReferrersGC = true
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
	return r, nil
}
