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

// TestNames pins the naming scheme: simple names stay readable, anything
// else gets a hash, and the collisions of the old scheme are gone.
func TestNames(t *testing.T) {
	for _, tt := range []struct{ repo, tag, want string }{
		{"acme/rhel", "9", "rhel--9"},
		{"acme/rhel", "latest", "rhel--latest"},
		{"acme/foo-bar", "latest", "foo-bar--latest"},
		{"acme/foo", "bar-latest", "foo--bar-latest"},
	} {
		if got := BaseImageName(tt.repo, tt.tag); got != tt.want {
			t.Errorf("BaseImageName(%q, %q) = %q, want %q", tt.repo, tt.tag, got, tt.want)
		}
	}
	if got := ImageName("acme/rhel"); got != "rhel" {
		t.Errorf("ImageName = %q", got)
	}
	if got := DataVolumeName("rhel", "sha256:0123456789abcdef0123"+strings.Repeat("0", 44)); got != "rhel--0123456789abcdef0123000000000000" {
		t.Errorf("DataVolumeName = %q", got)
	}
	// A tenant choosing a tag or path that spells another image's hashed
	// name: "--" makes a part not simple, so it is hashed again.
	hashed := BaseImageName("acme/rhel", "v1.0")
	for _, rt := range [][2]string{{"acme/rhel", strings.TrimPrefix(hashed, "rhel--")}, {"acme/" + strings.TrimSuffix(hashed, "--"+hashed[len(hashed)-16:]), hashed[len(hashed)-16:]}} {
		if BaseImageName(rt[0], rt[1]) == hashed {
			t.Errorf("%s:%s forges the name %q of acme/rhel:v1.0", rt[0], rt[1], hashed)
		}
	}
	// Each group collided under the old scheme.
	for _, group := range [][][2]string{
		{{"acme/rhel", "v1.0"}, {"acme/rhel", "v1-0"}, {"acme/rhel", "v1_0"}, {"acme/rhel", "V1.0"}, {"acme/rhel", "v1--0"}},
		{{"acme/foo", "bar-latest"}, {"acme/foo-bar", "latest"}, {"acme/foo-bar-latest", "x"}},
		{{"acme/team/rhel", "9"}, {"acme/team-rhel", "9"}, {"acme/team_rhel", "9"}, {"acme/team--rhel", "9"}, {"acme/team.rhel", "9"}},
		{{"acme/" + strings.Repeat("a", 61), "9"}, {"acme/" + strings.Repeat("a", 60), "9"}, {"acme/rhel", strings.Repeat("t", 128)}, {"acme/rhel", strings.Repeat("t", 127)}},
	} {
		seen := map[string][2]string{}
		images := map[string]string{}
		for _, rt := range group {
			checkNames(t, rt[0], rt[1])
			n := BaseImageName(rt[0], rt[1])
			if other, ok := seen[n]; ok {
				t.Errorf("%s:%s and %s:%s share the name %q", other[0], other[1], rt[0], rt[1], n)
			}
			seen[n] = rt
			img := ImageName(rt[0])
			if other, ok := images[img]; ok && other != rt[0] {
				t.Errorf("repositories %s and %s share the image name %q", other, rt[0], img)
			}
			images[img] = rt[0]
		}
	}
}

// checkNames fails unless every name of repository:tag is a DNS-1123 label
// of at most 63 characters.
func checkNames(t *testing.T, repository, tag string) {
	t.Helper()
	image := ImageName(repository)
	for _, n := range []string{image, BaseImageName(repository, tag), DataVolumeName(image, "sha256:"+strings.Repeat("f", 64))} {
		if len(n) > 63 || !dns1123Label.MatchString(n) {
			t.Fatalf("%s:%s: name %q is not a DNS-1123 label of at most 63 characters", repository, tag, n)
		}
	}
	if len(image) > 31 {
		t.Fatalf("image name %q of %s is longer than 31 characters: DataVolume names lose digest bits", image, repository)
	}
}
