package hub

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	godigest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	orasremote "oras.land/oras-go/v2/registry/remote"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/trust"
	"github.com/imagepipe/imagepipe/internal/verdict"
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
		g.Expect(subject, &registry.RawManifest{Digest: fmt.Sprintf("sha256:%064d", i)})
	}
	var got []string
	for _, r := range g.expected[subject.String()].referrers {
		got = append(got, r.Digest)
	}
	want := []string{fmt.Sprintf("sha256:%064d", 6), fmt.Sprintf("sha256:%064d", 7), fmt.Sprintf("sha256:%064d", 8), fmt.Sprintf("sha256:%064d", 9)}
	if !slices.Equal(got, want) {
		t.Errorf("kept %v, want the newest %v", got, want)
	}
}

// TestAnAnnouncedVerdictIsFetchedOnce: the verdict whose push woke a
// hub, its manifest read by the hub to learn its subject, is read from
// that manifest by the look-up: the manifest is fetched once, and its
// bundle is still verified (a verdict the key did not sign admits
// nothing). Bytes that are not the manifest's are not read: the manifest
// is fetched by its digest instead.
func TestAnAnnouncedVerdictIsFetchedOnce(t *testing.T) {
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	var mu sync.Mutex
	gets := map[string]int{}
	c, err := registry.New(registry.WithCacheDir(t.TempDir()), registry.WithRequestObserver(func(method, path string, _ int) {
		mu.Lock()
		defer mu.Unlock()
		if method == "GET" {
			gets[path]++
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	signer, other := newSigner(t), newSigner(t)
	trust, err := trust.NewVerifier([]crypto.PublicKey{signer.Public()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		signer *attest.Signer
		found  bool
		// tamper gives the look-up other bytes than the manifest's, which
		// it must not read: it fetches the manifest by its digest.
		tamper bool
	}{
		{name: "signed by the provider", signer: signer, found: true},
		{name: "signed by another key", signer: other},
		{name: "announced with other bytes", signer: signer, found: true, tamper: true},
	} {
		subject, desc := disktest.PushRandomSubject(t, host+"/acme/rhel")
		given := &api.Verdict{Repository: "acme/rhel", Subject: subject.DigestStr(), Verdict: api.VerdictAccepted, VerifiedAt: time.Now().UTC().Format(api.VerdictTimeFormat),
			Images: []api.VerifiedImage{{Platform: "linux/amd64", Source: subject.DigestStr(), Canonical: subject.DigestStr()}}}
		att, err := verdict.Publish(t.Context(), c, tc.signer, subject, desc, given)
		if err != nil {
			t.Fatal(err)
		}
		manifest := "/v2/acme/rhel/manifests/" + att.Digest
		announced, err := c.FetchManifest(t.Context(), subject.Context().Digest(att.Digest)) // the Applier's read
		if err != nil {
			t.Fatal(err)
		}
		if tc.tamper { // the subject's manifest, announced as the verdict's
			raw, err := c.FetchManifest(t.Context(), subject)
			if err != nil {
				t.Fatal(err)
			}
			announced.Bytes = raw.Bytes
		}
		mu.Lock()
		clear(gets)
		mu.Unlock()
		g := NewGateVerdicts(c, trust)
		g.Expect(subject, announced)
		v, err := g.Verdict(t.Context(), subject)
		if tc.found != (err == nil) || tc.found && v.Subject != subject.DigestStr() {
			t.Errorf("%s: %+v, %v", tc.name, v, err)
		}
		want := 0
		if tc.tamper {
			want = 1
		}
		mu.Lock()
		if gets[manifest] != want {
			t.Errorf("%s: the look-up fetched the announced verdict's manifest %d times; want %d", tc.name, gets[manifest], want)
		}
		mu.Unlock()
	}
}

func newSigner(t *testing.T) *attest.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := attest.NewSigner(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// noReferrers is a registry that lists no referrers and holds every
// manifest asked for by digest (whose check then fails).
type noReferrers struct{}

func (noReferrers) Referrers(context.Context, name.Digest, string) ([]v1.Descriptor, string, error) {
	return nil, "", nil
}

// noReferrersBundle is the one blob of every artifact noReferrers holds.
var noReferrersBundle = []byte("{}")

func (noReferrers) FetchManifest(_ context.Context, ref name.Reference) (*registry.RawManifest, error) {
	m, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		ArtifactType: api.VerdictArtifactType, Config: ocispec.DescriptorEmptyJSON,
		Layers: []ocispec.Descriptor{{MediaType: attest.BundleMediaType, Digest: godigest.FromBytes(noReferrersBundle), Size: int64(len(noReferrersBundle))}},
	})
	if err != nil {
		return nil, err
	}
	return &registry.RawManifest{Digest: godigest.FromBytes(m).String(), MediaType: ocispec.MediaTypeImageManifest, Bytes: m}, nil
}

func (noReferrers) OpenBlob(context.Context, name.Repository, string) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(noReferrersBundle)), nil
}

func (noReferrers) ORASRepository(context.Context, name.Repository) (*orasremote.Repository, error) {
	return nil, fmt.Errorf("read-only")
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
	g.Expect(subject, &registry.RawManifest{Digest: fmt.Sprintf("sha256:%064d", 2)})
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
