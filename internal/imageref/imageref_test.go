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

func TestParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		form Form
		want Ref
	}{
		{"registry.example.com/acme/rhel:10", FormImage, Ref{"registry.example.com", "acme/rhel", "10", ""}},
		{"127.0.0.1:5000/acme/team/rhel:v1.0_rc-2", FormTag, Ref{"127.0.0.1:5000", "acme/team/rhel", "v1.0_rc-2", ""}},
		{"localhost/acme/rhel@" + testDigest, FormImage, Ref{"localhost", "acme/rhel", "", testDigest}},
		{"[::1]:5000/acme/a.b/c__d/e---f:_x", FormImage, Ref{"[::1]:5000", "acme/a.b/c__d/e---f", "_x", ""}},
		{"reg.example.com/acme/x@" + testDigest, FormImage, Ref{"reg.example.com", "acme/x", "", testDigest}},
		{"reg.example.com/provider-templates", FormRepository, Ref{"reg.example.com", "provider-templates", "", ""}},
		{"reg.example.com/acme", FormTenant, Ref{"reg.example.com", "acme", "", ""}},
		{"reg.example.com/acme/x:" + strings.Repeat("t", 128), FormTag, Ref{"reg.example.com", "acme/x", strings.Repeat("t", 128), ""}},
		{"reg.example.com:5000", FormRegistry, Ref{Registry: "reg.example.com:5000"}},
	} {
		got, err := Parse(tc.in, tc.form)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if got.String() != tc.in {
			t.Errorf("Parse(%q).String() = %q", tc.in, got.String())
		}
	}
	// What FormTenant and FormRegistry drop.
	for in, want := range map[string]Ref{
		"127.0.0.1:5000/acme/":     {Registry: "127.0.0.1:5000", Repository: "acme"},
		"https://reg.example.com/": {Registry: "reg.example.com"},
		"http://[::1]:5000":        {Registry: "[::1]:5000"},
	} {
		form := FormTenant
		if !strings.HasSuffix(in, "acme/") {
			form = FormRegistry
		}
		if got, err := Parse(in, form); err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

// TestParseRefuses lists references outside the grammar (or outside
// what a command may write) with the part the message must name and a
// word of the sentence. Several of them go-containerregistry accepts;
// the test checks which, so that it shows why parseRef exists.
func TestParseRefuses(t *testing.T) {
	long := strings.Repeat("a", 250)
	for _, tc := range []struct {
		in       string
		form     Form
		part     string
		says     string
		ggcrTake bool // go-containerregistry (strict) accepts it
	}{
		{"reg.example.com/acme/../globex/evil:1", FormTag, "repository", `".." of the repository is a relative path step`, true},
		{"reg.example.com/acme/./evil:1", FormTag, "repository", "relative path step", true},
		{"reg.example.com/acme/%2e%2e/globex/evil:1", FormTag, "repository", "OCI name grammar", false},
		{`reg.example.com/acme/..\globex:1`, FormTag, "repository", "OCI name grammar", false},
		{"reg.example.com/acme/evil?x=1:1", FormTag, "repository", "OCI name grammar", false},
		{"user@reg.example.com/acme/evil:1", FormTag, "digest", "64 lower-case", false},
		{"reg.example.com/acme//evil:1", FormTag, "repository", "empty path component", true},
		{"reg.example.com/acme/evil/:1", FormTag, "repository", "empty path component", true},
		{"reg.example.com//acme/evil:1", FormTag, "repository", "empty path component", true},
		{"reg.example.com/acme/Evil:1", FormTag, "repository", "upper-case", false},
		{"reg.example.com/acme/a..b:1", FormTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/a._b:1", FormTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/a___b:1", FormTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/-a:1", FormTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/a-:1", FormTag, "repository", "OCI name grammar", true},
		{"reg.example.com/acme/_a:1", FormTag, "repository", "OCI name grammar", true},
		{"reg.example.com/ac_me/x:1", FormTag, "tenant", "not a valid name", true},
		{"reg.example.com/a.cme/x:1", FormTag, "tenant", "not a valid name", true},
		{"reg.example.com/x:1", FormTag, "tenant", "no tenant", true},
		{"acme/rhel:1", FormTag, "registry host", "no registry host", false},
		{"registry/acme/rhel:1", FormTag, "registry host", "no registry host", false},
		{"Reg.Example.com/acme/rhel:1", FormTag, "registry host", "upper-case", true},
		{"reg..example.com/acme/rhel:1", FormTag, "registry host", "label", true},
		{"-reg.example.com/acme/rhel:1", FormTag, "registry host", "label", true},
		{"reg.example.com:0/acme/rhel:1", FormTag, "registry host", "port", true},
		{"reg.example.com:05000/acme/rhel:1", FormTag, "registry host", "leading zeros", true},
		{"reg.example.com:99999/acme/rhel:1", FormTag, "registry host", "port", true},
		{"reg.example.com:/acme/rhel:1", FormTag, "registry host", "empty port", true},
		{"[::1/acme/rhel:1", FormTag, "registry host", "unclosed", false},
		{"[zz]:5000/acme/rhel:1", FormTag, "registry host", "IPv6", false},
		{"https://reg.example.com/acme/rhel:1", FormTag, "reference", "URL scheme", false},
		{"reg.example.com/acme/rhel", FormTag, "tag", "no tag", false},
		{"reg.example.com/acme/rhel", FormImage, "tag", "neither a tag nor a digest", false},
		{"reg.example.com/acme/rhel:", FormImage, "tag", "empty", false},
		{"reg.example.com/acme/rhel:.x", FormImage, "tag", "starting with", true},
		{"reg.example.com/acme/rhel:-x", FormImage, "tag", "starting with", true},
		{"reg.example.com/acme/rhel:a+b", FormImage, "tag", "starting with", false},
		{"reg.example.com/acme/rhel:" + strings.Repeat("t", 129), FormImage, "tag", "limit is 128", false},
		{"reg.example.com/acme/rhel@sha256:abc", FormImage, "digest", "64 lower-case", false},
		{"reg.example.com/acme/rhel@sha512:" + strings.Repeat("a", 128), FormImage, "digest", "only sha256", true},
		{"reg.example.com/acme/rhel@" + strings.ToUpper(testDigest), FormImage, "digest", "64 lower-case", false},
		{"reg.example.com/acme/rhel:1@" + testDigest, FormImage, "reference", "both a tag and a digest", true},
		{"reg.example.com/acme/rhel@" + testDigest, FormTag, "digest", "writes a tag", true},
		{"reg.example.com/acme/rhel:1\n", FormImage, "reference", "printable ASCII", false},
		{"reg.example.com/acme/rh el:1", FormImage, "reference", "printable ASCII", false},
		{"reg.example.com/acme/rhél:1", FormImage, "reference", "printable ASCII", false},
		{"", FormImage, "reference", "empty", false},
		{"reg.example.com/acme/" + long + ":1", FormImage, "repository", "limit is 255", true},
		{"reg.example.com/acme/x", FormTenant, "tenant", "not a tenant", false},
		{"reg.example.com/Acme", FormTenant, "repository", "upper-case", false},
		{"reg.example.com/a_b", FormTenant, "tenant", "not a valid name", false},
		{"reg.example.com/cat:1", FormRepository, "repository", "tag or a digest", false},
		{"reg.example.com/acme//", FormTenant, "repository", "empty path component", false},
		{"reg.example.com/acme", FormRegistry, "registry host", "names a repository", false},
		{"https://Reg.example.com", FormRegistry, "registry host", "upper-case", false},
		{"reg.example.com:0", FormRegistry, "registry host", "port", false},
		{"", FormRegistry, "registry host", "label", false},
	} {
		_, err := Parse(tc.in, tc.form)
		re := AsReferenceError(err)
		input := tc.in
		if tc.form == FormTenant {
			input = strings.TrimSuffix(input, "/")
		}
		if re == nil || re.Part != tc.part || !strings.Contains(re.Rule, tc.says) || re.Input != input {
			t.Errorf("Parse(%q) = %v; want a %s error saying %q", tc.in, err, tc.part, tc.says)
		}
		if tc.form == FormTag || tc.form == FormImage {
			_, gerr := name.ParseReference(tc.in, name.StrictValidation)
			if (gerr == nil) != tc.ggcrTake {
				t.Errorf("go-containerregistry on %q: %v; the test expected accepted=%v", tc.in, gerr, tc.ggcrTake)
			}
		}
	}
}

// mustReference parses s in FormImage and converts it with c.
func mustReference(t *testing.T, c *Client, s string) name.Reference {
	t.Helper()
	r, err := Parse(s, FormImage)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Reference(r)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestClientNames checks the conversions to go-containerregistry's
// names: values that say the same as the input, and the client's
// WithInsecure carried into them.
func TestClientNames(t *testing.T) {
	c := testClient(t)
	mustParse := func(s string, form Form) Ref {
		t.Helper()
		r, err := Parse(s, form)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r, err := c.Reference(mustParse("reg.example.com/acme/team/rhel:10", FormImage))
	if err != nil || r.Context().RepositoryStr() != "acme/team/rhel" || r.Identifier() != "10" || r.Context().RegistryStr() != "reg.example.com" {
		t.Errorf("Reference: %v, %v", r, err)
	}
	if tag, err := c.Reference(mustParse("127.0.0.1:5000/acme/rhel:10", FormTag)); err != nil || tag.(name.Tag).TagStr() != "10" {
		t.Errorf("Reference of a tag: %v, %v", tag, err)
	}
	if d, err := c.Reference(mustParse("127.0.0.1:5000/acme/rhel@"+testDigest, FormImage)); err != nil || d.(name.Digest).DigestStr() != testDigest {
		t.Errorf("Reference of a digest: %v, %v", d, err)
	}
	tenant := mustParse("127.0.0.1:5000/acme/", FormTenant)
	if reg, err := c.Registry(tenant); err != nil || tenant.Repository != "acme" || reg.RegistryStr() != "127.0.0.1:5000" {
		t.Errorf("Registry: %v %+v %v", reg, tenant, err)
	}
	if repo, err := c.Repository(mustParse("reg.example.com/provider-templates", FormRepository)); err != nil || repo.RepositoryStr() != "provider-templates" {
		t.Errorf("Repository: %v, %v", repo, err)
	}
	// go-containerregistry refuses Docker Hub repositories without a
	// namespace under StrictValidation, and so does Repository.
	if _, err := c.Repository(mustParse("index.docker.io/provider-templates", FormRepository)); err == nil {
		t.Error("Repository of index.docker.io/provider-templates: no error")
	}
	// Plain HTTP only where the client allows it.
	insecure := testClient(t, WithInsecure(true))
	host := mustParse("reg.example.com", FormRegistry)
	for _, tc := range []struct {
		c    *Client
		want string
	}{{c, "https"}, {insecure, "http"}} {
		reg, err := tc.c.Registry(host)
		if err != nil || reg.Scheme() != tc.want {
			t.Errorf("Registry(%v).Scheme() = %q, %v; want %q", host, reg.Scheme(), err, tc.want)
		}
		n, err := tc.c.Reference(mustParse("reg.example.com/acme/x:1", FormTag))
		if err != nil || n.Context().Scheme() != tc.want {
			t.Errorf("Reference: scheme %q, %v; want %q", n.Context().Scheme(), err, tc.want)
		}
		repo, err := tc.c.Repository(mustParse("reg.example.com/provider-templates", FormRepository))
		if err != nil || repo.Scheme() != tc.want {
			t.Errorf("Repository: scheme %q, %v; want %q", repo.Scheme(), err, tc.want)
		}
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
		form := Form(formByte % 4) // FormRegistry has its own parser
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
		if len(r.Registry)+1+len(r.Repository) > maxNameLength {
			t.Fatalf("%q: name longer than %d", s, maxNameLength)
		}
		if r.Registry == "" || strings.ToLower(r.Registry) != r.Registry {
			t.Fatalf("%q: registry %q", s, r.Registry)
		}
		switch form {
		case FormRepository:
			return
		case FormTenant:
			if !tenantPattern.MatchString(r.Repository) || tenantOf(r.Repository) != r.Repository {
				t.Fatalf("%q: tenant %q", s, r.Repository)
			}
			return
		}
		first, _, ok := strings.Cut(r.Repository, "/")
		if !ok || tenantOf(r.Repository) != first || !tenantPattern.MatchString(first) {
			t.Fatalf("%q: tenant %q of %q", s, tenantOf(r.Repository), r.Repository)
		}
		if (r.Tag == "") == (r.Digest == "") {
			t.Fatalf("%q: tag %q and digest %q", s, r.Tag, r.Digest)
		}
		if form == FormTag && r.Tag == "" {
			t.Fatalf("%q: tag %q accepted for writing", s, r.Tag)
		}
		n, err := c.Reference(r)
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
