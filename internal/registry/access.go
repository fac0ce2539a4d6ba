package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// checkPushTimeout bounds the push check of CheckAccess: one attempt of
// each request.
const checkPushTimeout = 30 * time.Second

// CheckAccess finds out, before any work, whether reg answers and accepts
// this client's credentials. With repository "", it opens an
// authenticated session (GET /v2/ and, where the registry uses tokens,
// the token exchange) and reads /v2/ with it: what a login checks.
// Otherwise it checks that reg accepts a push to repository: it opens an
// upload session there (the request every push starts with) and deletes
// it at once, each request tried once, within 30 seconds. Its errors
// carry the registry's answer (a *transport.Error: credentials wanted or
// refused, push denied) or the connection's failure.
func (c *Client) CheckAccess(ctx context.Context, reg name.Registry, repository string) error {
	if repository == "" {
		return c.checkLogin(ctx, reg)
	}
	repo, err := name.NewRepository(reg.RegistryStr()+"/"+repository, append(NameOptions(reg), name.StrictValidation)...)
	if err != nil {
		return fmt.Errorf("checking access to %s: %w", reg, err)
	}
	return c.checkPush(ctx, repo)
}

// checkLogin is CheckAccess of a registry.
func (c *Client) checkLogin(ctx context.Context, reg name.Registry) error {
	auth, err := c.authenticator(reg)
	if err != nil {
		return err
	}
	rt, err := transport.NewWithContext(ctx, reg, auth, transport.NewUserAgent(c.base, c.opts.userAgent), []string{reg.Scope(transport.PullScope)})
	if err != nil {
		return fmt.Errorf("authenticating to %s: %w", reg, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, reg.Scheme()+"://"+reg.RegistryStr()+"/v2/", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return fmt.Errorf("reading %s: %w", reg, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return transport.CheckError(resp, http.StatusOK)
	}
	return nil
}

// checkPush is CheckAccess of a repository.
func (c *Client) checkPush(ctx context.Context, repo name.Repository) error {
	ctx, cancel := context.WithTimeout(ctx, checkPushTimeout)
	defer cancel()
	wrap := func(err error) error {
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return context.Cause(ctx)
		}
		return fmt.Errorf("checking that %s accepts a push: %w", repo, err)
	}
	client, baseURL, err := c.httpClient(ctx, repo, repo.Scope(transport.PushScope))
	if err != nil {
		return wrap(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL.JoinPath("v2", repo.RepositoryStr(), "blobs", "uploads").String()+"/", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return wrap(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return wrap(transport.CheckError(resp, http.StatusAccepted))
	}
	// The session is not needed: delete it (a registry that cannot only
	// lets it expire).
	if loc, err := baseURL.Parse(resp.Header.Get("Location")); err == nil && resp.Header.Get("Location") != "" &&
		loc.Scheme == baseURL.Scheme && loc.Host == baseURL.Host {
		if req, err := http.NewRequestWithContext(ctx, http.MethodDelete, loc.String(), nil); err == nil {
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}
	return nil
}
