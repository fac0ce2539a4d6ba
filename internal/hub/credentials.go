package hub

import (
	"errors"
	"io/fs"
	"path/filepath"

	"github.com/imagepipe/imagepipe/internal/credstore"
	"github.com/imagepipe/imagepipe/internal/imageref"
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

// Credential implements TenantCredentials. The tenant must be a tenant
// name (imageref), so it names a file directly inside Dir.
func (d CredentialDir) Credential(tenant string) (map[string][]byte, bool, error) {
	if err := imageref.CheckTenant(tenant); err != nil {
		return nil, false, err
	}
	user, pass, err := credstore.Read(filepath.Join(d.Dir, tenant), d.Registry)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return map[string][]byte{"accessKeyId": []byte(user), "secretKey": []byte(pass)}, true, nil
}
