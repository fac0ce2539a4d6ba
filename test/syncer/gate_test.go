package syncer

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// diskTar is a containerDisk tar of disk as another tool writes it: its
// own mtime and owner names, so never imagepipe's bytes.
func diskTar(t *testing.T, disk []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mt := time.Unix(1600000000, 0)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: 107, Gid: 107, Uname: "qemu", ModTime: mt})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: 107, Gid: 107, Uname: "qemu", Size: int64(len(disk)), ModTime: mt})
	tw.Write(disk)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func gzipBytes(b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

// pushCrafted pushes a one-layer image with go-containerregistry, as any
// OCI client may: layer is the blob, layerDesc its descriptor (extra
// fields merged in), diffID the config's. It returns the manifest digest.
func pushCrafted(t *testing.T, ref string, layer []byte, layerDesc map[string]any, diffID string) string {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.Digest(diffID)}},
	})
	for _, blob := range [][]byte{cfg, layer} {
		if err := remote.WriteLayer(r.Context(), static.NewLayer(blob, types.OCILayer)); err != nil {
			t.Fatal(err)
		}
	}
	desc := map[string]any{"mediaType": ocispec.MediaTypeImageLayerGzip, "digest": digest.FromBytes(layer), "size": len(layer)}
	for k, v := range layerDesc {
		desc[k] = v
	}
	m, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": ocispec.MediaTypeImageManifest,
		"config": ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfg), Size: int64(len(cfg))},
		"layers": []any{desc},
	})
	if err := remote.Put(r, rawManifest(m)); err != nil {
		t.Fatal(err)
	}
	return digest.FromBytes(m).String()
}

type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// backingFileQCOW2 is a 64 KiB-cluster qcow2 header naming /etc/passwd
// as its backing file: imported by qemu-img, the tenant's volume would
// hold the importer's file.
func backingFileQCOW2() []byte {
	b := make([]byte, 3<<16)
	be := binary.BigEndian
	copy(b, "QFI\xfb")
	be.PutUint32(b[4:], 3)
	be.PutUint64(b[8:], 512)
	be.PutUint32(b[16:], uint32(len("/etc/passwd")))
	be.PutUint32(b[20:], 16)
	be.PutUint64(b[24:], 1<<20)
	be.PutUint32(b[36:], 1)
	be.PutUint64(b[40:], 1<<16)
	be.PutUint64(b[48:], 2<<16)
	be.PutUint32(b[56:], 1)
	be.PutUint32(b[96:], 4)
	be.PutUint32(b[100:], 104)
	copy(b[512:], "/etc/passwd")
	return b
}

// amplifierQCOW2 is a 512 MiB qcow2 disk of 320 KiB whose one data
// cluster is mapped 8192 times: its header passes, its tables do not.
func amplifierQCOW2() []byte {
	const cs = 64 << 10
	b := make([]byte, 5*cs)
	be := binary.BigEndian
	copy(b, "QFI\xfb")
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], 16)
	be.PutUint64(b[24:], 512<<20)
	be.PutUint32(b[36:], 1)
	be.PutUint64(b[40:], cs)
	be.PutUint64(b[48:], 2*cs)
	be.PutUint32(b[56:], 1)
	be.PutUint32(b[96:], 4)
	be.PutUint32(b[100:], 104)
	be.PutUint64(b[cs:], 1<<63|3*cs)
	for j := range 8192 {
		be.PutUint64(b[3*cs+8*j:], 1<<63|4*cs)
	}
	copy(b[4*cs:], bytes.Repeat([]byte("amplify!"), cs/8))
	return b
}

// TestGateKeepsHostilePushesOffBothHubs pushes, with clients other than
// imagectl, each way found to make a hub import what was never verified,
// and a benign image, onto a registry with the gate and two hubs running
// CDI's real controller and importer. No hub gets a DataVolume for a
// hostile image, and each BaseImage says why; the benign image is Ready
// on both, imports identically, and its layer is read in full once, by
// the gate, whose verdict cosign verifies with the provider's key.
func TestGateKeepsHostilePushesOffBothHubs(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hubA, hubB := startTestHub(t, "hub-a"), startTestHub(t, "hub-b")
	sa, sb := harness.ReserveSyncer(t), harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{
		Gate: testenv.ImageGate, NotifyURL: sa.WebhookURL, NotifyURLs: []string{sb.WebhookURL}, NotifyToken: webhookToken, AllowLayerURLs: true,
	})
	startSyncer(t, sa, hubA, reg.Host, "--poll-interval", "1h")
	startSyncer(t, sb, hubB, reg.Host, "--poll-interval", "1h")
	hubs := []*testHub{hubA, hubB}
	const ns = "acme"
	var canonical string

	// A layer served from outside the registry, for the descriptor that
	// names urls: CDI's importer would fetch it instead of the blob.
	evilLayer := gzipBytes(diskTar(t, backingFileQCOW2()))
	outside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(evilLayer) }))
	t.Cleanup(outside.Close)

	benignDisk := bytes.Repeat([]byte("benign!"), (1<<20)/7+1)[:1<<20]
	benignTar := diskTar(t, benignDisk)
	benignLayer := gzipBytes(benignTar)
	innerTar := diskTar(t, backingFileQCOW2())
	hostile := []struct {
		repo, reason string
		push         func(ref string) string
	}{
		// Read by its media type, a raw disk; read by its bytes, as CDI
		// does, a gzip stream holding a tar whose disk names /etc/passwd.
		{"evil-sniffed", "LayerMediaType", func(ref string) string {
			return pushCrafted(t, ref, gzipBytes(innerTar), map[string]any{"mediaType": ocispec.MediaTypeImageLayer}, digest.FromBytes(innerTar).String())
		}},
		// The registry checks the blob and the urls; CDI fetches the urls.
		{"evil-urls", "ManifestShape", func(ref string) string {
			return pushCrafted(t, ref, benignLayer, map[string]any{"urls": []string{outside.URL + "/layer.tar.gz"}}, digest.FromBytes(benignTar).String())
		}},
		{"evil-data", "ManifestShape", func(ref string) string {
			return pushCrafted(t, ref, benignLayer, map[string]any{"data": evilLayer}, digest.FromBytes(benignTar).String())
		}},
		{"evil-amplifier", "SharedCluster", func(ref string) string {
			tb := diskTar(t, amplifierQCOW2())
			return pushCrafted(t, ref, gzipBytes(tb), nil, digest.FromBytes(tb).String())
		}},
	}
	for _, h := range hostile {
		h.push(reg.Host + "/acme/" + h.repo + ":1")
	}

	// The benign image, pushed with crane.
	tarPath := filepath.Join(t.TempDir(), "disk.tar")
	if err := os.WriteFile(tarPath, benignTar, 0o644); err != nil {
		t.Fatal(err)
	}
	crane := harness.Binary(t, "crane")
	ref := reg.Host + "/acme/crane:1"
	testenv.Run(t, crane, "append", "--insecure", "--oci-empty-base", "-f", tarPath, "-t", ref)
	testenv.Run(t, crane, "mutate", "--insecure", "--set-platform", "linux/amd64", ref)
	pushed := strings.TrimSpace(string(testenv.Run(t, crane, "digest", "--insecure", ref)))

	for _, h := range hubs {
		for _, ev := range hostile {
			bi := ev.repo + "--1"
			h.baseImage(t, ns, bi, "rejected as "+ev.reason, func(b *v1alpha1.BaseImage) bool {
				c := apimeta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionRejected)
				return b.Status.Phase == v1alpha1.PhaseRejected && c != nil && c.Status == "True" && c.Reason == ev.reason
			})
			if dvs := h.dataVolumes(t, ns, cdi.ImageName("acme/"+ev.repo)); len(dvs) != 0 {
				t.Errorf("hub %s: %s has DataVolumes %v", h.Name, ev.repo, dvs)
			}
		}
		b := h.baseImage(t, ns, "crane--1", "verified", func(b *v1alpha1.BaseImage) bool {
			return b.Status.ObservedDigest == pushed && b.Status.CanonicalDigest != ""
		})
		canonical = b.Status.CanonicalDigest
		if b.Status.CanonicalDigest == pushed {
			t.Errorf("hub %s: crane's image %s was taken as canonical; its tar is not imagepipe's", h.Name, pushed)
		}
		dv := cdi.DataVolumeName(cdi.ImageName("acme/crane"), pushed)
		got := h.dataVolumes(t, ns, cdi.ImageName("acme/crane"))[dv]
		if url := *got.Spec.Source.Registry.URL; url != "docker://"+reg.Host+"/acme/crane@"+b.Status.CanonicalDigest {
			t.Errorf("hub %s: DataVolume URL %q; want the canonical image %s", h.Name, url, b.Status.CanonicalDigest)
		}
		h.CDI.WaitImported(t, ns, dv, importTimeout)
		h.baseImage(t, ns, "crane--1", "ready", func(b *v1alpha1.BaseImage) bool { return b.Status.Phase == v1alpha1.PhaseReady })
		src := filepath.Join(t.TempDir(), "pushed.raw")
		if err := os.WriteFile(src, benignDisk, 0o644); err != nil {
			t.Fatal(err)
		}
		imported := filepath.Join(t.TempDir(), "imported.raw")
		h.CDI.CopyImportedDisk(t, ns, dv, imported)
		testenv.Run(t, "qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", src, imported)
	}

	// The tenant's layer was read in full once, by the gate; the syncers
	// read neither it nor the canonical layer (only the small verdicts),
	// and CDI's importers read the canonical layer.
	layers := map[string]string{}
	for what, r := range map[string]string{"the tenant's layer": ref, "the canonical layer": reg.Host + "/acme/crane@" + canonical} {
		var m ocispec.Manifest
		if err := json.Unmarshal(testenv.Run(t, crane, "manifest", "--insecure", r), &m); err != nil {
			t.Fatal(err)
		}
		layers[what] = m.Layers[0].Digest.String()
	}
	reads := blobReads(t, reg, "acme/crane", layers["the tenant's layer"])
	if len(reads) != 1 || !strings.Contains(reads[0], "imagepipe-gate/") {
		t.Errorf("the tenant's layer was read by %q; want once, by the gate", reads)
	}
	for what, layer := range layers {
		for _, ua := range blobReads(t, reg, "acme/crane", layer) {
			if strings.Contains(ua, "image-syncer/") {
				t.Errorf("a syncer read %s (%s)", what, ua)
			}
		}
	}

	// cosign, an independent client, accepts the verdict with the
	// provider's key and refuses it with another.
	cosign := harness.Binary(t, "cosign")
	_, pub := harness.ProviderKeyFiles(t)
	args := []string{"verify-attestation", "--insecure-ignore-tlog=true", "--allow-http-registry=true", "--type", api.VerdictPredicateType}
	out := testenv.Run(t, cosign, append(args, "--key", pub, reg.Host+"/acme/crane@"+pushed)...)
	if !bytes.Contains(out, []byte("payload")) {
		t.Errorf("cosign verify-attestation printed no attestation: %s", out)
	}
	// imagectl inspect shows the tenant the verdicts hubs act on, with
	// what the gate read inside the disk (a raw disk of text: no OS).
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"inspect", "--gate-keys", pub, "docker://" + ref}})
	if r.Code != 0 || !strings.Contains(r.Stdout, "gate:") || !strings.Contains(r.Stdout, "accepted by imagepipe-gate") || !strings.Contains(r.Stdout, canonical) ||
		!strings.Contains(r.Stdout, "partition table:") || !strings.Contains(r.Stdout, "no operating system found") {
		t.Errorf("imagectl inspect of the crane image: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: []string{"inspect", "--gate-keys", pub, "-o", "json", "docker://" + reg.Host + "/acme/evil-amplifier:1"}})
	var report api.ContainerDiskReport
	if err := json.Unmarshal([]byte(r.Stdout), &report); err != nil || r.Code != 3 || report.Gate == nil || report.Gate.Verdict == nil ||
		report.Gate.Verdict.Verdict != api.VerdictRejected || report.Gate.Verdict.Reasons[0].Code != "shared-cluster" {
		t.Errorf("imagectl inspect of the amplifier: exit %d, %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}

	other := filepath.Join(t.TempDir(), "other.pub")
	otherKey(t, other)
	r = testenv.RunCommand(t, testenv.Command{Name: cosign, Args: append(args, "--key", other, reg.Host+"/acme/crane@"+pushed)})
	if r.Code == 0 {
		t.Errorf("cosign accepted the verdict with another key")
	}
}

// blobReads returns the User-Agents of the registry's completed GETs of
// repo's blob (of any blob when ""), one per read.
func blobReads(t *testing.T, reg *harness.Registry, repo, blob string) []string {
	t.Helper()
	f, err := os.Open(reg.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var agents []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="response completed"`) || !strings.Contains(line, "http.request.method=GET ") ||
			!strings.Contains(line, `http.request.uri="/v2/`+repo+`/blobs/`+blob) {
			continue
		}
		_, ua, _ := strings.Cut(line, `http.request.useragent="`)
		ua, _, _ = strings.Cut(ua, `"`)
		agents = append(agents, ua)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return agents
}

// otherKey writes a public key that is not the provider's.
func otherKey(t *testing.T, path string) {
	t.Helper()
	testenv.Run(t, "sh", "-c", fmt.Sprintf("openssl ecparam -name prime256v1 -genkey -noout | openssl pkey -pubout -out %s", path))
}
