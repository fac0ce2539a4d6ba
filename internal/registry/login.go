package registry

import (
	"context"
	"fmt"
	"net/http"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/types"
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

// SaveCredentials stores user and password for host where docker, crane,
// skopeo and this package's default keychain read them: the docker config
// ($DOCKER_CONFIG/config.json, else ~/.docker/config.json), or the
// credential helper it names. It returns the config file's path.
func SaveCredentials(host, user, password string) (string, error) {
	cf, err := config.Load(config.Dir())
	if err != nil {
		return "", fmt.Errorf("reading the docker config: %w", err)
	}
	store := cf.GetCredentialsStore(host)
	if err := store.Store(types.AuthConfig{ServerAddress: host, Username: user, Password: password}); err != nil {
		return "", fmt.Errorf("storing the credentials for %s: %w", host, err)
	}
	if err := cf.Save(); err != nil {
		return "", fmt.Errorf("writing %s: %w", cf.Filename, err)
	}
	return cf.Filename, nil
}

// EraseCredentials removes the credentials for host from the docker
// config (or its credential helper). It reports whether there were any,
// and the config file's path.
func EraseCredentials(host string) (bool, string, error) {
	cf, err := config.Load(config.Dir())
	if err != nil {
		return false, "", fmt.Errorf("reading the docker config: %w", err)
	}
	store := cf.GetCredentialsStore(host)
	had, err := store.Get(host)
	if err != nil {
		return false, cf.Filename, fmt.Errorf("reading the credentials for %s: %w", host, err)
	}
	if had.Username == "" && had.Password == "" && had.IdentityToken == "" {
		return false, cf.Filename, nil
	}
	if err := store.Erase(host); err != nil {
		return false, cf.Filename, fmt.Errorf("removing the credentials for %s: %w", host, err)
	}
	if err := cf.Save(); err != nil {
		return false, cf.Filename, fmt.Errorf("writing %s: %w", cf.Filename, err)
	}
	return true, cf.Filename, nil
}
