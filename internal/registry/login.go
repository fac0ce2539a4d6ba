package registry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// CheckLogin finds out whether reg accepts this client's credentials: it
// opens an authenticated session (GET /v2/ and, where the registry uses
// tokens, the token exchange) and reads /v2/ with it. Its error is an
// explained failure: unreachable, or the credentials refused.
func (c *Client) CheckLogin(ctx context.Context, reg name.Registry) error {
	auth, err := c.authenticator(reg)
	if err != nil {
		return err
	}
	rt, err := transport.NewWithContext(ctx, reg, auth, transport.NewUserAgent(c.base, c.opts.userAgent), []string{reg.Scope(transport.PullScope)})
	if err != nil {
		return c.Explain(fmt.Errorf("authenticating to %s: %w", reg, err), false)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, reg.Scheme()+"://"+reg.RegistryStr()+"/v2/", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return c.Explain(err, false)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c.Explain(transport.CheckError(resp, http.StatusOK), false)
	}
	return nil
}
