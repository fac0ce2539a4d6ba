package hostile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// foreignLayer is a containerDisk layer of disk as another tool writes
// it (gzip, tar headers of its own), with its diff ID.
func foreignLayer(disk []byte) (layer []byte, diffID string) {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID, Uname: "qemu"})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: api.DiskUID, Gid: api.DiskGID, Uname: "qemu", Size: int64(len(disk))})
	tw.Write(disk)
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tb.Bytes())
	zw.Close()
	return gz.Bytes(), digest.FromBytes(tb.Bytes()).String()
}

// pushManifestOf pushes a manifest naming layer, with annotations that
// make it a manifest of its own, and returns its digest.
func pushManifestOf(t *testing.T, ref name.Tag, layer []byte, diffID string, annotations map[string]string, opts ...remote.Option) string {
	t.Helper()
	cfg, _ := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.Digest(diffID)}},
	})
	for _, blob := range [][]byte{cfg, layer} {
		if err := remote.WriteLayer(ref.Context(), static.NewLayer(blob, types.OCILayer), opts...); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": ocispec.MediaTypeImageManifest,
		"config":      ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfg), Size: int64(len(cfg))},
		"layers":      []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromBytes(layer), Size: int64(len(layer))}},
		"annotations": annotations,
	})
	if err := remote.Put(ref, rawManifest(m), opts...); err != nil {
		t.Fatal(err)
	}
	return digest.FromBytes(m).String()
}

// diskWithData is a raw disk of size bytes whose first data bytes are
// random, the rest zero (holes in a spool).
func diskWithData(size, data int, seed uint64) []byte {
	b := make([]byte, size)
	rng := mrand.New(mrand.NewPCG(seed, 1))
	for i := range data {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// waitVerdict waits for the gate's verdict on subject, as a hub finds it.
func waitVerdict(t *testing.T, rc *registry.Client, subject name.Digest) *api.Verdict {
	t.Helper()
	return awaitVerdict(t, rc, providerTrust(t), subject, subject.String())
}

// TestTheGateReadsEachLayerOnceAndKeepsWhatItVerified runs the real
// image-gate against the CNCF registry. Three manifests in two tenants'
// repositories naming one layer cost one read of it, and each gets its
// own verdict and canonical image; a tenant who empties its referrers tag
// gets the verdict back without the image being read again; and a disk
// with more data than one verification's share of --max-spool is refused
// once, not retried for ever, while another tenant's image is verified.
func TestTheGateReadsEachLayerOnceAndKeepsWhatItVerified(t *testing.T) {
	testenv.RequireQEMU(t)
	// Six verifications at once share 600 kB: 100 kB each.
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, GateArgs: []string{"--max-spool", "600000"}})
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	layer, diffID := foreignLayer(diskWithData(1<<20, 32<<10, 1))
	var subjects []name.Digest
	for i, repo := range []string{"acme/one", "acme/two", "globex/three"} {
		ref, _ := name.NewTag(reg.Host+"/"+repo+":1", name.Insecure)
		d := pushManifestOf(t, ref, layer, diffID, map[string]string{"org.opencontainers.image.title": repo})
		subjects = append(subjects, ref.Context().Digest(d))
		if v := waitVerdict(t, rc, subjects[i]); v.Verdict != api.VerdictAccepted {
			t.Fatalf("%s: %+v", repo, v)
		} else if _, err := rc.FetchManifest(t.Context(), ref.Context().Digest(v.Images[0].Canonical)); err != nil {
			t.Errorf("%s: the canonical image is not in the repository: %v", repo, err)
		}
	}
	gateLog := func() string {
		b, err := os.ReadFile(reg.Gate.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	layerDigest := digest.FromBytes(layer).String()
	if n := strings.Count(gateLog(), `msg="layer read"`); n != 1 || !strings.Contains(gateLog(), "layer="+layerDigest) {
		t.Errorf("the layer named by three manifests was read %d times, want once", n)
	}

	// The tenant empties the referrers tag of its first image.
	hidden := subjects[0]
	empty := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}`)
	if _, err := rc.Push(t.Context(), hidden.Context().Tag(strings.Replace(hidden.DigestStr(), ":", "-", 1)), registry.RawManifest{MediaType: types.OCIImageIndex, Bytes: empty}); err != nil {
		t.Fatal(err)
	}
	if refs, _, err := rc.Referrers(t.Context(), hidden, ""); err != nil || len(refs) != 0 {
		t.Fatalf("after emptying the referrers tag, the registry lists %v, %v", refs, err)
	}
	harness.WaitUntil(t, "the gate to publish the hidden verdict again", time.Minute, 100*time.Millisecond, func() (bool, error) {
		return strings.Contains(gateLog(), `msg="verdict published again" subject=`+hidden.String()), nil
	})
	if v := waitVerdict(t, rc, hidden); v.Verdict != api.VerdictAccepted {
		t.Errorf("after hiding: %+v", v)
	}
	if n := strings.Count(gateLog(), `msg="layer read"`); n != 1 {
		t.Errorf("hiding the verdict cost %d more layer reads", n-1)
	}

	// A disk with 512 KiB of data, over its 100 kB share, beside another
	// tenant's small one.
	fatRef, _ := name.NewTag(reg.Host+"/acme/fat:1", name.Insecure)
	fatLayer, fatDiffID := foreignLayer(diskWithData(4<<20, 512<<10, 2))
	fat := fatRef.Context().Digest(pushManifestOf(t, fatRef, fatLayer, fatDiffID, nil))
	thinRef, _ := name.NewTag(reg.Host+"/globex/thin:1", name.Insecure)
	thinLayer, thinDiffID := foreignLayer(diskWithData(1<<20, 16<<10, 3))
	thin := thinRef.Context().Digest(pushManifestOf(t, thinRef, thinLayer, thinDiffID, nil))
	if v := waitVerdict(t, rc, fat); v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(reject.VerificationLimit) {
		t.Errorf("the disk over its spool share: %+v; want refused, verification-limit", v)
	}
	if v := waitVerdict(t, rc, thin); v.Verdict != api.VerdictAccepted {
		t.Errorf("the other tenant's image: %+v", v)
	}
	for _, line := range strings.Split(gateLog(), "\n") {
		if strings.Contains(line, "retrying") && strings.Contains(line, "acme/fat") {
			t.Errorf("the image over its spool share was retried: %s", line)
		}
	}
}

// TestTheGateOnZotWithTheReferrersAPI runs the real image-gate against
// zot, a registry with the OCI 1.1 referrers API and a credential per
// tenant: the gate learns of a push by polling, its verdict is found
// through the referrers API by a hub, and a tenant who deletes the
// verdict (on such a registry there is no referrers tag to empty) gets it
// back at the gate's next full poll, without its image being read again.
func TestTheGateOnZotWithTheReferrersAPI(t *testing.T) {
	z := harness.StartZot(t, harness.ZotOptions{
		Users:  map[string]string{"gate": "gate-pw", "acme": "acme-pw"},
		Access: map[string]map[string][]string{"acme/**": {"acme": {"read", "create", "update", "delete"}}},
		Admins: []string{"gate"}, AdminActions: []string{"read", "create", "update"},
	})
	g := harness.ReserveGate(t)
	g.Start(t, testenv.ImageGate, z.Host, "", "gate", "gate-pw", "--digest-resync-interval", "3s")
	rc, err := registry.New(registry.WithCacheDir(""), registry.WithBasicAuth("gate", "gate-pw"))
	if err != nil {
		t.Fatal(err)
	}
	tenant := remote.WithAuth(&authn.Basic{Username: "acme", Password: "acme-pw"})
	ref, _ := name.NewTag(z.Host+"/acme/rhel:1", name.Insecure)
	layer, diffID := foreignLayer(diskWithData(1<<20, 32<<10, 4))
	subject := ref.Context().Digest(pushManifestOf(t, ref, layer, diffID, nil, tenant))
	if v := waitVerdict(t, rc, subject); v.Verdict != api.VerdictAccepted {
		t.Fatalf("%+v", v)
	}
	// zot 1.4 reports a referrer's config media type as its artifact
	// type: all referrers are listed, the verdicts told by annotation.
	refs, _, err := rc.Referrers(t.Context(), subject, "")
	if err != nil || len(refs) == 0 {
		t.Fatalf("the registry's referrers of %s: %v, %v", subject, refs, err)
	}
	// The tenant deletes the verdicts, which its credential allows. The
	// gate may sign again before the next line runs, so what is checked is
	// that the deleted manifests are gone: a verdict signed again is
	// another manifest, its signature being new.
	var deleted []name.Digest
	for _, r := range refs {
		if r.Annotations[verdict.PredicateTypeAnnotation] != api.VerdictPredicateType {
			continue
		}
		d := ref.Context().Digest(r.Digest.String())
		if err := remote.Delete(d, tenant); err != nil {
			t.Fatal(err)
		}
		deleted = append(deleted, d)
	}
	if len(deleted) == 0 {
		t.Fatalf("no verdict among the referrers of %s: %+v", subject, refs)
	}
	for _, d := range deleted {
		var terr *transport.Error
		if _, err := remote.Head(d, tenant); !errors.As(err, &terr) || terr.StatusCode != http.StatusNotFound {
			t.Fatalf("the deleted verdict %s is still served: %v", d, err)
		}
	}
	if v := waitVerdict(t, rc, subject); v.Verdict != api.VerdictAccepted {
		t.Errorf("after the deletion: %+v", v)
	}
	log := awaitLogLine(t, g.LogPath, `msg="verdict published again"`)
	if n := bytes.Count(log, []byte(`msg="layer read"`)); n != 1 || !bytes.Contains(log, []byte(`msg="verdict published again"`)) {
		t.Errorf("%d layer reads, want 1, and the verdict published again from the gate's record:\n%s", n, log)
	}
}

// TestTheGateSignsAgainWithARotatedKey rotates the real gate's key as
// docs/install.md says: a gate started with a new signing key, trusting
// the old and the new, signs the verdict the old key signed again with
// the new one, reading no image; a hub trusting only the new key then
// finds it.
func TestTheGateSignsAgainWithARotatedKey(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate})
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.NewTag(reg.Host+"/acme/rotate:1", name.Insecure)
	layer, diffID := foreignLayer(diskWithData(1<<20, 16<<10, 5))
	subject := ref.Context().Digest(pushManifestOf(t, ref, layer, diffID, nil))
	if v := waitVerdict(t, rc, subject); v.Verdict != api.VerdictAccepted {
		t.Fatalf("%+v", v)
	}
	reg.Gate.Stop(t)

	dir := t.TempDir()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(k)
	pub, _ := x509.MarshalPKIXPublicKey(k.Public())
	newKey, newPub, both := filepath.Join(dir, "new.key"), filepath.Join(dir, "new.pub"), filepath.Join(dir, "both.pub")
	_, oldPub := harness.ProviderKeyFiles(t)
	old, err := os.ReadFile(oldPub)
	if err != nil {
		t.Fatal(err)
	}
	newPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
	for path, data := range map[string][]byte{newKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), newPub: newPEM, both: append(old, newPEM...)} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newTrust := harness.TrustKeyFile(t, newPub)
	if _, err := verdict.Find(t.Context(), rc, newTrust, subject); !errors.Is(err, verdict.ErrNoVerdict) {
		t.Fatalf("before the rotation, the new key's trust finds %v", err)
	}
	g := harness.ReserveGate(t)
	g.Start(t, testenv.ImageGate, reg.Host, "", "", "", "--signing-key", newKey, "--trusted-keys", both)
	if v := awaitVerdict(t, rc, newTrust, subject, "the verdict signed with the new key"); v.Verdict != api.VerdictAccepted {
		t.Errorf("%+v", v)
	}
	log := awaitLogLine(t, g.LogPath, `msg="verdict signed again with the current key"`)
	if !bytes.Contains(log, []byte(`msg="verdict signed again with the current key"`)) || bytes.Contains(log, []byte(`msg="layer read"`)) {
		t.Errorf("the rotated gate read the image again, or did not sign its verdict again:\n%s", log)
	}
}

// awaitLogLine returns the log at path once it holds line, or after 30 s
// without it: the gate logs a verdict just after the registry has it, so
// a test that found the verdict may read the log a moment too early.
func awaitLogLine(t *testing.T, path, line string) []byte {
	t.Helper()
	var log []byte
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var err error
		if log, err = os.ReadFile(path); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(log, []byte(line)) {
			break
		}
	}
	return log
}

// TestATenantOverItsBudgetWaitsAndNoOtherDoes runs the real image-gate
// with a small per-tenant budget of decompressed bytes: once a tenant's
// verifications spent it, its next image waits (it gets no verdict, not a
// refusal, until its spending leaves the window), while another tenant's
// image is verified at once.
func TestATenantOverItsBudgetWaitsAndNoOtherDoes(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, GateArgs: []string{"--tenant-budget-decompressed", strconv.Itoa(3 << 20)}})
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	push := func(repo string, seed uint64) name.Digest {
		ref, _ := name.NewTag(reg.Host+"/"+repo+":1", name.Insecure)
		layer, diffID := foreignLayer(diskWithData(4<<20, 16<<10, seed))
		return ref.Context().Digest(pushManifestOf(t, ref, layer, diffID, nil))
	}
	// 4 MiB decompressed: acme is past its 3 MiB once this is verified.
	if v := waitVerdict(t, rc, push("acme/first", 11)); v.Verdict != api.VerdictAccepted {
		t.Fatalf("acme's first image: %+v", v)
	}
	second := push("acme/second", 12)
	if v := waitVerdict(t, rc, push("globex/other", 13)); v.Verdict != api.VerdictAccepted {
		t.Errorf("the other tenant's image: %+v", v)
	}
	log := awaitLogLine(t, reg.Gate.LogPath, `msg="tenant over its budget; its next verification waits" tenant=acme`)
	if !bytes.Contains(log, []byte(`tenant=acme`)) || !bytes.Contains(log, []byte("over its budget")) {
		t.Fatalf("the gate did not hold acme over its budget; its log:\n%s", log)
	}
	if _, err := verdict.Find(t.Context(), rc, providerTrust(t), second); err == nil {
		t.Errorf("acme's second image got a verdict while acme is over its budget")
	} else if !errors.Is(err, verdict.ErrNoVerdict) {
		t.Errorf("reading the verdict on acme's second image: %v", err)
	}
}
