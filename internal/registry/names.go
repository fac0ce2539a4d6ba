package registry

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// tenantPattern is a DNS-1123 label: tenants become Kubernetes namespaces.
var tenantPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Tenant returns the tenant of a repository: its first path component.
// Repositories without a tenant ("registry/name") or whose tenant is not a
// valid namespace name are refused.
func Tenant(repo name.Repository) (string, error) {
	tenant, rest, ok := strings.Cut(repo.RepositoryStr(), "/")
	if !ok || rest == "" {
		return "", fmt.Errorf("repository %q has no tenant: use REGISTRY/TENANT/NAME", repo.RepositoryStr())
	}
	if !tenantPattern.MatchString(tenant) {
		return "", fmt.Errorf("tenant %q is not a valid name (lowercase letters, digits and '-', at most 63)", tenant)
	}
	return tenant, nil
}
