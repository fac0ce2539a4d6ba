package hub

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"text/template"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// DefaultNamespaceTemplate maps a tenant to the hub namespace of the same name.
const DefaultNamespaceTemplate = "{{.Tenant}}"

// AnnotationTenant, on a Namespace, names the tenant the namespace belongs
// to: image-syncer acts there for that tenant only. The syncer sets it
// when a tenant first reaches a namespace that has none; a cluster admin
// may set it beforehand, or change it, to give a namespace to a tenant.
const AnnotationTenant = "imagepipe.io/tenant"

// reasonNamespaceOfAnotherTenant is the Ready and Progressing reason of a
// BaseImage in a namespace that AnnotationTenant gives to another tenant.
const reasonNamespaceOfAnotherTenant = "NamespaceOfAnotherTenant"

// maxTenantLength is the longest tenant: a tenant is a DNS-1123 label,
// as the registry package checks a repository's first path component.
const maxTenantLength = 63

// Tenancy decides which tenants a hub serves and where their images go.
// Tenant A's images never land in tenant B's namespace: the namespace is
// computed from the repository's own tenant; a template that renders two
// probe tenants (or two tenants of the allow list) to one namespace is
// refused at start; and a namespace records on the cluster the tenant it
// belongs to (AnnotationTenant), so that a namespace two tenants reach
// through the template is served to the first one only, whichever replica
// acts and however often the syncer restarts.
type Tenancy struct {
	tmpl  *template.Template
	allow []string // empty: every tenant not denied
	deny  []string

	mu       sync.Mutex
	reserved []string

	// claims serialises claim. recorded holds the owners this process
	// wrote onto namespaces whose cached copy may not show the annotation
	// yet; the cluster's annotation, once read, replaces the entry.
	claims   sync.Mutex
	recorded map[string]string
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

// longestTenant is a tenant of the longest length allowed.
var longestTenant = strings.Repeat("a", maxTenantLength)

// probeTenants are rendered when a template is compiled: any two that land
// in one namespace refuse the template. They differ in their first, last
// and middle characters and in length, short and as long as a tenant may
// be, so that a template keeping only a prefix, a suffix or a slice of the
// tenant, of any length, is caught.
var probeTenants = []string{"a", "b", "tenant-a", "tenant-b", "a-tenant", "b-tenant", "acme", "acme2", "x0", "y1",
	longestTenant, longestTenant[:maxTenantLength-1] + "b", "b" + longestTenant[1:],
	longestTenant[:maxTenantLength/2] + "b" + longestTenant[maxTenantLength/2+1:]}

// NewTenancy compiles a namespace template (Go text/template with .Tenant)
// and the allow and deny lists of tenants. The template must map different
// tenants to different namespaces: it is rendered for probe tenants (up to
// the longest tenant, 63 characters) and for the allow list, and refused
// when two of them share a namespace. A template that adds a prefix or
// suffix is accepted even though it makes the namespace of a long tenant
// too long: that tenant is not served (Namespace says why).
func NewTenancy(namespaceTemplate string, allow, deny []string) (*Tenancy, error) {
	if namespaceTemplate == "" {
		namespaceTemplate = DefaultNamespaceTemplate
	}
	tmpl, err := template.New("namespace").Option("missingkey=error").Parse(namespaceTemplate)
	if err != nil {
		return nil, fmt.Errorf("parsing the namespace template: %w", err)
	}
	t := &Tenancy{tmpl: tmpl, allow: allow, deny: deny, recorded: map[string]string{}}
	seen := map[string]string{}
	for _, tenant := range append(slices.Clone(probeTenants), allow...) {
		ns, err := t.render(tenant)
		if err != nil {
			return nil, fmt.Errorf("namespace template %q: %w", namespaceTemplate, err)
		}
		if tenantnet.IsNetworkNamespace(ns) && !tenantnet.IsNetworkNamespace(tenant) {
			return nil, fmt.Errorf("namespace template %q maps tenant %q to %q, which has the form of a private network's namespace (HOME-net-NAME)", namespaceTemplate, tenant, ns)
		}
		if other, ok := seen[ns]; ok && other != tenant {
			hint := ""
			if len(other) == maxTenantLength && len(tenant) == maxTenantLength {
				hint = fmt.Sprintf("; a tenant may have %d characters, so the template must not shorten it", maxTenantLength)
			}
			return nil, fmt.Errorf("namespace template %q maps tenants %q and %q to the same namespace %q; it must keep tenants apart, e.g. \"{{.Tenant}}\" or \"vms-{{.Tenant}}\"%s", namespaceTemplate, other, tenant, ns, hint)
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

// Namespace returns the hub namespace for repository "TENANT/NAME...", or
// an error when the tenant is not served here or the names are invalid.
// It does not look at the cluster: before acting there, the Applier makes
// sure the namespace is the tenant's (AnnotationTenant).
func (t *Tenancy) Namespace(repository string) (tenant, namespace string, err error) {
	tenant, err = imageref.Tenant(repository)
	if err != nil {
		return "", "", err
	}
	if slices.Contains(t.deny, tenant) || (len(t.allow) > 0 && !slices.Contains(t.allow, tenant)) {
		return "", "", fmt.Errorf("tenant %q is not served by this hub", tenant)
	}
	namespace, err = t.render(tenant)
	if err != nil {
		return "", "", err
	}
	if len(validation.IsDNS1123Label(namespace)) > 0 {
		return "", "", fmt.Errorf("the template maps tenant %q to %q, not a valid namespace", tenant, namespace)
	}
	if tenantnet.IsNetworkNamespace(namespace) {
		return "", "", fmt.Errorf("the template maps tenant %q to namespace %q, which has the form of a private network's namespace (HOME-net-NAME); no tenant is served in such a namespace", tenant, namespace)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.isReserved(namespace) {
		return "", "", fmt.Errorf("the template maps tenant %q to namespace %q, which is reserved for the cluster or the syncer", tenant, namespace)
	}
	return tenant, namespace, nil
}

// namespaceTakenError says that a namespace belongs to another tenant.
type namespaceTakenError struct {
	Namespace, Owner, Tenant string
}

func (e *namespaceTakenError) Error() string {
	return fmt.Sprintf("namespace %s belongs to tenant %q (annotation %s), not to %q; image-syncer does not act there for %q",
		e.Namespace, e.Owner, AnnotationTenant, e.Tenant, e.Tenant)
}

// claim makes sure namespace is tenant's before the syncer acts there for
// tenant. A namespace whose AnnotationTenant names tenant is; one that
// names another tenant is not (a *namespaceTakenError); one without the
// annotation is claimed for tenant by setting it. The write is conditional
// on the namespace as read, so of two tenants (or replicas) claiming at
// once one wins and the other's claim fails and is retried. A missing
// namespace is an error: the syncer never creates one.
func (t *Tenancy) claim(ctx context.Context, c client.Client, tenant, namespace string) error {
	var ns corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return fmt.Errorf("reading namespace %s of tenant %q: %w", namespace, tenant, err)
	}
	t.claims.Lock()
	defer t.claims.Unlock()
	owner := ns.Annotations[AnnotationTenant]
	if owner != "" {
		delete(t.recorded, namespace)
	} else {
		owner = t.recorded[namespace] // written by this process, not yet in the cache
	}
	labelled := ns.Labels[AnnotationTenant] == tenant
	switch owner {
	case tenant:
		if labelled {
			return nil
		}
	case "":
	default:
		return &namespaceTakenError{Namespace: namespace, Owner: owner, Tenant: tenant}
	}
	// The label, the annotation's twin, selects the namespace for the
	// tenant admission policy (config/tenant/policy.yaml).
	patch := fmt.Appendf(nil, `{"metadata":{"resourceVersion":%q,"annotations":{%q:%q},"labels":{%q:%q}}}`, ns.ResourceVersion, AnnotationTenant, tenant, AnnotationTenant, tenant)
	if err := c.Patch(ctx, &ns, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("recording tenant %q as the owner of namespace %s: %w", tenant, namespace, err)
	}
	t.recorded[namespace] = tenant
	return nil
}

// checkNamespaceOwner refuses bi when AnnotationTenant gives its namespace
// to another tenant than bi's: Phase Failed, Ready and Progressing False
// with reason NamespaceOfAnotherTenant naming both tenants, and an error,
// so that the BaseImage is looked at again with backoff and served once
// the namespace is its tenant's. Nothing else of bi is acted on meanwhile.
// A namespace without the annotation is not claimed here: the Applier
// claims it before it creates a BaseImage there.
func (r *Reconciler) checkNamespaceOwner(ctx context.Context, bi *v1alpha1.BaseImage) error {
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, client.ObjectKey{Name: bi.Namespace}, &ns); err != nil {
		return fmt.Errorf("reading namespace %s: %w", bi.Namespace, err)
	}
	owner := ns.Annotations[AnnotationTenant]
	if owner == "" || owner == bi.Spec.Tenant {
		return nil
	}
	taken := &namespaceTakenError{Namespace: bi.Namespace, Owner: owner, Tenant: bi.Spec.Tenant}
	bi.Status.Phase = v1alpha1.PhaseFailed
	msg := fmt.Sprintf("%s; give each tenant a namespace of its own with --namespace-template, or the namespace to %q by changing the annotation", taken, bi.Spec.Tenant)
	r.condition(bi, v1alpha1.ConditionReady, false, reasonNamespaceOfAnotherTenant, msg)
	r.condition(bi, v1alpha1.ConditionProgressing, false, reasonNamespaceOfAnotherTenant, msg)
	return taken
}
