package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// checkPushTimeout bounds CheckPush: one attempt of each request.
const checkPushTimeout = 30 * time.Second

// CheckPush finds out, before any work, whether the registry of repo
// answers and accepts a push to repo from this client's credentials: it
// opens an upload session (the request every push starts with) and
// deletes it at once. Each request is tried once. Its errors carry the
// registry's answer (a *transport.Error: credentials wanted or refused,
// push denied) or the connection's failure.
func (c *Client) CheckPush(ctx context.Context, repo name.Repository) error {
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
	client, base, err := c.httpClient(ctx, repo, repo.Scope(transport.PushScope))
	if err != nil {
		return wrap(err)
	}
	baseURL, err := url.Parse(base)
	if err != nil {
		return err
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
