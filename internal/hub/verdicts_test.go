package hub

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
)

// Anyone with push access can attach manifests to a digest: a flood of
// them must not push out the newest, which is the gate's verdict just
// announced.
func TestExpectKeepsTheNewestReferrers(t *testing.T) {
	subject, err := name.NewDigest("registry.example/acme/rhel@sha256:" + fmt.Sprintf("%064d", 1))
	if err != nil {
		t.Fatal(err)
	}
	g := NewGateVerdicts(nil, nil)
	for i := range 10 {
		g.Expect(subject, fmt.Sprintf("sha256:%064d", i))
	}
	got := g.expected[subject.String()]
	want := []string{fmt.Sprintf("sha256:%064d", 6), fmt.Sprintf("sha256:%064d", 7), fmt.Sprintf("sha256:%064d", 8), fmt.Sprintf("sha256:%064d", 9)}
	if !slices.Equal(got, want) {
		t.Errorf("kept %v, want the newest %v", got, want)
	}
}
