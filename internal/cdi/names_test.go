package cdi

import (
	"strings"
	"testing"
)

// fuzzName maps raw fuzz bytes onto a small alphabet, so that most inputs
// are valid names and the separators that used to collide (-, ., _, /)
// come up often.
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
			t.Skip()
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
