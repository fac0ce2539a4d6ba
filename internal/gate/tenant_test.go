package gate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	godigest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/attest"
	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// writeTenantKeys writes each tenant's key file into a new policy folder.
func writeTenantKeys(t *testing.T, keys map[string]*attest.Signer) *TenantKeys {
	t.Helper()
	dir := t.TempDir()
	for tenant, s := range keys {
		pem, err := attest.MarshalPublicKey(s.Public())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, tenant+".pub"), pem, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &TenantKeys{Dir: dir}
}

// sign attaches signer's signature on subject, as imagectl sign does.
func (e *env) sign(t *testing.T, signer *attest.Signer, subject name.Digest) {
	t.Helper()
	raw, err := e.reg.FetchManifest(t.Context(), subject)
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: string(raw.MediaType), Digest: godigest.Digest(raw.Digest), Size: int64(len(raw.Bytes))}
	if _, err := verdict.Sign(t.Context(), e.reg, signer, subject, desc); err != nil {
		t.Fatal(err)
	}
}

// verdictCount is how many verdicts are attached to subject.
func (e *env) verdictCount(t *testing.T, subject name.Digest) int {
	t.Helper()
	refs, _, err := e.reg.Referrers(t.Context(), subject, "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range refs {
		if r.Annotations[verdict.PredicateTypeAnnotation] == api.VerdictPredicateType {
			n++
		}
	}
	return n
}

// TestTenantSignaturePolicy: a tenant with keys has its images refused
// (unsigned, then untrusted-signature for another tenant's key) without
// its layer being read, and accepted once its own key signed them; the
// signature's push, announced as any client's would be, brings the new
// verdict, which hubs then find. A verdict that would say the same again
// is not given twice, and a tenant without keys needs no signature.
func TestTenantSignaturePolicy(t *testing.T) {
	e := newEnv(t)
	provider, acme, globex := newSigner(t), newSigner(t), newSigner(t)
	s, counter := e.service(t, provider)
	s.TenantKeys = writeTenantKeys(t, map[string]*attest.Signer{"acme": acme, "globex": globex})
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 2<<20, 11), containerdisk.Options{}, publish.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	hub := trusting(t, provider)

	want := func(step, code string) {
		t.Helper()
		v, err := verdict.Find(t.Context(), e.reg, hub, subject)
		switch {
		case err != nil:
			t.Fatalf("%s: a hub finds no verdict: %v", step, err)
		case code == "" && (v.Verdict != api.VerdictAccepted || v.SignedBy != acme.KeyID()):
			t.Fatalf("%s: a hub finds %+v; want accepted, signed by acme's key %s", step, v, acme.KeyID())
		case code != "" && (v.Verdict != api.VerdictRejected || v.Reasons[0].Code != code):
			t.Fatalf("%s: a hub finds %+v; want rejected for %s", step, v, code)
		}
	}
	s.Add([]intake.Event{{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: d}})
	s.runQueued(t)
	want("unsigned", "unsigned")
	if len(counter.reads) != 0 {
		t.Errorf("an unsigned image's blobs were read: %v", counter.reads)
	}
	if _, err := s.Handle(t.Context(), subject); err != nil || e.verdictCount(t, subject) != 1 {
		t.Errorf("handling the unsigned image again: %v, %d verdicts; want the one", err, e.verdictCount(t, subject))
	}

	// Another tenant's key signs acme's image: it admits nothing.
	e.sign(t, globex, subject)
	s.Add(referrerEvents(t, e, subject))
	s.runQueued(t)
	want("signed by globex", "untrusted-signature")

	// acme's own key signs it: the gate reads it and accepts it. A
	// registry without the referrers API announces the referrers tag.
	e.sign(t, acme, subject)
	s.Add([]intake.Event{{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "sha256-" + subject.DigestStr()[len("sha256:"):]}})
	s.runQueued(t)
	want("signed by acme", "")

	// A tenant without a key file needs no signature.
	o := e.importDisk(t, "initech/os", rawDisk(t, 1<<20, 12), containerdisk.Options{}, publish.ImportOptions{})
	if v, err := s.Handle(t.Context(), mustDigest(t, e.host+"/initech/os@"+o)); err != nil || v.Verdict != api.VerdictAccepted || v.SignedBy != "" {
		t.Errorf("a tenant without a policy: %+v, %v", v, err)
	}
}

// referrerEvents are the events a registry sends for the newest referrer
// of subject: its manifest pushed by digest alone.
func referrerEvents(t *testing.T, e *env, subject name.Digest) []intake.Event {
	t.Helper()
	refs, _, err := e.reg.Referrers(t.Context(), subject, "")
	if err != nil {
		t.Fatal(err)
	}
	var events []intake.Event
	for _, r := range refs {
		events = append(events, intake.Event{Action: intake.ActionPush, Repository: subject.RepositoryStr(), Digest: r.Digest.String()})
	}
	return events
}

// runQueued runs the queued work to its end, failing the test on an error.
func (s *Service) runQueued(t *testing.T) {
	t.Helper()
	for s.queue.len() > 0 {
		w, done, ok := s.queue.next()
		if !ok {
			return
		}
		err := s.handleWork(t.Context(), w)
		done(err)
		if err != nil {
			t.Fatalf("%+v: %v", w, err)
		}
	}
}

// TestRecheckFindsSignaturesNobodyAnnounced: with no event for the
// signature's push, the poller's Recheck still finds it.
func TestRecheckFindsSignaturesNobodyAnnounced(t *testing.T) {
	e := newEnv(t)
	provider, acme := newSigner(t), newSigner(t)
	s, _ := e.service(t, provider)
	s.TenantKeys = writeTenantKeys(t, map[string]*attest.Signer{"acme": acme})
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 1<<20, 13), containerdisk.Options{}, publish.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	if v, err := s.Handle(t.Context(), subject); err != nil || v.Verdict != api.VerdictRejected {
		t.Fatalf("unsigned: %+v, %v", v, err)
	}
	e.sign(t, acme, subject)
	s.Recheck()
	s.runQueued(t)
	if v, err := verdict.Find(t.Context(), e.reg, trusting(t, provider), subject); err != nil || v.Verdict != api.VerdictAccepted {
		t.Errorf("after Recheck: %+v, %v; want accepted", v, err)
	}
	if got := s.awaiting.list(); len(got) != 0 {
		t.Errorf("still awaiting a signature: %v", got)
	}
}

// TestBrokenPolicyHoldsImagesBack: a tenant's key file that cannot be
// read is an error, never "no policy": the image gets no verdict, and is
// tried again, rather than passing unsigned. Names that could leave the
// folder name no file.
func TestBrokenPolicyHoldsImagesBack(t *testing.T) {
	e := newEnv(t)
	s, _ := e.service(t, newSigner(t))
	s.TenantKeys = &TenantKeys{Dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(s.TenantKeys.Dir, "acme.pub"), []byte("not a key"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := e.importDisk(t, "acme/rhel", rawDisk(t, 1<<20, 14), containerdisk.Options{}, publish.ImportOptions{})
	subject := mustDigest(t, e.host+"/acme/rhel@"+d)
	if v, err := s.Handle(t.Context(), subject); err == nil {
		t.Errorf("a broken key file gave the verdict %+v; want an error", v)
	}
	if n := e.verdictCount(t, subject); n != 0 {
		t.Errorf("%d verdicts published under a broken policy", n)
	}
	for _, tenant := range []string{"..", ".", "a/b", "", "acme/../x"} {
		if _, err := s.TenantKeys.checker(tenant); err == nil {
			t.Errorf("tenant %q named a key file", tenant)
		}
	}
}

// The gate attributes work to a tenant by the one tenant rule (imageref):
// a push to a repository outside it ("a.b/x", which the gate's own looser
// grammar once read as tenant "a.b", or a repository of one component) is
// no tenant's image. No hub serves it, and queued, its cost would be
// charged to a made-up tenant, one per name, past every tenant's budget;
// it gets no verdict, so nothing imports it.
func TestRepositoriesOutsideTheTenantRuleAreNotQueued(t *testing.T) {
	s := &Service{}
	d := "sha256:" + strings.Repeat("1", 64)
	for _, repo := range []string{"a.b/rhel", "a_b/rhel", "a__b/rhel", "rhel", "acme/../rhel", strings.Repeat("a", 64) + "/rhel"} {
		s.Add([]intake.Event{{Action: intake.ActionPush, Repository: repo, Tag: "9", Digest: d}})
		if n := s.queue.len(); n != 0 {
			t.Fatalf("a push to %q queued %d verifications", repo, n)
		}
	}
	s.Add([]intake.Event{{Action: intake.ActionPush, Repository: "acme/rhel", Tag: "9", Digest: d}})
	if n := s.queue.len(); n != 1 {
		t.Errorf("a push to acme/rhel queued %d verifications, want 1", n)
	}
}
