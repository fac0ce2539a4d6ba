package cdi

import (
	"regexp"
	"strings"
	"testing"
)

// Names as the OCI distribution spec and Kubernetes define them.
var (
	repoPattern  = regexp.MustCompile(`^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$`)
	tagPattern   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	dns1123Label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// fuzzName maps raw fuzz bytes onto a small alphabet, so that most inputs
// are valid names and the separators a naive mapping would merge
// (-, ., _, /) come up often.
func fuzzName(raw, alphabet string) string {
	b := make([]byte, len(raw))
	for i := range len(raw) {
		b[i] = alphabet[int(raw[i])%len(alphabet)]
	}
	return string(b)
}

// FuzzNames checks the naming invariants on pairs of (repository, tag) of
// one tenant: BaseImageName is injective over (repository, tag) and
// ImageName over repositories; every name is a DNS-1123 label of at most 63
// characters; a name without a hash is exactly "PATH--TAG". Pairs that are
// not valid OCI names are skipped.
func FuzzNames(f *testing.F) {
	f.Add("rhel", "v1.0", "rhel", "v1-0")
	f.Add("foo", "bar-latest", "foo-bar", "latest")
	f.Add("team/rhel", "9", "team-rhel", "9")
	f.Add(strings.Repeat("a", 80), "1", strings.Repeat("a", 81), "1")
	f.Add("rhel", strings.Repeat("t", 128), "rhel", strings.Repeat("t", 127)+"u")
	f.Fuzz(func(t *testing.T, path1, tag1, path2, tag2 string) {
		const pathAlphabet, tagAlphabet = "ab1-._/", "aB1-._"
		p1, p2 := fuzzName(path1, pathAlphabet), fuzzName(path2, pathAlphabet)
		t1, t2 := fuzzName(tag1, tagAlphabet), fuzzName(tag2, tagAlphabet)
		r1, r2 := "acme/"+p1, "acme/"+p2
		if len(r1) > 255 || len(r2) > 255 || !repoPattern.MatchString(r1) || !repoPattern.MatchString(r2) ||
			!tagPattern.MatchString(t1) || !tagPattern.MatchString(t2) {
			return // not a repository and tag a registry accepts
		}
		for _, rt := range [][2]string{{r1, t1}, {r2, t2}} {
			checkNames(t, rt[0], rt[1])
			n := BaseImageName(rt[0], rt[1])
			if strings.Count(n, "--") == 1 && n != repoPath(rt[0])+"--"+rt[1] {
				t.Fatalf("BaseImageName(%q, %q) = %q: a name with one \"--\" must be PATH--TAG", rt[0], rt[1], n)
			}
		}
		if (r1 != r2 || t1 != t2) && BaseImageName(r1, t1) == BaseImageName(r2, t2) {
			t.Fatalf("%s:%s and %s:%s share the BaseImage name %q", r1, t1, r2, t2, BaseImageName(r1, t1))
		}
		if r1 != r2 && ImageName(r1) == ImageName(r2) {
			t.Fatalf("%s and %s share the image name %q", r1, r2, ImageName(r1))
		}
	})
}

// TestNames pins the naming scheme: simple names stay readable, anything
// else gets a hash, and names that differ only in separators, case or
// length past the limit never share one.
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
	// Each group differs only in separators, case or length past the limit.
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

func TestLabelValueFitsKubernetes(t *testing.T) {
	valuePattern := regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	long := "v1234567890123456789012345678901234567890123456789012345678901234567890"
	for _, tag := range []string{"9", "latest", "_hidden", "v1.2-", long, "a..b", "-"} {
		if got := LabelValue(tag); len(got) > 63 || !valuePattern.MatchString(got) {
			t.Errorf("LabelValue(%q) = %q, not a valid label value", tag, got)
		}
	}
}
