package hub

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"text/template"
)

// DefaultNamespaceTemplate maps a tenant to the hub namespace of the same name.
const DefaultNamespaceTemplate = "{{.Tenant}}"

// Tenancy decides which tenants a hub serves and where their images go.
// Tenant A's images never land in tenant B's namespace: the namespace is
// computed from the repository's own tenant, a template that renders two
// probe tenants (or two tenants of the allow list) to one namespace is
// refused at start, and a namespace that two tenants reach at run time is
// refused to the second one.
type Tenancy struct {
	tmpl  *template.Template
	allow []string // empty: every tenant not denied
	deny  []string

	mu       sync.Mutex
	owner    map[string]string // namespace → the tenant first mapped to it
	reserved []string
}

// Reserve marks namespaces that are never a tenant's, such as the syncer's
// own. The cluster's own (default, kube-*, openshift and openshift-*) are
// always reserved: a repository whose tenant would render to one of them
// (a registry project named kube-system) is not served.
func (t *Tenancy) Reserve(namespaces ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reserved = append(t.reserved, namespaces...)
}

func (t *Tenancy) isReserved(ns string) bool {
	return ns == "default" || ns == "openshift" || strings.HasPrefix(ns, "kube-") || strings.HasPrefix(ns, "openshift-") ||
		slices.Contains(t.reserved, ns)
}

// probeTenants are rendered when a template is compiled: any two that land
// in one namespace refuse the template. They differ in their first, last
// and middle characters and in length, so that a template keeping only a
// prefix, a suffix or a slice of the tenant is caught.
var probeTenants = []string{"a", "b", "tenant-a", "tenant-b", "a-tenant", "b-tenant", "acme", "acme2", "x0", "y1",
	strings.Repeat("a", 40), strings.Repeat("a", 39) + "b", "b" + strings.Repeat("a", 39)}

// maxOwnedNamespaces bounds the run-time record of namespace owners; past
// it the record is emptied (the start-up probe still stands).
const maxOwnedNamespaces = 1 << 16

// NewTenancy compiles a namespace template (Go text/template with .Tenant)
// and the allow and deny lists of tenants. The template must map different
// tenants to different namespaces: it is rendered for probe tenants and
// for the allow list, and refused when two of them share a namespace.
func NewTenancy(namespaceTemplate string, allow, deny []string) (*Tenancy, error) {
	if namespaceTemplate == "" {
		namespaceTemplate = DefaultNamespaceTemplate
	}
	tmpl, err := template.New("namespace").Option("missingkey=error").Parse(namespaceTemplate)
	if err != nil {
		return nil, fmt.Errorf("parsing the namespace template: %w", err)
	}
	t := &Tenancy{tmpl: tmpl, allow: allow, deny: deny, owner: map[string]string{}}
	seen := map[string]string{}
	for _, tenant := range append(slices.Clone(probeTenants), allow...) {
		ns, err := t.render(tenant)
		if err != nil {
			return nil, fmt.Errorf("namespace template %q: %w", namespaceTemplate, err)
		}
		if other, ok := seen[ns]; ok && other != tenant {
			return nil, fmt.Errorf("namespace template %q maps tenants %q and %q to the same namespace %q; it must keep tenants apart, e.g. \"{{.Tenant}}\" or \"vms-{{.Tenant}}\"", namespaceTemplate, other, tenant, ns)
		}
		seen[ns] = tenant
	}
	return t, nil
}

// render applies the template to tenant.
func (t *Tenancy) render(tenant string) (string, error) {
	var b strings.Builder
	if err := t.tmpl.Execute(&b, struct{ Tenant string }{tenant}); err != nil {
		return "", fmt.Errorf("applying the namespace template to tenant %q: %w", tenant, err)
	}
	return b.String(), nil
}

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Namespace returns the hub namespace for repository "TENANT/NAME...", or
// an error when the tenant is not served here, the names are invalid, or
// another tenant already reached the same namespace.
func (t *Tenancy) Namespace(repository string) (tenant, namespace string, err error) {
	tenant, name, ok := strings.Cut(repository, "/")
	if !ok || name == "" {
		return "", "", fmt.Errorf("repository %q has no tenant", repository)
	}
	if !dns1123Label.MatchString(tenant) {
		return "", "", fmt.Errorf("tenant %q is not a valid name", tenant)
	}
	if slices.Contains(t.deny, tenant) || (len(t.allow) > 0 && !slices.Contains(t.allow, tenant)) {
		return "", "", fmt.Errorf("tenant %q is not served by this hub", tenant)
	}
	namespace, err = t.render(tenant)
	if err != nil {
		return "", "", err
	}
	if !dns1123Label.MatchString(namespace) {
		return "", "", fmt.Errorf("the template maps tenant %q to %q, not a valid namespace", tenant, namespace)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.isReserved(namespace) {
		return "", "", fmt.Errorf("the template maps tenant %q to namespace %q, which is reserved for the cluster or the syncer", tenant, namespace)
	}
	if other, ok := t.owner[namespace]; ok && other != tenant {
		return "", "", fmt.Errorf("the namespace template maps tenants %q and %q to the same namespace %q; %q is not served", other, tenant, namespace, tenant)
	}
	if len(t.owner) >= maxOwnedNamespaces {
		t.owner = map[string]string{}
	}
	t.owner[namespace] = tenant
	return tenant, namespace, nil
}
