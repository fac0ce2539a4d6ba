package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
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
	got := g.expected[subject.String()].referrers
	want := []string{fmt.Sprintf("sha256:%064d", 6), fmt.Sprintf("sha256:%064d", 7), fmt.Sprintf("sha256:%064d", 8), fmt.Sprintf("sha256:%064d", 9)}
	if !slices.Equal(got, want) {
		t.Errorf("kept %v, want the newest %v", got, want)
	}
}

// noReferrers is a registry that lists no referrers and holds every
// manifest asked for by digest (whose check then fails).
type noReferrers struct{}

func (noReferrers) Referrers(context.Context, name.Digest, string) ([]v1.Descriptor, error) {
	return nil, nil
}

// noReferrersBundle is the one blob of every artifact noReferrers holds.
var noReferrersBundle = []byte("{}")

func (noReferrers) FetchManifest(_ context.Context, ref name.Reference) (*registry.RawManifest, error) {
	m, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: api.VerdictArtifactType, Config: ocispec.DescriptorEmptyJSON,
		Layers: []ocispec.Descriptor{{MediaType: attest.BundleMediaType, Digest: digest.FromBytes(noReferrersBundle), Size: int64(len(noReferrersBundle))}},
	})
	if err != nil {
		return nil, err
	}
	return &registry.RawManifest{Digest: digest.FromBytes(m).String(), MediaType: ocispec.MediaTypeImageManifest, Bytes: m}, nil
}

func (noReferrers) OpenBlob(context.Context, name.Repository, string) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(noReferrersBundle)), nil
}

func (noReferrers) AttachArtifact(context.Context, name.Digest, ocispec.Descriptor, registry.Artifact) (string, error) {
	return "", fmt.Errorf("read-only")
}

// trustsNothing refuses every bundle.
type trustsNothing struct{}

func (trustsNothing) Verify([]byte, string, string) (*attest.Verified, error) {
	return nil, fmt.Errorf("not signed by a trusted key")
}

// An announced referrer is read for expectHold, whatever the looks in
// between answered: distribution announces the push of a referrers tag
// before the tag moves, and the look that announcement starts must still
// read the verdict the registry does not list yet.
func TestAnnouncedReferrersOutliveAnAnswer(t *testing.T) {
	subject, err := name.NewDigest("registry.example/acme/rhel@sha256:" + fmt.Sprintf("%064d", 1))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	g := NewGateVerdicts(noReferrers{}, trustsNothing{})
	g.now = func() time.Time { return now }
	g.Expect(subject, fmt.Sprintf("sha256:%064d", 2))
	for range 2 {
		if _, err := g.Verdict(t.Context(), subject); err == nil {
			t.Fatal("a verdict found in a registry that holds none")
		}
		g.Forget(subject)
		if len(g.expected[subject.String()].referrers) != 1 {
			t.Fatalf("the announced referrer was dropped after an answer within %s", expectHold)
		}
	}
	now = now.Add(expectHold + time.Second)
	_, _ = g.Verdict(t.Context(), subject)
	if _, kept := g.expected[subject.String()]; kept {
		t.Errorf("the announced referrer is still read %s after its announcement", expectHold+time.Second)
	}
}
