package hub

import (
	"strings"
	"testing"
)

func TestTenancy(t *testing.T) {
	ten, err := NewTenancy("tenant-{{.Tenant}}", nil, []string{"blocked"})
	if err != nil {
		t.Fatal(err)
	}
	for repo, want := range map[string]string{
		"acme/rhel":      "tenant-acme",
		"acme/team/rhel": "tenant-acme",
		"other/x":        "tenant-other",
		"blocked/x":      "", // denied
		"rhel":           "", // no tenant
		"Acme/x":         "", // invalid tenant
		"acme/":          "",
	} {
		_, ns, err := ten.Namespace(repo)
		if (err != nil) != (want == "") || ns != want {
			t.Errorf("Namespace(%q) = %q, %v; want %q", repo, ns, err, want)
		}
	}
	only, _ := NewTenancy("", []string{"acme"}, nil)
	if _, _, err := only.Namespace("other/x"); err == nil {
		t.Error("a tenant outside the allow list was served")
	}
	for _, tmpl := range []string{
		"shared",                      // every tenant in one namespace
		"{{printf \"%.3s\" .Tenant}}", // a prefix: acme and acme2 share "acm"
		"{{slice .Tenant 1}}",         // all but the first character: a-tenant and b-tenant
		"{{if eq .Tenant \"acme\"}}acme{{else}}others{{end}}",
		"x{{len .Tenant}}",            // the length only
		"{{/* {{.Tenant}} */}}shared", // the old substring check passed it
	} {
		if _, err := NewTenancy(tmpl, nil, nil); err == nil || !strings.Contains(err.Error(), "to the same namespace") {
			t.Errorf("template %q accepted (%v): it maps different tenants to one namespace", tmpl, err)
		}
	}
	// A template that keeps only what the probes do not vary is caught by
	// the allow list, and at run time by the namespace's first tenant.
	suffix := "{{if eq (len .Tenant) 7}}{{slice .Tenant 0 6}}{{else}}{{.Tenant}}{{end}}"
	if _, err := NewTenancy(suffix, []string{"globex1", "globex2"}, nil); err == nil {
		t.Error("a template mapping two allowed tenants to one namespace was accepted")
	}
	loose, err := NewTenancy(suffix, nil, nil)
	if err != nil {
		t.Fatalf("template %q: %v", suffix, err)
	}
	if _, ns, err := loose.Namespace("globex1/rhel"); err != nil || ns != "globex" {
		t.Fatalf("Namespace(globex1/rhel) = %q, %v", ns, err)
	}
	if _, ns, err := loose.Namespace("globex2/rhel"); err == nil {
		t.Errorf("globex2 was served in %q, the namespace globex1 already has", ns)
	}
	// Namespaces of the cluster and of the syncer are nobody's tenant namespace.
	plain, _ := NewTenancy("", nil, nil)
	plain.Reserve("imagepipe-system")
	for _, repo := range []string{"kube-system/rhel", "default/rhel", "kube-public/x", "openshift-config/x", "imagepipe-system/rhel"} {
		if _, ns, err := plain.Namespace(repo); err == nil {
			t.Errorf("Namespace(%q) = %q: a reserved namespace was served", repo, ns)
		}
	}
	for _, tmpl := range []string{"{{.Tenant}}", "vms-{{.Tenant}}", "{{.Tenant}}-images"} {
		if _, err := NewTenancy(tmpl, nil, nil); err != nil {
			t.Errorf("template %q refused: %v", tmpl, err)
		}
	}
	long, _ := NewTenancy("{{.Tenant}}-"+strings.Repeat("x", 60), nil, nil)
	if _, _, err := long.Namespace("acme/x"); err == nil {
		t.Error("a namespace over 63 characters was accepted")
	}
}
