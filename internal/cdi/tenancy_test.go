package cdi

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
	if _, err := NewTenancy("shared", nil, nil); err == nil {
		t.Error("a template without the tenant was accepted: every tenant would share one namespace")
	}
	long, _ := NewTenancy("{{.Tenant}}-"+strings.Repeat("x", 60), nil, nil)
	if _, _, err := long.Namespace("acme/x"); err == nil {
		t.Error("a namespace over 63 characters was accepted")
	}
}

func TestNames(t *testing.T) {
	if got := ImageName("acme/rhel"); got != "rhel" {
		t.Errorf("ImageName = %q", got)
	}
	a, b := ImageName("acme/team/rhel"), ImageName("acme/team-rhel")
	if a == b || len(a) > 40 {
		t.Errorf("distinct repositories map to %q and %q", a, b)
	}
	if got := DataVolumeName("rhel", "sha256:0123456789abcdef0123"+strings.Repeat("0", 44)); got != "rhel-0123456789ab" {
		t.Errorf("DataVolumeName = %q", got)
	}
	for _, tag := range []string{"10", "v1.2_rc", strings.Repeat("t", 120), "UPPER"} {
		if n := BaseImageName("rhel", tag); len(n) > 63 || !dns1123Label.MatchString(n) {
			t.Errorf("BaseImageName(%q) = %q, not a valid name", tag, n)
		}
	}
}
