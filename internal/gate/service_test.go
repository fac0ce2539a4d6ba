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
	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
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
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 4<<20, 5), containerdisk.Options{}, publish.ImportOptions{})
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
	good := e.importDisk(t, "acme/good", disk, containerdisk.Options{}, publish.ImportOptions{})
	if _, err := s.Handle(t.Context(), mustDigest(t, e.host+"/acme/good@"+good)); err != nil {
		t.Fatal(err)
	}
	trust := trusting(t, provider)

	// The same image in another repository, with the good verdict's
	// bundle copied next to it.
	copied := e.importDisk(t, "other/copy", disk, containerdisk.Options{}, publish.ImportOptions{})
	if copied != good {
		t.Fatalf("the same build gave %s and %s", good, copied)
	}
	goodRef := mustDigest(t, e.host+"/acme/good@"+good)
	refs, _, err := e.reg.Referrers(t.Context(), goodRef, api.VerdictArtifactType)
	if err != nil || len(refs) != 1 {
		t.Fatalf("referrers: %v, %v", refs, err)
	}
	_, _, bundle := e.readImage(t, "acme/good", refs[0].Digest.String())
	copyRef := mustDigest(t, e.host+"/other/copy@"+copied)
	raw, _ := e.reg.FetchManifest(t.Context(), copyRef)
	desc := ocispec.Descriptor{MediaType: string(raw.MediaType), Digest: godigest.Digest(raw.Digest), Size: int64(len(raw.Bytes))}
	if _, err := verdict.Attach(t.Context(), e.reg, copyRef, desc, verdict.Artifact{ArtifactType: api.VerdictArtifactType, MediaType: attest.BundleMediaType, Content: bundle}); err != nil {
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
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 4<<20, 7), containerdisk.Options{}, publish.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, handle := range []func() error{
		func() error { _, err := s.Handle(t.Context(), subject); return err },
		func() error { _, err := s.Handle(t.Context(), subject); return err },
		func() error { return s.recheck(t.Context(), subject, "", "") },
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
	refs, _, err := e.reg.Referrers(t.Context(), subject, api.VerdictArtifactType)
	if err != nil || len(refs) != 1 {
		t.Errorf("%d verdicts attached (%v); want one", len(refs), err)
	}
	for blob, n := range counter.reads {
		if n > 1 {
			t.Errorf("blob %s read %d times", blob, n)
		}
	}
}

// requestLog counts the HTTP requests a registry client sends, by method
// and path (registry.WithRequestObserver).
type requestLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *requestLog) observe(method, path string, _ int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = map[string]int{}
	}
	l.n[method+" "+path]++
}

// count is how many requests of method went to path, then forgets them.
func (l *requestLog) count(method, path string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.n[method+" "+path]
	delete(l.n, method+" "+path)
	return n
}

// observedService is e.service with a registry client of its own whose
// requests log counts.
func (e *env) observedService(t *testing.T, signer *attest.Signer) (*Service, *requestLog) {
	t.Helper()
	log := &requestLog{}
	c, err := registry.New(registry.WithCacheDir(t.TempDir()), registry.WithRequestObserver(log.observe))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := e.service(t, signer)
	s.Registry, s.Verifier.Registry = c, c
	return s, log
}

// TestTheSubjectsManifestIsFetchedOnce: giving a verdict fetches the
// subject's manifest once, for the verification and the verdict that
// names it alike; a manifest that is not the subject's gives no verdict.
func TestTheSubjectsManifestIsFetchedOnce(t *testing.T) {
	e := newEnv(t)
	s, log := e.observedService(t, newSigner(t))
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 2<<20, 21), containerdisk.Options{}, publish.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	if v, err := s.Handle(t.Context(), subject); err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("%+v, %v", v, err)
	}
	if n := log.count("GET", "/v2/acme/rhel/manifests/"+d); n != 1 {
		t.Errorf("the subject's manifest was fetched %d times; want once", n)
	}

	other := e.importDisk(t, "acme/rhel", rawDisk(t, 1<<20, 22), containerdisk.Options{}, publish.ImportOptions{})
	raw, err := e.reg.FetchManifest(t.Context(), mustDigest(t, e.host+"/acme/rhel@"+other))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := e.v.VerifyManifest(t.Context(), subject, raw); err == nil {
		t.Errorf("another image's manifest gave the verdict %+v; want an error", v)
	}
}

// TestARecheckLooksForTheVerdictOnce: a subject refused for want of a
// signature is looked at again, through an attachment's event and through
// the poller's Recheck, with one look for its verdict each time: the
// verdict's manifest is fetched once per recheck.
func TestARecheckLooksForTheVerdictOnce(t *testing.T) {
	e := newEnv(t)
	s, log := e.observedService(t, newSigner(t))
	s.TenantKeys = writeTenantKeys(t, map[string]*attest.Signer{"acme": newSigner(t)})
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 1<<20, 23), containerdisk.Options{}, publish.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	if v, err := s.Handle(t.Context(), subject); err != nil || v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(reject.Unsigned) {
		t.Fatalf("%+v, %v; want refused, unsigned", v, err)
	}
	refs, _, err := e.reg.Referrers(t.Context(), subject, api.VerdictArtifactType)
	if err != nil || len(refs) != 1 {
		t.Fatalf("%d verdicts attached (%v); want one", len(refs), err)
	}
	verdictManifest := "/v2/acme/rhel/manifests/" + refs[0].Digest.String()
	log.count("GET", verdictManifest)
	s.Add([]intake.Event{{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "sha256-" + strings.TrimPrefix(d, "sha256:")}})
	s.runQueued(t)
	if n := log.count("GET", verdictManifest); n != 1 {
		t.Errorf("a recheck brought by an attachment fetched the verdict %d times; want once", n)
	}
	s.Recheck()
	s.runQueued(t)
	if n := log.count("GET", verdictManifest); n != 1 {
		t.Errorf("the poller's recheck fetched the verdict %d times; want once", n)
	}
	if got := s.awaiting.list(); len(got) != 1 {
		t.Errorf("awaiting a signature: %v; want the subject", got)
	}
}

// TestTheGatesOwnReferrersTagBringsNoLook: on a registry without the
// referrers API, attaching a verdict pushes the subject's referrers tag;
// its announcement, at the index the gate read back with the verdict in
// it, brings no look for the verdict, now or on the looks again that a
// referrers tag's push schedules. The same tag pushed at another index (a
// tenant's signature) is looked at as before.
func TestTheGatesOwnReferrersTagBringsNoLook(t *testing.T) {
	e := newEnv(t)
	s, log := e.observedService(t, newSigner(t))
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 1<<20, 24), containerdisk.Options{}, publish.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	if v, err := s.Handle(t.Context(), subject); err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("%+v, %v", v, err)
	}
	tag := "sha256-" + strings.TrimPrefix(d, "sha256:")
	index, found, err := e.reg.Resolve(t.Context(), disktest.MustTag(t, e.host+"/acme/rhel:"+tag))
	if err != nil || !found {
		t.Fatalf("the referrers tag: %v, %v; want the index the gate pushed", found, err)
	}
	refs, _, err := e.reg.Referrers(t.Context(), subject, api.VerdictArtifactType)
	if err != nil || len(refs) != 1 {
		t.Fatalf("%d verdicts attached (%v); want one", len(refs), err)
	}
	verdictManifest := "/v2/acme/rhel/manifests/" + refs[0].Digest.String()
	log.count("GET", "/v2/acme/rhel/manifests/"+tag)
	log.count("GET", verdictManifest)

	pushed := intake.Event{Action: intake.ActionPush, Repository: "acme/rhel", Tag: tag, Digest: index}
	s.Add([]intake.Event{pushed})
	s.runQueued(t)
	// The looks again that the push scheduled, queued without waiting.
	for range recheckAgain {
		s.queue.add("acme", work{repo: "acme/rhel", recheck: d, index: index})
		s.runQueued(t)
	}
	if n, m := log.count("GET", "/v2/acme/rhel/manifests/"+tag), log.count("GET", verdictManifest); n != 0 || m != 0 {
		t.Errorf("the gate's own referrers tag brought %d listings and %d reads of the verdict; want none", n, m)
	}

	pushed.Digest = "sha256:" + strings.Repeat("0", 64)
	s.Add([]intake.Event{pushed})
	s.runQueued(t)
	if n, m := log.count("GET", "/v2/acme/rhel/manifests/"+tag), log.count("GET", verdictManifest); n != 1 || m != 1 {
		t.Errorf("the referrers tag at another index brought %d listings and %d reads of the verdict; want one look", n, m)
	}
}
