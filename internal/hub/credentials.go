package hub

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	dockerconfig "github.com/docker/cli/cli/config"
)

// TenantCredentials gives each tenant's own registry credential, one that
// can read only that tenant's repositories (TENANT/*), as the data of CDI's
// registry pull secret (keys accessKeyId and secretKey). ok is false when
// the tenant has none.
type TenantCredentials interface {
	Credential(tenant string) (data map[string][]byte, ok bool, err error)
}

// ErrNoTenantCredential is returned (wrapped) when imports need a tenant's
// own registry credential and the tenant has none.
var ErrNoTenantCredential = errors.New("no registry credential of the tenant's own")

// MaxCredentialFile bounds a tenant's docker config file: 64 KiB.
const MaxCredentialFile = 64 << 10

// CredentialDir reads tenants' credentials from a folder holding one docker
// config.json per tenant, named after the tenant (a Secret with one key per
// tenant, mounted as a volume). The file's entry for Registry gives the
// username and password. Files are read on every call, so an updated
// Secret takes effect without a restart.
type CredentialDir struct {
	Dir      string
	Registry string // host[:port], as in the docker config
}

var _ TenantCredentials = CredentialDir{}

// Credential implements TenantCredentials. The tenant must be a DNS-1123
// label, so it names a file directly inside Dir.
func (d CredentialDir) Credential(tenant string) (map[string][]byte, bool, error) {
	if !dns1123Label.MatchString(tenant) {
		return nil, false, fmt.Errorf("tenant %q is not a valid name", tenant)
	}
	user, pass, err := DockerCredentials(filepath.Join(d.Dir, tenant), d.Registry)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return map[string][]byte{"accessKeyId": []byte(user), "secretKey": []byte(pass)}, true, nil
}

// DockerCredentials reads the username and password for host from a docker
// config file of at most MaxCredentialFile bytes, without running
// credential helpers.
func DockerCredentials(path, host string) (user, pass string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxCredentialFile+1))
	if err != nil {
		return "", "", fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > MaxCredentialFile {
		return "", "", fmt.Errorf("%s is larger than %d bytes", path, MaxCredentialFile)
	}
	cf, err := dockerconfig.LoadFromReader(bytes.NewReader(data))
	if err != nil {
		return "", "", fmt.Errorf("parsing the docker config %s: %w", path, err)
	}
	for _, key := range []string{host, "https://" + host, "http://" + host} {
		if ac, ok := cf.GetAuthConfigs()[key]; ok && ac.Username != "" {
			return ac.Username, ac.Password, nil
		}
	}
	return "", "", fmt.Errorf("the docker config %s has no username and password for %s", path, host)
}
