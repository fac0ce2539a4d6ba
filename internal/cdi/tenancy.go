package cdi

import (
	"crypto/sha256"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"text/template"
)

// DefaultNamespaceTemplate maps a tenant to the hub namespace of the same name.
const DefaultNamespaceTemplate = "{{.Tenant}}"

// Tenancy decides which tenants a hub serves and where their images go.
// Tenant A's images never land in tenant B's namespace: the namespace is
// computed from the repository's own tenant, and two tenants that the
// template would map to one namespace are refused.
type Tenancy struct {
	tmpl  *template.Template
	allow []string // empty: every tenant not denied
	deny  []string
}

// NewTenancy compiles a namespace template (Go text/template with .Tenant)
// and the allow and deny lists of tenants.
func NewTenancy(namespaceTemplate string, allow, deny []string) (*Tenancy, error) {
	if namespaceTemplate == "" {
		namespaceTemplate = DefaultNamespaceTemplate
	}
	if !strings.Contains(namespaceTemplate, "{{.Tenant}}") {
		return nil, fmt.Errorf("namespace template %q must contain {{.Tenant}}, so that tenants stay apart", namespaceTemplate)
	}
	tmpl, err := template.New("namespace").Option("missingkey=error").Parse(namespaceTemplate)
	if err != nil {
		return nil, fmt.Errorf("parsing the namespace template: %w", err)
	}
	return &Tenancy{tmpl: tmpl, allow: allow, deny: deny}, nil
}

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Namespace returns the hub namespace for repository "TENANT/NAME...", or
// an error when the tenant is not served here or the names are invalid.
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
	var b strings.Builder
	if err := t.tmpl.Execute(&b, struct{ Tenant string }{tenant}); err != nil {
		return "", "", fmt.Errorf("applying the namespace template: %w", err)
	}
	namespace = b.String()
	if !dns1123Label.MatchString(namespace) {
		return "", "", fmt.Errorf("the template maps tenant %q to %q, not a valid namespace", tenant, namespace)
	}
	return tenant, namespace, nil
}

// ImageName is the Kubernetes name of an image: the repository path after
// the tenant when that is already a valid name of at most 40 characters;
// otherwise (nested paths, long or unusual names) a cleaned prefix plus a
// hash of the path, so that distinct repositories never share a name and
// suffixes still fit.
func ImageName(repository string) string {
	_, rest, _ := strings.Cut(repository, "/")
	n := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		}
		return '-'
	}, strings.ToLower(rest))
	n = strings.Trim(n, "-")
	if len(n) <= 40 && n == rest && n != "" { // nothing was changed: no collision possible
		return n
	}
	sum := sha256.Sum256([]byte(rest))
	return strings.Trim(n[:min(len(n), 31)], "-") + fmt.Sprintf("-%x", sum[:4])
}

// DataVolumeName is NAME-<first 12 hex of the digest>: one per digest.
func DataVolumeName(image, digest string) string {
	return image + "-" + strings.TrimPrefix(digest, "sha256:")[:12]
}

// BaseImageName names the BaseImage of one tag of an image.
func BaseImageName(image, tag string) string {
	t := strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(tag))
	name := image + "-" + strings.Trim(t, "-")
	if len(name) > 63 || !dns1123Label.MatchString(name) {
		sum := sha256.Sum256([]byte(tag))
		name = image + fmt.Sprintf("-%x", sum[:6])
	}
	return name
}
