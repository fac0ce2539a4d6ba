package registry

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/imagepipe/imagepipe/internal/imageref"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestNames checks the conversions to go-containerregistry's names:
// values that say the same as the input, and Insecure carried into them.
func TestNames(t *testing.T) {
	var c Names
	mustParse := func(s string, form imageref.Form) imageref.Ref {
		t.Helper()
		r, err := imageref.Parse(s, form)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r, err := c.Reference(mustParse("reg.example.com/acme/team/rhel:10", imageref.FormImage))
	if err != nil || r.Context().RepositoryStr() != "acme/team/rhel" || r.Identifier() != "10" || r.Context().RegistryStr() != "reg.example.com" {
		t.Errorf("Reference: %v, %v", r, err)
	}
	if tag, err := c.Reference(mustParse("127.0.0.1:5000/acme/rhel:10", imageref.FormTag)); err != nil || tag.(name.Tag).TagStr() != "10" {
		t.Errorf("Reference of a tag: %v, %v", tag, err)
	}
	if d, err := c.Reference(mustParse("127.0.0.1:5000/acme/rhel@"+testDigest, imageref.FormImage)); err != nil || d.(name.Digest).DigestStr() != testDigest {
		t.Errorf("Reference of a digest: %v, %v", d, err)
	}
	tenant := mustParse("127.0.0.1:5000/acme/", imageref.FormTenant)
	if reg, err := c.Registry(tenant); err != nil || tenant.Repository != "acme" || reg.RegistryStr() != "127.0.0.1:5000" {
		t.Errorf("Registry: %v %+v %v", reg, tenant, err)
	}
	if repo, err := c.Repository(mustParse("reg.example.com/provider-templates", imageref.FormRepository)); err != nil || repo.RepositoryStr() != "provider-templates" {
		t.Errorf("Repository: %v, %v", repo, err)
	}
	// go-containerregistry refuses Docker Hub repositories without a
	// namespace under StrictValidation, and so does Repository.
	if _, err := c.Repository(mustParse("index.docker.io/provider-templates", imageref.FormRepository)); err == nil {
		t.Error("Repository of index.docker.io/provider-templates: no error")
	}
	// Plain HTTP only where Insecure allows it.
	insecure := Names{Insecure: true}
	host := mustParse("reg.example.com", imageref.FormRegistry)
	for _, tc := range []struct {
		c    Names
		want string
	}{{c, "https"}, {insecure, "http"}} {
		reg, err := tc.c.Registry(host)
		if err != nil || reg.Scheme() != tc.want {
			t.Errorf("Registry(%v).Scheme() = %q, %v; want %q", host, reg.Scheme(), err, tc.want)
		}
		n, err := tc.c.Reference(mustParse("reg.example.com/acme/x:1", imageref.FormTag))
		if err != nil || n.Context().Scheme() != tc.want {
			t.Errorf("Reference: scheme %q, %v; want %q", n.Context().Scheme(), err, tc.want)
		}
		repo, err := tc.c.Repository(mustParse("reg.example.com/provider-templates", imageref.FormRepository))
		if err != nil || repo.Scheme() != tc.want {
			t.Errorf("Repository: scheme %q, %v; want %q", repo.Scheme(), err, tc.want)
		}
	}
}

func TestParseReference(t *testing.T) {
	for ref, ok := range map[string]bool{
		"registry.example.com/acme/rhel:10":       true,
		"127.0.0.1:5000/acme/team/rhel:10":        true,
		"registry.example.com/rhel:10":            false, // no tenant
		"registry.example.com/Acme/rhel:10":       false, // not a valid reference
		"registry.example.com/-acme/rhel:10":      false,
		"registry.example.com/acme/rhel:bad tag!": false,
	} {
		r, err := imageref.Parse(ref, imageref.FormImage)
		if err == nil {
			_, err = Names{}.Reference(r)
		}
		if (err == nil) != ok {
			t.Errorf("Parse and Reference of %q: %v, want ok=%v", ref, err, ok)
		}
	}
}
