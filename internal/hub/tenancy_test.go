package hub

import (
	"fmt"
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
		"{{/* {{.Tenant}} */}}shared", // names .Tenant only in a comment
	} {
		if _, err := NewTenancy(tmpl, nil, nil); err == nil || !strings.Contains(err.Error(), "to the same namespace") {
			t.Errorf("template %q accepted (%v): it maps different tenants to one namespace", tmpl, err)
		}
	}
	// A template that keeps only what the probes do not vary is caught by
	// the allow list; without one, by the owner recorded on the namespace
	// (test/syncer TestNamespaceKeepsItsFirstTenantAcrossRestarts).
	suffix := "{{if eq (len .Tenant) 7}}{{slice .Tenant 0 6}}{{else}}{{.Tenant}}{{end}}"
	if _, err := NewTenancy(suffix, []string{"globex1", "globex2"}, nil); err == nil {
		t.Error("a template mapping two allowed tenants to one namespace was accepted")
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
	// A network's namespace (HOME-net-NAME) is no tenant's, whether the
	// tenant's name or the template makes it so.
	for tmpl, repo := range map[string]string{"{{.Tenant}}": "globex-net-front/rhel", "acme-{{.Tenant}}": "net-front/rhel", "vms-{{.Tenant}}": "a-net-b/x"} {
		ten, err := NewTenancy(tmpl, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, ns, err := ten.Namespace(repo); err == nil || !strings.Contains(err.Error(), "private network's namespace") {
			t.Errorf("template %q: Namespace(%q) = %q, %v; want refused as a network's namespace", tmpl, repo, ns, err)
		}
	}
	if _, err := NewTenancy("{{.Tenant}}-net-x", nil, nil); err == nil {
		t.Error("a template making every namespace a network's was accepted")
	}
	long, _ := NewTenancy("{{.Tenant}}-"+strings.Repeat("x", 60), nil, nil)
	if _, _, err := long.Namespace("acme/x"); err == nil {
		t.Error("a namespace over 63 characters was accepted")
	}
}

// TestNamespaceTemplateKeepsLongTenantsApart: a tenant may have 63
// characters, so a template that shortens tenants maps two long ones that
// differ only at their end to one namespace. It is refused at start, the
// error naming both tenants and the namespace; a template that only adds
// a prefix or a suffix is accepted.
func TestNamespaceTemplateKeepsLongTenantsApart(t *testing.T) {
	a63, b63 := strings.Repeat("a", 63), strings.Repeat("a", 62)+"b"
	for tmpl, ns := range map[string]string{
		`{{printf "%.50s" .Tenant}}`:                   strings.Repeat("a", 50),
		`{{printf "%.62s" .Tenant}}`:                   strings.Repeat("a", 62),
		`vms-{{printf "%.59s" .Tenant}}`:               "vms-" + strings.Repeat("a", 59),
		`{{printf "%.63s" (printf "vms-%s" .Tenant)}}`: "vms-" + strings.Repeat("a", 59),
	} {
		_, err := NewTenancy(tmpl, nil, nil)
		if err == nil {
			t.Errorf("template %s accepted: it maps %s and %s to %s", tmpl, a63, b63, ns)
			continue
		}
		want := fmt.Sprintf("maps tenants %q and %q to the same namespace %q", a63, b63, ns)
		if !strings.Contains(err.Error(), want) {
			t.Errorf("template %s refused with %q; want it to say %s", tmpl, err, want)
		}
	}
	// Accepted; long tenants keep namespaces of their own, or, where a
	// prefix makes the namespace too long, are not served ("").
	for _, tc := range []struct{ tmpl, acme, a63, b63 string }{
		{"{{.Tenant}}", "acme", a63, b63},
		{`{{printf "%.63s" .Tenant}}`, "acme", a63, b63},
		{"vms-{{.Tenant}}", "vms-acme", "", ""},
		{"{{.Tenant}}-images", "acme-images", "", ""},
	} {
		ten, err := NewTenancy(tc.tmpl, nil, nil)
		if err != nil {
			t.Errorf("template %s refused: %v", tc.tmpl, err)
			continue
		}
		for tenant, want := range map[string]string{"acme": tc.acme, a63: tc.a63, b63: tc.b63} {
			_, ns, err := ten.Namespace(tenant + "/rhel")
			if ns != want || (err == nil) != (want != "") {
				t.Errorf("template %s: Namespace(%s/rhel) = %q, %v; want %q", tc.tmpl, tenant, ns, err, want)
			}
		}
	}
}
