package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// checkPushTimeout bounds CheckPush: one attempt of each request.
const checkPushTimeout = 30 * time.Second

// CheckPush finds out, before any work, whether the registry of repo
// answers and accepts a push to repo from this client's credentials: it
// opens an upload session (the request every push starts with) and
// deletes it at once. Each request is tried once. Its errors say what is
// wrong in words: the registry is unreachable, it wants credentials, the
// credentials are wrong, or they may not push to repo.
func (c *Client) CheckPush(ctx context.Context, repo name.Repository) error {
	ctx, cancel := context.WithTimeout(ctx, checkPushTimeout)
	defer cancel()
	explain := func(err error) error {
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && context.Cause(ctx) != nil && !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return context.Cause(ctx)
		}
		var explained *failure
		if err := c.Explain(err, false); errors.As(err, &explained) {
			return err
		}
		return fmt.Errorf("checking that %s accepts a push: %w", repo, err)
	}
	client, base, err := c.httpClient(ctx, repo, repo.Scope(transport.PushScope))
	if err != nil {
		return explain(err)
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
		return explain(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return explain(transport.CheckError(resp, http.StatusAccepted))
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

// unreachable reports whether err means that no HTTP conversation took
// place: no route, refused, name not found, timed out.
func unreachable(err error) bool {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	return errors.As(err, &dnsErr) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &opErr) && opErr.Op == "dial")
}
