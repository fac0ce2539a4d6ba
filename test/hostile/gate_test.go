package hostile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/gate"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/trust"
	"github.com/imagepipe/imagepipe/internal/verdict"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestCorpusPushedAsContainerDisksIsRefusedByTheGate pushes every image of
// the hostile corpus that the engine judges without options, wrapped as a
// containerDisk of the right shape by go-containerregistry (not imagectl),
// to a registry with image-gate. The gate's signed verdict on each hostile
// one is a rejection with one of its expected reasons, and each control is
// accepted: the server side refuses what imagectl refuses, whoever pushes.
func TestCorpusPushedAsContainerDisksIsRefusedByTheGate(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate})
	trust := providerTrust(t)
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}

	type pushed struct {
		tc      corpusCase
		subject name.Digest
	}
	var all []pushed
	skipped := 0
	for i, tc := range corpus {
		if tc.opts != (convert.OpenOptions{}) {
			skipped++ // the gate judges with its own options; these need others
			continue
		}
		path := tc.build(t, t.TempDir())
		disk, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.NewTag(reg.Host+"/acme/corpus-"+string(rune('a'+i/26))+string(rune('a'+i%26))+":1", name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, pushed{tc, ref.Context().Digest(pushContainerDisk(t, ref, disk))})
	}
	t.Logf("%d images pushed, %d need options the gate does not take", len(all), skipped)

	for _, p := range all {
		v := awaitVerdict(t, rc, trust, p.subject, p.tc.name)
		if len(p.tc.want) == 0 {
			if v.Verdict != api.VerdictAccepted {
				t.Errorf("%s, a valid control, was refused: %+v", p.tc.name, v.Reasons)
			}
			continue
		}
		if v.Verdict != api.VerdictRejected || len(v.Reasons) == 0 || !slices.Contains(p.tc.want, reject.Reason(v.Reasons[0].Code)) {
			t.Errorf("%s: verdict %s %+v; want a rejection for %v", p.tc.name, v.Verdict, v.Reasons, p.tc.want)
		}
	}
}

// pushContainerDisk pushes disk as a gzip containerDisk of the right shape
// and returns the manifest digest.
func pushContainerDisk(t *testing.T, ref name.Tag, disk []byte) string {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: api.DiskUID, Gid: api.DiskGID, Size: int64(len(disk))})
	tw.Write(disk)
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tb.Bytes())
	zw.Close()
	return pushLayer(t, ref, gz.Bytes(), ocispec.MediaTypeImageLayerGzip, digest.FromBytes(tb.Bytes()).String())
}

// pushLayer pushes a linux/amd64 image of layer, of mediaType, whose
// config names diffID, and returns the manifest digest.
func pushLayer(t *testing.T, ref name.Tag, layer []byte, mediaType, diffID string) string {
	t.Helper()
	cfg, _ := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.Digest(diffID)}},
	})
	for _, blob := range [][]byte{cfg, layer} {
		if err := remote.WriteLayer(ref.Context(), static.NewLayer(blob, types.OCILayer)); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := json.Marshal(ocispec.Manifest{
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfg), Size: int64(len(cfg))},
		Layers:    []ocispec.Descriptor{{MediaType: mediaType, Digest: digest.FromBytes(layer), Size: int64(len(layer))}},
	})
	var doc map[string]any
	json.Unmarshal(m, &doc)
	doc["schemaVersion"] = 2
	m, _ = json.Marshal(doc)
	if err := remote.Put(ref, rawManifest(m)); err != nil {
		t.Fatal(err)
	}
	return digest.FromBytes(m).String()
}

type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// TestGateRefusesADiskDeclaredOverItsDefaultLimit: image-gate, run with
// its default limits, refuses a layer whose disk/disk.img declares more
// bytes than a disk of the largest virtual size it accepts
// (gate.DefaultMaxVirtualSize) can take: its data, a 64th more for a
// qcow2's tables, and 64 MiB. The tar header alone decides, so the layer
// carries only a little of the file it declares; a layer declaring exactly
// that many bytes is not refused for its declared size.
func TestGateRefusesADiskDeclaredOverItsDefaultLimit(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate})
	for _, arg := range reg.Gate.Args {
		if strings.HasPrefix(arg, "--max-virtual-size") {
			t.Fatalf("the gate runs with %s; this test needs its default", arg)
		}
	}
	trust := providerTrust(t)
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	limit := int64(gate.DefaultMaxVirtualSize) + gate.DefaultMaxVirtualSize/64 + 64*mib
	for _, tc := range []struct {
		repo     string
		declared int64
		refused  bool
	}{
		{"acme/over", limit + 1, true},
		{"acme/at", limit, false},
	} {
		ref, err := name.NewTag(reg.Host+"/"+tc.repo+":1", name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID})
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: api.DiskUID, Gid: api.DiskGID, Size: tc.declared}); err != nil {
			t.Fatal(err)
		}
		tw.Write(make([]byte, 64<<10)) // the start of the file; the rest is never sent
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(tb.Bytes())
		zw.Close()
		subject := ref.Context().Digest(pushLayer(t, ref, gz.Bytes(), ocispec.MediaTypeImageLayerGzip, digest.FromBytes(tb.Bytes()).String()))
		v := awaitVerdict(t, rc, trust, subject, tc.repo)
		overLimit := fmt.Sprintf("disk/disk.img is %d bytes, over the limit of %d for a disk of at most %d bytes", tc.declared, limit, int64(gate.DefaultMaxVirtualSize))
		bySize := v.Verdict == api.VerdictRejected && len(v.Reasons) == 1 && v.Reasons[0].Code == string(reject.VirtualSize) && strings.Contains(v.Reasons[0].Message, overLimit)
		if bySize != tc.refused {
			t.Errorf("%s, declaring %d bytes: verdict %s %+v; refused for the declared size: %v, want %v", tc.repo, tc.declared, v.Verdict, v.Reasons, bySize, tc.refused)
		}
		if !tc.refused && v.Verdict == api.VerdictRejected && len(v.Reasons) > 0 && strings.Contains(v.Reasons[0].Message, "over the limit") {
			t.Errorf("%s, declaring exactly the limit: refused as over it: %+v", tc.repo, v.Reasons)
		}
	}
}

// TestVerificationOutOfMemoryStopsNoOther: each verification runs in a
// process of its own, stopped past --verify-memory-limit (64 MiB here; a
// small image's verification takes about 45 MiB, mostly the program). A
// disk whose tables need more (a 120 GiB qcow2 of 512-byte clusters: a
// 30 MiB L1 table) ends its own verification, which is reported and tried
// again, and refused as verification-limit after the third time, while
// the gate goes on and gives another tenant's image, pushed at the same
// time, its verdict.
func TestVerificationOutOfMemoryStopsNoOther(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, GateArgs: []string{"--verify-memory-limit", "67108864"}})
	trust := providerTrust(t)
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	big := t.TempDir() + "/big.qcow2"
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", big, "120G")
	bigDisk, err := os.ReadFile(big)
	if err != nil {
		t.Fatal(err)
	}
	bigRef, _ := name.NewTag(reg.Host+"/acme/big:1", name.Insecure)
	smallRef, _ := name.NewTag(reg.Host+"/globex/small:1", name.Insecure)
	bigSubject := bigRef.Context().Digest(pushContainerDisk(t, bigRef, bigDisk))
	smallSubject := smallRef.Context().Digest(pushContainerDisk(t, smallRef, bytes.Repeat([]byte("small"), 1<<18)[:1<<20]))

	v := awaitVerdict(t, rc, trust, smallSubject, "the small image")
	if v.Verdict != api.VerdictAccepted {
		t.Errorf("the small image: %+v", v)
	}
	// Tried again after a backoff, then refused: the tenant learns why.
	v = awaitVerdict(t, rc, trust, bigSubject, "the big image")
	if v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(reject.VerificationLimit) || !strings.Contains(v.Reasons[0].Message, "over its limit of 64 MiB") {
		t.Errorf("the big image: %+v; want a verification-limit rejection", v)
	}
	// The gate logs the verdict after it pushed it, so the log is read
	// once it holds that line.
	var log []byte
	harness.WaitUntil(t, "the gate to log its verdict on the big image", 10*time.Second, 50*time.Millisecond, func() (bool, error) {
		var err error
		log, err = os.ReadFile(reg.Gate.LogPath)
		return bytes.Contains(log, []byte(`msg="verdict given" subject=`+bigSubject.String())), err
	})
	if n := bytes.Count(log, []byte("acme/big@"+bigSubject.DigestStr()+" used ")); n != gate.MaxOverLimit {
		t.Errorf("the big image went past its limit %d times; want %d before the verdict", n, gate.MaxOverLimit)
	}
	harness.WaitUntil(t, "the gate to answer its health check", 10*time.Second, 100*time.Millisecond, func() (bool, error) {
		resp, err := http.Get(reg.Gate.HealthURL + "/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// awaitVerdict waits up to a minute for the verdict on subject that a
// key trust holds signed.
func awaitVerdict(t *testing.T, rc *registry.Client, trust *trust.Verifier, subject name.Digest, what string) *api.Verdict {
	t.Helper()
	var v *api.Verdict
	harness.WaitUntil(t, "the gate's verdict on "+what, time.Minute, 100*time.Millisecond, func() (bool, error) {
		var err error
		v, err = verdict.Find(t.Context(), rc, trust, subject)
		if errors.Is(err, verdict.ErrNoVerdict) {
			return false, nil
		}
		return err == nil, err
	})
	return v
}

// providerTrust trusts the process's provider key, as a hub does.
func providerTrust(t *testing.T) *trust.Verifier {
	t.Helper()
	_, pub := harness.ProviderKeyFiles(t)
	return harness.TrustKeyFile(t, pub)
}
