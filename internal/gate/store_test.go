package gate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
)

func digestOf(b []byte) string { return digest.FromBytes(b).String() }

func (b *blobCounter) total() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.reads {
		n += c
	}
	return n
}

// hideVerdicts empties subject's referrers tag, as a tenant with push
// access may (88 bytes): the registry then lists no verdict.
func hideVerdicts(t *testing.T, e *env, subject name.Digest) {
	t.Helper()
	tag := subject.Context().Tag(strings.Replace(subject.DigestStr(), ":", "-", 1))
	empty := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}`)
	if _, err := e.reg.Push(t.Context(), tag, registry.RawManifest{MediaType: types.OCIImageIndex, Bytes: empty}); err != nil {
		t.Fatal(err)
	}
	if refs, _, err := e.reg.Referrers(t.Context(), subject, ""); err != nil || len(refs) != 0 {
		t.Fatalf("after emptying the referrers tag, referrers of %s: %v, %v", subject, refs, err)
	}
}

// TestEachLayerIsReadOnce: manifests in two tenants' repositories that
// name one layer (a foreign image, whose canonical layer the gate writes;
// and a hostile one, refused) cost one read of that layer, and every
// manifest still gets its own verdict, with the canonical image in its
// own repository.
func TestEachLayerIsReadOnce(t *testing.T) {
	e := newEnv(t)
	signer := newSigner(t)
	s, counter := e.service(t, signer)
	store := &Store{Dir: t.TempDir()}
	s.Store, s.Verifier.Store = store, store

	foreign := craftImage(t, rawDisk(t, 4<<20, 9))
	hostile := craftImage(t, amplifier())
	for _, c := range []struct {
		img    *crafted
		want   string
		images int // verified images in the verdict
	}{{foreign, api.VerdictAccepted, 1}, {hostile, api.VerdictRejected, 0}} {
		for i, repo := range []string{"acme/a", "acme/b", "globex/c"} {
			// Each manifest differs (an annotation), the layer does not.
			c.img.annotations = map[string]string{"org.opencontainers.image.title": repo}
			d := c.img.push(t, e, repo)
			v, err := s.Handle(t.Context(), mustDigest(t, e.host+"/"+repo+"@"+d))
			if err != nil || v.Verdict != c.want {
				t.Fatalf("%s #%d: %+v, %v; want %s", repo, i, v, err, c.want)
			}
			if len(v.Images) != c.images {
				t.Fatalf("%s: %d verified images, want %d", repo, len(v.Images), c.images)
			}
			for _, im := range v.Images {
				if _, err := e.reg.FetchManifest(t.Context(), mustDigest(t, e.host+"/"+repo+"@"+im.Canonical)); err != nil {
					t.Errorf("%s: the canonical image %s is not in the repository: %v", repo, im.Canonical, err)
				}
			}
		}
		layer := digestOf(c.img.layer)
		if n := counter.reads[layer]; n != 1 {
			t.Errorf("the layer %s named by three manifests was read %d times, want once", layer, n)
		}
	}
}

// TestNoClaimBuysASecondRead: manifests that name one layer under every
// claim a tenant can vary (the disk format annotation, the descriptor's
// size, Docker's media type for the same compression) cost one read of
// it; each claim is then judged against what that read found.
func TestNoClaimBuysASecondRead(t *testing.T) {
	e := newEnv(t)
	s, counter := e.service(t, newSigner(t))
	store := &Store{Dir: t.TempDir()}
	s.Store, s.Verifier.Store = store, store
	img := craftImage(t, rawDisk(t, 4<<20, 11))
	size := len(img.layer)
	for i, c := range []struct {
		annotations map[string]string
		layerDesc   map[string]any
		want        reject.Reason // "" accepted
	}{
		{want: ""},
		{annotations: map[string]string{api.AnnotationDiskFormat: "raw"}},
		{annotations: map[string]string{api.AnnotationDiskFormat: "qcow2"}, want: reject.AnnotationMismatch},
		{annotations: map[string]string{api.AnnotationDiskFormat: "vmdk"}, want: reject.AnnotationMismatch},
		{layerDesc: map[string]any{"size": size + 1}, want: reject.ManifestShape},
		{layerDesc: map[string]any{"size": size - 1}, want: reject.ManifestShape},
		{layerDesc: map[string]any{"size": 1}, want: reject.ManifestShape},
		{layerDesc: map[string]any{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip"}},
	} {
		img.annotations, img.layerDesc = c.annotations, c.layerDesc
		repo := fmt.Sprintf("acme/claim%d", i)
		v, err := s.Handle(t.Context(), mustDigest(t, e.host+"/"+repo+"@"+img.push(t, e, repo)))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case c.want == "" && v.Verdict != api.VerdictAccepted:
			t.Errorf("claim %d (%v %v): %+v, want accepted", i, c.annotations, c.layerDesc, v)
		case c.want != "" && (v.Verdict != api.VerdictRejected || len(v.Reasons) != 1 || v.Reasons[0].Code != string(c.want)):
			t.Errorf("claim %d (%v %v): %+v, want refused for %s", i, c.annotations, c.layerDesc, v, c.want)
		}
	}
	if n := counter.reads[digestOf(img.layer)]; n != 1 {
		t.Errorf("one layer under eight claims was read %d times, want once", n)
	}
}

// TestAHiddenVerdictIsPublishedAgainNotComputedAgain: a tenant that
// deletes the gate's verdict from the registry (its referrers tag) gets it
// back, signed, without the gate reading the image again.
func TestAHiddenVerdictIsPublishedAgainNotComputedAgain(t *testing.T) {
	e := newEnv(t)
	signer := newSigner(t)
	s, counter := e.service(t, signer)
	s.Store = &Store{Dir: t.TempDir()} // the verdicts only: the layer is read again if asked
	d := craftImage(t, rawDisk(t, 2<<20, 10)).push(t, e, "acme/hide")
	subject := mustDigest(t, e.host+"/acme/hide@"+d)
	if _, err := s.Handle(t.Context(), subject); err != nil {
		t.Fatal(err)
	}
	reads := counter.total()
	s.memory.Forget(subject.String())
	hideVerdicts(t, e, subject)
	v, err := s.Handle(t.Context(), subject)
	if err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("after hiding: %+v, %v", v, err)
	}
	if n := counter.total(); n != reads {
		t.Errorf("the hidden verdict cost %d blob reads, want none", n-reads)
	}
	if _, _, err := s.given(t.Context(), subject); err != nil {
		t.Errorf("the verdict is not in the registry again: %v", err)
	}
}

// TestStoreKeepsAtMostMaxRecords: past its bound the oldest records go.
func TestStoreKeepsAtMostMaxRecords(t *testing.T) {
	s := &Store{Dir: t.TempDir(), MaxRecords: 10}
	for i := range 25 {
		if err := s.PutVerdict(mustDigest(t, "registry.example.com/acme/x@"+digestOf([]byte{byte(i)})), &api.Verdict{}); err != nil {
			t.Fatal(err)
		}
	}
	s.Prune()
	entries, err := os.ReadDir(filepath.Join(s.Dir, "verdicts"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 10 {
		t.Errorf("%d records kept, want 10", len(entries))
	}
}

// TestKeyRotation: a provider rotates the gate's key. With the old and
// the new key both trusted, the gate signs every verdict again with the
// new one, reading no image; hubs that trust only the new key then find
// them. Once the old key is removed, a verdict only it signed counts for
// nothing: the gate publishes it again from its record (reading nothing)
// or, without one, verifies the image again.
func TestKeyRotation(t *testing.T) {
	e := newEnv(t)
	oldKey, newKey := newSigner(t), newSigner(t)
	old, counter := e.service(t, oldKey)
	store := &Store{Dir: t.TempDir()}
	old.Store = store
	var subjects []name.Digest
	for i, repo := range []string{"acme/one", "acme/two"} {
		d := craftImage(t, rawDisk(t, 1<<20, uint64(20+i))).push(t, e, repo)
		subjects = append(subjects, mustDigest(t, e.host+"/"+repo+"@"+d))
		if _, err := old.Handle(t.Context(), subjects[i]); err != nil {
			t.Fatal(err)
		}
	}
	reads := counter.total()

	// Rotating: both keys trusted, the new one signs.
	rotating, _ := e.service(t, newKey)
	rotating.Verifier.Registry, rotating.Registry = counter, counter.Client
	rotating.Trust, rotating.Store = trusting(t, oldKey, newKey), store
	if _, err := rotating.Handle(t.Context(), subjects[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := verdict.Find(t.Context(), e.reg, trusting(t, newKey), subjects[0]); err != nil {
		t.Errorf("after the rotation, a hub trusting the new key finds no verdict: %v", err)
	}
	if n := counter.total(); n != reads {
		t.Errorf("signing again read %d blobs, want none", n-reads)
	}

	// The old key removed before subjects[1] was signed again: the
	// record gives its verdict back, signed with the new key.
	rotated, _ := e.service(t, newKey)
	rotated.Verifier.Registry, rotated.Registry = counter, counter.Client
	rotated.Store = store
	if _, err := verdict.Find(t.Context(), e.reg, trusting(t, newKey), subjects[1]); err == nil {
		t.Fatal("a verdict only the removed key signed is trusted")
	}
	if v, err := rotated.Handle(t.Context(), subjects[1]); err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("%+v, %v", v, err)
	}
	if _, err := verdict.Find(t.Context(), e.reg, trusting(t, newKey), subjects[1]); err != nil {
		t.Errorf("the verdict is not published again: %v", err)
	}
	if n := counter.total(); n != reads {
		t.Errorf("publishing from the record read %d blobs, want none", n-reads)
	}

	// A gate that lost its record (a new volume) verifies such an image
	// again, rather than trust the removed key's verdict.
	d := craftImage(t, rawDisk(t, 1<<20, 22)).push(t, e, "acme/three")
	third := mustDigest(t, e.host+"/acme/three@"+d)
	if _, err := old.Handle(t.Context(), third); err != nil {
		t.Fatal(err)
	}
	reads = counter.total()
	fresh, _ := e.service(t, newKey)
	fresh.Verifier.Registry, fresh.Registry = counter, counter.Client
	fresh.Store = &Store{Dir: t.TempDir()}
	if v, err := fresh.Handle(t.Context(), third); err != nil || v.Verdict != api.VerdictAccepted {
		t.Fatalf("%+v, %v", v, err)
	}
	if _, err := verdict.Find(t.Context(), e.reg, trusting(t, newKey), third); err != nil {
		t.Errorf("without a record, the image is not given a verdict under the new key: %v", err)
	}
	if counter.total() == reads {
		t.Errorf("without a record, the removed key's verdict was signed again unread")
	}
}
