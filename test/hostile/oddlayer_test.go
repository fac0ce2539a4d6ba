package hostile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/oddlayer"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestOddLayersGetImagepipesCanonicalImage pushes a disk imagepipe's
// writer made, in each layer test/oddlayer builds (PAX records, GNU long
// names and links, owner names, padding, gzip header fields and members,
// zstd skippable and extra frames, bytes after the stream), to the CNCF
// registry with image-gate beside it. Each signed verdict is the expected
// rejection, or an acceptance whose canonical image holds imagepipe's tar
// of the disk under the diff ID its config names, in a layer that is the
// pushed one only where the pushed tar and compression framing are
// imagepipe's; and crane validate accepts every canonical image with a
// gzip layer (it reads layers with a gzip reader only).
func TestOddLayersGetImagepipesCanonicalImage(t *testing.T) {
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate})
	trust := providerTrust(t)
	rc, err := registry.New(registry.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	crane := harness.Binary(t, "crane")
	raw := make([]byte, 4<<20)
	rng := rand.New(rand.NewPCG(34, 5))
	for i := range 256 << 10 {
		raw[1<<20+i] = byte(rng.Uint32())
	}
	disk, err := oddlayer.QCOW2(t.Context(), raw)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := oddlayer.Cases(t.Context(), disk)
	if err != nil {
		t.Fatal(err)
	}
	// imagectl's own images, whichever gzip its build has: each is its
	// own canonical image, for which the gate writes no layer.
	imported := map[string]name.Digest{}
	path := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, comp := range []string{"gzip", "zstd"} {
		repo := "acme/imagectl-" + comp
		r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl,
			Args: []string{"import", "--quiet", "-o", "json", "--compression", comp, path, reg.Host + "/" + repo + ":1"},
			Env:  []string{"IMAGEPIPE_CACHE=" + t.TempDir()}})
		var res api.ImportResult
		if err := json.Unmarshal([]byte(r.Stdout), &res); r.Code != 0 || err != nil {
			t.Fatalf("imagectl import --compression %s: exit %d (%v)\n%s%s", comp, r.Code, err, r.Stdout, r.Stderr)
		}
		if imported[repo], err = name.NewDigest(reg.Host+"/"+repo+"@"+res.Digest, name.Insecure); err != nil {
			t.Fatal(err)
		}
	}

	subjects := make([]name.Digest, len(cases))
	for i, c := range cases {
		ref, err := name.NewTag(fmt.Sprintf("%s/acme/odd-%02d:1", reg.Host, i), name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		subjects[i] = ref.Context().Digest(pushLayer(t, ref, c.Layer, c.MediaType, c.DiffID))
	}

	for repo, subject := range imported {
		v := awaitVerdict(t, rc, trust, subject, repo)
		if v.Verdict != api.VerdictAccepted || len(v.Images) != 1 || v.Images[0].Canonical != subject.DigestStr() {
			t.Errorf("%s: %s %+v; want accepted as its own canonical image", repo, v.Verdict, v.Images)
		}
	}

	canonicalTar := oddlayer.CanonicalTar(disk)
	rewritten := ""
	for i, c := range cases {
		v := awaitVerdict(t, rc, trust, subjects[i], c.Name)
		if c.Reject != "" {
			if v.Verdict != api.VerdictRejected || len(v.Reasons) != 1 || v.Reasons[0].Code != string(c.Reject) {
				t.Errorf("%s: %s %+v; want rejected for %s", c.Name, v.Verdict, v.Reasons, c.Reject)
			}
			continue
		}
		if v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
			t.Errorf("%s: %s %+v; want accepted", c.Name, v.Verdict, v.Reasons)
			continue
		}
		canonical := subjects[i].Context().Digest(v.Images[0].Canonical)
		layer, mediaType := checkCanonicalImage(t, c.Name, canonical, canonicalTar)
		if kept := digest.FromBytes(layer) == digest.FromBytes(c.Layer); kept != c.Kept {
			t.Errorf("%s: the pushed layer kept as the canonical one: %v; want %v", c.Name, kept, c.Kept)
		}
		if !c.Kept {
			rewritten = subjects[i].RepositoryStr()
		}
		// crane validate (go-containerregistry v0.22.1) reads every layer
		// through gzip, so it says "gzip: invalid header" of any zstd or
		// uncompressed layer; checkCanonicalImage made the same checks of
		// those (digest, size, diff ID, framing).
		if mediaType != ocispec.MediaTypeImageLayerGzip {
			continue
		}
		if r := testenv.RunCommand(t, testenv.Command{Name: crane, Args: []string{"validate", "--insecure", "--remote", canonical.String()}}); r.Code != 0 {
			t.Errorf("%s: crane validate --remote %s: exit %d\n%s%s", c.Name, canonical, r.Code, r.Stdout, r.Stderr)
		}
	}

	// The gate's log names each layer it writes: one for a rewritten
	// case, none for imagectl's images (read once their verdicts are
	// logged, after any layer written for them).
	var log []byte
	logged := func(what string, match func(line string) bool) {
		t.Helper()
		harness.WaitUntil(t, "the gate to log "+what, 10*time.Second, 50*time.Millisecond, func() (bool, error) {
			var err error
			log, err = os.ReadFile(reg.Gate.LogPath)
			return slices.ContainsFunc(strings.Split(string(log), "\n"), match), err
		})
	}
	written := func(repo string) func(string) bool {
		return func(line string) bool {
			return strings.Contains(line, `msg="canonical layer written"`) && strings.Contains(line, " repository="+repo+" ")
		}
	}
	logged("the layer it wrote for "+rewritten, written(rewritten))
	for repo, subject := range imported {
		logged("its verdict on "+repo, func(line string) bool {
			return strings.Contains(line, `msg="verdict given" subject=`+subject.String())
		})
		if slices.ContainsFunc(strings.Split(string(log), "\n"), written(repo)) {
			t.Errorf("the gate wrote a canonical layer for %s, an image imagectl built", repo)
		}
	}
}

// checkCanonicalImage reads the canonical image ref and checks that its
// layer decompresses to wantTar, under the diff ID its config names, and
// is framed as imagepipe's writers frame a layer. It returns the layer and
// its media type.
func checkCanonicalImage(t *testing.T, what string, ref name.Digest, wantTar []byte) ([]byte, string) {
	t.Helper()
	img, err := remote.Image(ref, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	m, err := img.Manifest()
	if err != nil || len(m.Layers) != 1 {
		t.Fatalf("%s: the canonical manifest: %v, %+v", what, err, m)
	}
	cfg, err := img.ConfigFile()
	if err != nil || len(cfg.RootFS.DiffIDs) != 1 {
		t.Fatalf("%s: the canonical config: %v, %+v", what, err, cfg)
	}
	l, err := img.LayerByDigest(m.Layers[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Compressed() // checks the blob's digest as it is read
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatalf("%s: reading the canonical layer: %v", what, err)
	}
	mediaType := string(m.Layers[0].MediaType)
	got, err := oddlayer.Tar(mediaType, layer)
	if err != nil {
		t.Fatalf("%s: decompressing the canonical layer: %v", what, err)
	}
	if d := digest.FromBytes(got).String(); d != cfg.RootFS.DiffIDs[0].String() {
		t.Errorf("%s: the canonical layer's tar is %s; its config names %s", what, d, cfg.RootFS.DiffIDs[0])
	}
	if !bytes.Equal(got, wantTar) {
		t.Errorf("%s: the canonical layer's tar (%d bytes) is not imagepipe's tar of the disk (%d bytes)", what, len(got), len(wantTar))
	}
	lr, err := containerdisk.OpenLayer(mediaType, bytes.NewReader(layer))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer lr.Close()
	if _, err := lr.CopyDisk(t.Context(), io.Discard); err != nil || !lr.OwnCompressionFraming() {
		t.Errorf("%s: the canonical layer's framing is not imagepipe's (%v)", what, err)
	}
	return layer, mediaType
}
