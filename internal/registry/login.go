package registry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// CheckLogin finds out whether reg accepts this client's credentials: it
// opens an authenticated session (GET /v2/ and, where the registry uses
// tokens, the token exchange) and reads /v2/ with it. Its error carries
// the registry's answer (a *transport.Error) or the connection's failure.
func (c *Client) CheckLogin(ctx context.Context, reg name.Registry) error {
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

// Username is the user name this client sends to host, "" for none: what
// a refusal of its credentials names.
func (c *Client) Username(host string) string {
	reg, err := name.NewRegistry(host, c.nameOptions()...)
	if err != nil {
		return ""
	}
	auth, err := c.authenticator(reg)
	if err != nil || auth == authn.Anonymous {
		return ""
	}
	cfg, err := auth.Authorization()
	if err != nil {
		return ""
	}
	return cfg.Username
}
