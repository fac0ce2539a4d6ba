package imageref

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
	long := strings.Repeat("a", 251)
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
		{"reg.example.com/acme/" + long + ":1", FormImage, "repository", "limit is 255", false},
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
		re := AsError(err)
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

// FuzzParseReference: whatever parseRef accepts is inside the OCI
// grammar (an independent regexp), has no "." or ".." component, has the
// first path component as its tenant, prints back to its input, parses
// again to the same value, and gives the same tenant to Tenant.
func FuzzParseReference(f *testing.F) {
	for _, s := range []string{
		"reg.example.com/acme/rhel:10", "127.0.0.1:5000/acme/a/b:1", "[::1]:5000/acme/x@" + testDigest,
		"reg.example.com/acme/../globex/evil:1", "localhost/acme/x:y", "reg:5000/acme/a__b.c-d:_",
		"reg.example.com/acme/x:1@" + testDigest, "Reg.example.com/acme/x:1",
	} {
		f.Add(s, uint8(0))
	}
	f.Fuzz(func(t *testing.T, s string, formByte uint8) {
		form := Form(formByte % 4) // FormRegistry has its own parser
		r, err := parseRef(s, form)
		if err != nil {
			if AsError(err) == nil {
				t.Fatalf("parseRef(%q) error is not a *Error: %v", s, err)
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
		if len(r.Repository) > maxNameLength {
			t.Fatalf("%q: name longer than %d", s, maxNameLength)
		}
		if r.Registry == "" || strings.ToLower(r.Registry) != r.Registry {
			t.Fatalf("%q: registry %q", s, r.Registry)
		}
		switch form {
		case FormRepository:
			return
		case FormTenant:
			if !isTenant(r.Repository) || tenantOf(r.Repository) != r.Repository {
				t.Fatalf("%q: tenant %q", s, r.Repository)
			}
			return
		}
		first, _, ok := strings.Cut(r.Repository, "/")
		if !ok || tenantOf(r.Repository) != first || !isTenant(first) {
			t.Fatalf("%q: tenant %q of %q", s, tenantOf(r.Repository), r.Repository)
		}
		if (r.Tag == "") == (r.Digest == "") {
			t.Fatalf("%q: tag %q and digest %q", s, r.Tag, r.Digest)
		}
		if form == FormTag && r.Tag == "" {
			t.Fatalf("%q: tag %q accepted for writing", s, r.Tag)
		}
		if tenant, err := Tenant(r.Repository); err != nil || tenant != first {
			t.Fatalf("%q: Tenant = %q, %v", s, tenant, err)
		}
	})
}
