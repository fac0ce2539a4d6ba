package registry

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
)

// ociNamePattern is the distribution spec's repository name grammar
// (spec.md, "Pulling manifests"), written out independently of names.go.
var ociNamePattern = regexp.MustCompile(`^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(\/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$`)

// ociTagPattern is the spec's tag grammar.
var ociTagPattern = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParseRefAccepts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		form refForm
		want ref
	}{
		{"registry.example.com/acme/rhel:10", formImage, ref{"registry.example.com", "acme/rhel", "10", ""}},
		{"127.0.0.1:5000/acme/team/rhel:v1.0_rc-2", formTag, ref{"127.0.0.1:5000", "acme/team/rhel", "v1.0_rc-2", ""}},
		{"localhost/acme/rhel@" + testDigest, formImage, ref{"localhost", "acme/rhel", "", testDigest}},
		{"[::1]:5000/acme/a.b/c__d/e---f:_x", formImage, ref{"[::1]:5000", "acme/a.b/c__d/e---f", "_x", ""}},
		{"reg.example.com/acme/x@" + testDigest, formTagOrDigestTarget, ref{"reg.example.com", "acme/x", "", testDigest}},
		{"reg.example.com/provider-templates", formRepository, ref{"reg.example.com", "provider-templates", "", ""}},
		{"reg.example.com/acme", formTenant, ref{"reg.example.com", "acme", "", ""}},
		{"reg.example.com/acme/x:" + strings.Repeat("t", 128), formTag, ref{"reg.example.com", "acme/x", strings.Repeat("t", 128), ""}},
	} {
		got, err := parseRef(tc.in, tc.form)
		if err != nil || got != tc.want {
			t.Errorf("parseRef(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if got.String() != tc.in {
			t.Errorf("parseRef(%q).String() = %q", tc.in, got.String())
		}
	}
}

// TestParseRefRefuses lists references outside the grammar (or outside
// what a command may write) with the part the message must name and a
// word of the sentence. Several of them go-containerregistry accepts;
// the test checks which, so that it shows why parseRef exists.
func TestParseRefRefuses(t *testing.T) {
	long := strings.Repeat("a", 250)
	for _, tc := range []struct {
		in       string
		form     refForm
		part     string
		says     string
		ggcrTake bool // go-containerregistry (strict) accepts it
	}{
		{"reg.example.com/acme/../globex/evil:1", formTag, "repository", `".." of the repository is a relative path step`, true},
		{"reg.example.com/acme/./evil:1", formTag, "repository", "relative path step", true},
		{"reg.example.com/acme/%2e%2e/globex/evil:1", formTag, "repository", "OCI name grammar", false},
		{`reg.example.com/acme/..\globex:1`, formTag, "repository", "OCI name grammar", false},
		{"reg.example.com/acme/evil?x=1:1", formTag, "repository", "OCI name grammar", false},
		{"user@reg.example.com/acme/evil:1", formTag, "digest", "64 lower-case", false},
		{"reg.example.com/acme//evil:1", formTag, "repository", "empty path component", true},
		{"reg.example.com/acme/evil/:1", formTag, "repository", "empty path component", true},
		{"reg.example.com//acme/evil:1", formTag, "repository", "empty path component", true},
		{"reg.example.com/acme/Evil:1", formTag, "repository", "upper-case", false},
		{"reg.example.com/acme/a..b:1", formTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/a._b:1", formTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/a___b:1", formTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/-a:1", formTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/a-:1", formTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/_a:1", formTag, "repository", "OCI name grammar", true},
		{"reg.example.com/ac_me/x:1", formTag, "tenant", "not a valid name", true},
		{"reg.example.com/a.cme/x:1", formTag, "tenant", "not a valid name", true},
		{"reg.example.com/x:1", formTag, "tenant", "no tenant", true},
		{"acme/rhel:1", formTag, "registry host", "no registry host", false},
		{"registry/acme/rhel:1", formTag, "registry host", "no registry host", false},
		{"Reg.Example.com/acme/rhel:1", formTag, "registry host", "upper-case", true},
		{"reg..example.com/acme/rhel:1", formTag, "registry host", "label", true},
		{"-reg.example.com/acme/rhel:1", formTag, "registry host", "label", true},
		{"reg.example.com:0/acme/rhel:1", formTag, "registry host", "port", true},
		{"reg.example.com:05000/acme/rhel:1", formTag, "registry host", "leading zeros", true},
		{"reg.example.com:99999/acme/rhel:1", formTag, "registry host", "port", true},
		{"reg.example.com:/acme/rhel:1", formTag, "registry host", "empty port", true},
		{"[::1/acme/rhel:1", formTag, "registry host", "unclosed", false},
		{"[zz]:5000/acme/rhel:1", formTag, "registry host", "IPv6", false},
		{"https://reg.example.com/acme/rhel:1", formTag, "reference", "URL scheme", false},
		{"reg.example.com/acme/rhel", formTag, "tag", "no tag", false},
		{"reg.example.com/acme/rhel", formImage, "tag", "neither a tag nor a digest", false},
		{"reg.example.com/acme/rhel:", formImage, "tag", "empty", false},
		{"reg.example.com/acme/rhel:.x", formImage, "tag", "starting with", true},
		{"reg.example.com/acme/rhel:-x", formImage, "tag", "starting with", true},
		{"reg.example.com/acme/rhel:a+b", formImage, "tag", "starting with", false},
		{"reg.example.com/acme/rhel:" + strings.Repeat("t", 129), formImage, "tag", "limit is 128", false},
		{"reg.example.com/acme/rhel@sha256:abc", formImage, "digest", "64 lower-case", false},
		{"reg.example.com/acme/rhel@sha512:" + strings.Repeat("a", 128), formImage, "digest", "only sha256", true},
		{"reg.example.com/acme/rhel@" + strings.ToUpper(testDigest), formImage, "digest", "64 lower-case", false},
		{"reg.example.com/acme/rhel:1@" + testDigest, formImage, "reference", "both a tag and a digest", true},
		{"reg.example.com/acme/rhel@" + testDigest, formTag, "digest", "writes a tag", true},
		{"reg.example.com/acme/rhel:1\n", formImage, "reference", "printable ASCII", false},
		{"reg.example.com/acme/rh el:1", formImage, "reference", "printable ASCII", false},
		{"reg.example.com/acme/rhél:1", formImage, "reference", "printable ASCII", false},
		{"", formImage, "reference", "empty", false},
		{"reg.example.com/acme/" + long + ":1", formImage, "repository", "limit is 255", true},
		{"reg.example.com/acme/x", formTenant, "tenant", "not a tenant", false},
		{"reg.example.com/Acme", formTenant, "repository", "upper-case", false},
		{"reg.example.com/a_b", formTenant, "tenant", "not a valid name", false},
		{"reg.example.com/cat:1", formRepository, "repository", "tag or a digest", false},
	} {
		_, err := parseRef(tc.in, tc.form)
		re := AsReferenceError(err)
		if re == nil || re.Part != tc.part || !strings.Contains(re.Rule, tc.says) || re.Input != tc.in {
			t.Errorf("parseRef(%q) = %v; want a %s error saying %q", tc.in, err, tc.part, tc.says)
		}
		if tc.form == formTag || tc.form == formImage {
			_, gerr := name.ParseReference(tc.in, name.StrictValidation)
			if (gerr == nil) != tc.ggcrTake {
				t.Errorf("go-containerregistry on %q: %v; the test expected accepted=%v", tc.in, gerr, tc.ggcrTake)
			}
		}
	}
}

// TestClientParsers checks the exported parsers: the form each command
// needs, and go-containerregistry values that say the same as the input.
func TestClientParsers(t *testing.T) {
	c := testClient(t)
	r, err := c.ParseReference("reg.example.com/acme/team/rhel:10")
	if err != nil || r.Context().RepositoryStr() != "acme/team/rhel" || r.Identifier() != "10" || r.Context().RegistryStr() != "reg.example.com" {
		t.Errorf("ParseReference: %v, %v", r, err)
	}
	if tag, err := c.ParseTag("127.0.0.1:5000/acme/rhel:10"); err != nil || tag.TagStr() != "10" {
		t.Errorf("ParseTag: %v, %v", tag, err)
	}
	if _, err := c.ParseTag("127.0.0.1:5000/acme/rhel@" + testDigest); AsReferenceError(err) == nil {
		t.Errorf("ParseTag of a digest: %v", err)
	}
	if d, err := c.ParseTarget("127.0.0.1:5000/acme/rhel@" + testDigest); err != nil || d.Identifier() != testDigest {
		t.Errorf("ParseTarget: %v, %v", d, err)
	}
	if reg, tenant, err := c.ParseTenant("127.0.0.1:5000/acme/"); err != nil || tenant != "acme" || reg.RegistryStr() != "127.0.0.1:5000" {
		t.Errorf("ParseTenant: %v %q %v", reg, tenant, err)
	}
	if repo, err := c.ParseRepository("reg.example.com/provider-templates"); err != nil || repo.RepositoryStr() != "provider-templates" {
		t.Errorf("ParseRepository: %v, %v", repo, err)
	}
	// A repository go-containerregistry built from a lenient string has no
	// tenant either.
	lenient, err := name.NewRepository("reg.example.com/acme/../globex/evil")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Tenant(lenient); AsReferenceError(err) == nil {
		t.Errorf("Tenant of acme/../globex/evil: %v", err)
	}
	if tenant, err := Tenant(name.MustParseReference("reg.example.com/acme/x:1").Context()); err != nil || tenant != "acme" {
		t.Errorf("Tenant = %q, %v", tenant, err)
	}
}

// FuzzParseReference: whatever parseRef accepts is inside the OCI
// grammar (an independent regexp), has no "." or ".." component, has the
// first path component as its tenant, prints back to its input, parses
// again to the same value, and converts to go-containerregistry's form
// without error and with the same parts.
func FuzzParseReference(f *testing.F) {
	for _, s := range []string{
		"reg.example.com/acme/rhel:10", "127.0.0.1:5000/acme/a/b:1", "[::1]:5000/acme/x@" + testDigest,
		"reg.example.com/acme/../globex/evil:1", "localhost/acme/x:y", "reg:5000/acme/a__b.c-d:_",
		"reg.example.com/acme/x:1@" + testDigest, "Reg.example.com/acme/x:1",
	} {
		f.Add(s, uint8(0))
	}
	c, err := New(WithCacheDir(""))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string, formByte uint8) {
		form := refForm(formByte % 5)
		r, err := parseRef(s, form)
		if err != nil {
			if AsReferenceError(err) == nil {
				t.Fatalf("parseRef(%q) error is not a *ReferenceError: %v", s, err)
			}
			return
		}
		if r.String() != s {
			t.Fatalf("parseRef(%q).String() = %q", s, r.String())
		}
		again, err := parseRef(r.String(), form)
		if err != nil || again != r {
			t.Fatalf("parseRef is not idempotent on %q: %+v, %v", s, again, err)
		}
		if !ociNamePattern.MatchString(r.Repository) {
			t.Fatalf("%q: repository %q is outside the OCI grammar", s, r.Repository)
		}
		for _, comp := range strings.Split(r.Repository, "/") {
			if comp == "." || comp == ".." || comp == "" {
				t.Fatalf("%q: path component %q", s, comp)
			}
		}
		if r.Tag != "" && !ociTagPattern.MatchString(r.Tag) {
			t.Fatalf("%q: tag %q is outside the OCI grammar", s, r.Tag)
		}
		if len(r.Registry)+1+len(r.Repository) > MaxNameLength {
			t.Fatalf("%q: name longer than %d", s, MaxNameLength)
		}
		if r.Registry == "" || strings.ToLower(r.Registry) != r.Registry {
			t.Fatalf("%q: registry %q", s, r.Registry)
		}
		switch form {
		case formRepository:
			return
		case formTenant:
			if !tenantPattern.MatchString(r.Repository) || r.Tenant() != r.Repository {
				t.Fatalf("%q: tenant %q", s, r.Repository)
			}
			return
		}
		first, _, ok := strings.Cut(r.Repository, "/")
		if !ok || r.Tenant() != first || !tenantPattern.MatchString(first) {
			t.Fatalf("%q: tenant %q of %q", s, r.Tenant(), r.Repository)
		}
		if (r.Tag == "") == (r.Digest == "") {
			t.Fatalf("%q: tag %q and digest %q", s, r.Tag, r.Digest)
		}
		if form == formTag && r.Tag == "" {
			t.Fatalf("%q: tag %q accepted for writing", s, r.Tag)
		}
		n, err := c.toName(r)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if n.Context().RegistryStr() != r.Registry || n.Context().RepositoryStr() != r.Repository {
			t.Fatalf("%q: go-containerregistry reads %s / %s", s, n.Context().RegistryStr(), n.Context().RepositoryStr())
		}
		if tenant, err := Tenant(n.Context()); err != nil || tenant != first {
			t.Fatalf("%q: Tenant = %q, %v", s, tenant, err)
		}
	})
}
