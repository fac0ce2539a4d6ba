package gate

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	godigest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/trust"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// blobCounter counts the blob reads of a registry client: the verifier's
// (the service's own registry reads verdicts' bundles through Client).
type blobCounter struct {
	*registry.Client
	mu    sync.Mutex
	reads map[string]int
}

func (b *blobCounter) OpenBlob(ctx context.Context, repo name.Repository, d string) (io.ReadCloser, error) {
	b.mu.Lock()
	b.reads[d]++
	b.mu.Unlock()
	return b.Client.OpenBlob(ctx, repo, d)
}

func newSigner(t *testing.T) *attest.Signer {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	s, err := attest.NewSigner(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func trusting(t *testing.T, signers ...*attest.Signer) *trust.Verifier {
	t.Helper()
	var keys []crypto.PublicKey
	for _, s := range signers {
		keys = append(keys, s.Public())
	}
	v, err := trust.NewVerifier(keys)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (e *env) service(t *testing.T, signer *attest.Signer) (*Service, *blobCounter) {
	t.Helper()
	counter := &blobCounter{Client: e.reg, reads: map[string]int{}}
	v := Verifier{Registry: counter, TempDir: e.v.TempDir, Engine: e.v.Engine, Version: e.v.Version}
	reg, _ := name.NewRegistry(e.host)
	return &Service{Verifier: &v, Registry: counter.Client, RegistryName: reg, Signer: signer, Trust: trusting(t, signer)}, counter
}

// TestServiceGivesOneVerdictPerDigest: the verdict is signed, attached
// and found by a hub that trusts the key; asking again reads no layer.
func TestServiceGivesOneVerdictPerDigest(t *testing.T) {
	e := newEnv(t)
	signer := newSigner(t)
	s, counter := e.service(t, signer)
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 4<<20, 5), containerdisk.Options{}, registry.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	v, err := s.Handle(t.Context(), subject)
	if err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("%+v, %v", v, err)
	}
	reads := len(counter.reads)
	if _, err := s.Handle(t.Context(), subject); err != nil {
		t.Fatal(err)
	}
	if len(counter.reads) != reads {
		t.Errorf("the second look read blobs again: %v", counter.reads)
	}
	got, err := verdict.Find(t.Context(), e.reg, trusting(t, signer), subject)
	if err != nil || got.Images[0].Canonical != d {
		t.Errorf("a hub finds %+v, %v", got, err)
	}
}

// TestVerdictsThatProveNothing: a verdict signed by another key, one
// about another digest, and one copied from another repository are not
// trusted by a hub, and a forged one does not stop the gate from giving
// the real verdict.
func TestVerdictsThatProveNothing(t *testing.T) {
	e := newEnv(t)
	provider, tenant := newSigner(t), newSigner(t)
	s, _ := e.service(t, provider)
	disk := rawDisk(t, 2<<20, 6)
	good := e.importDisk(t, "acme/good", disk, containerdisk.Options{}, registry.ImportOptions{})
	if _, err := s.Handle(t.Context(), mustDigest(t, e.host+"/acme/good@"+good)); err != nil {
		t.Fatal(err)
	}
	trust := trusting(t, provider)

	// The same image in another repository, with the good verdict's
	// bundle copied next to it.
	copied := e.importDisk(t, "other/copy", disk, containerdisk.Options{}, registry.ImportOptions{})
	if copied != good {
		t.Fatalf("the same build gave %s and %s", good, copied)
	}
	goodRef := mustDigest(t, e.host+"/acme/good@"+good)
	refs, err := e.reg.Referrers(t.Context(), goodRef, api.VerdictArtifactType)
	if err != nil || len(refs) != 1 {
		t.Fatalf("referrers: %v, %v", refs, err)
	}
	_, _, bundle := e.readImage(t, "acme/good", refs[0].Digest.String())
	copyRef := mustDigest(t, e.host+"/other/copy@"+copied)
	raw, _ := e.reg.FetchManifest(t.Context(), copyRef)
	desc := ocispec.Descriptor{MediaType: string(raw.MediaType), Digest: godigest.Digest(raw.Digest), Size: int64(len(raw.Bytes))}
	if _, err := e.reg.AttachArtifact(t.Context(), copyRef, desc, registry.Artifact{ArtifactType: api.VerdictArtifactType, MediaType: attest.BundleMediaType, Content: bundle}); err != nil {
		t.Fatal(err)
	}
	// A verdict the tenant signed for a rejected image of its own.
	bad := craftImage(t, amplifier()).push(t, e, "acme/bad")
	badRef := mustDigest(t, e.host+"/acme/bad@"+bad)
	raw, _ = e.reg.FetchManifest(t.Context(), badRef)
	forged := &api.Verdict{Repository: "acme/bad", Subject: bad, Verdict: api.VerdictAccepted, VerifiedAt: "2099-01-01T00:00:00Z",
		Images: []api.VerifiedImage{{Platform: "linux/amd64", Source: bad, Canonical: bad, Format: "qcow2", VirtualSize: 512 << 20}}}
	if _, err := verdict.Publish(t.Context(), e.reg, tenant, badRef, ocispec.Descriptor{MediaType: string(raw.MediaType), Digest: godigest.Digest(raw.Digest), Size: int64(len(raw.Bytes))}, forged); err != nil {
		t.Fatal(err)
	}

	for name, ref := range map[string]name.Digest{"copied from acme/good": copyRef, "signed by the tenant": badRef} {
		_, err := verdict.Find(t.Context(), e.reg, trust, ref)
		var nv *verdict.NoVerdictError
		if !errors.As(err, &nv) || !nv.Forged() {
			t.Errorf("%s: %v; want a refused verdict", name, err)
		}
	}
	// The gate is not fooled either: it verifies and rejects.
	v, err := s.Handle(t.Context(), badRef)
	if err != nil || v.Verdict != api.VerdictRejected || v.Reasons[0].Code != "shared-cluster" {
		t.Errorf("the gate on the forged image: %+v, %v", v, err)
	}
	if v, err := verdict.Find(t.Context(), e.reg, trust, badRef); err != nil || v.Verdict != api.VerdictRejected {
		t.Errorf("a hub on the forged image: %+v, %v", v, err)
	}
}

// panicky is a registry whose look-ups panic, as a bug would.
type panicky struct{ *registry.Client }

func (panicky) Resolve(context.Context, name.Tag) (string, bool, error) { panic("a bug") }

// TestPanicIsAnErrorNotACrash: a panic while one image is handled is that
// image's error, retried later; the process and the other work go on.
func TestPanicIsAnErrorNotACrash(t *testing.T) {
	e := newEnv(t)
	reg, _ := name.NewRegistry(e.host)
	s := &Service{Verifier: e.v, Registry: panicky{e.reg}, RegistryName: reg, Signer: newSigner(t)}
	s.init()
	err := s.handleSafely(t.Context(), work{repo: "acme/rhel", tag: "1"})
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("a panicking look-up: %v; want an error", err)
	}
}

// TestOneSubjectIsHandledOnceAtATime: two tags of one digest and the
// recheck an attachment brings, all at once, give one verdict and read the
// layer once; the others wait and find it.
func TestOneSubjectIsHandledOnceAtATime(t *testing.T) {
	e := newEnv(t)
	signer := newSigner(t)
	s, counter := e.service(t, signer)
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 4<<20, 7), containerdisk.Options{}, registry.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, handle := range []func() error{
		func() error { _, err := s.Handle(t.Context(), subject); return err },
		func() error { _, err := s.Handle(t.Context(), subject); return err },
		func() error { return s.recheck(t.Context(), subject, "") },
	} {
		wg.Go(func() {
			<-start
			errs <- handle()
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	refs, err := e.reg.Referrers(t.Context(), subject, api.VerdictArtifactType)
	if err != nil || len(refs) != 1 {
		t.Errorf("%d verdicts attached (%v); want one", len(refs), err)
	}
	for blob, n := range counter.reads {
		if n > 1 {
			t.Errorf("blob %s read %d times", blob, n)
		}
	}
}
