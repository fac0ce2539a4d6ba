package gate

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// env is an in-process registry, a client of it and a verifier.
type env struct {
	host string
	reg  *registry.Client
	v    *Verifier
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	c, err := registry.New(registry.WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return &env{host: u.Host, reg: c, v: &Verifier{Registry: c, TempDir: t.TempDir(), Engine: "test", Version: "v0"}}
}

// rawDisk is a sparse raw disk of size bytes with random data in three
// places.
func rawDisk(t *testing.T, size int64, seed uint64) []byte {
	t.Helper()
	b := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, 7))
	for _, off := range []int64{0, size / 3, size - 64<<10} {
		for i := off; i < off+64<<10; i++ {
			b[i] = byte(rng.Uint32())
		}
	}
	return b
}

// importDisk pushes disk as imagectl import does and returns the digest.
func (e *env) importDisk(t *testing.T, repo string, disk []byte, opts containerdisk.Options, io publish.ImportOptions) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(p, disk, 0o644); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(p)
	t.Cleanup(func() { f.Close() })
	img, err := convert.Open(f, int64(len(disk)), convert.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := containerdisk.NewDisk(img, opts)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(e.host + "/" + repo + ":v1")
	res, err := (&publish.Importer{Registry: e.reg}).Import(t.Context(), tag, d, staticSource(digest.FromBytes(disk).String()), io)
	if err != nil {
		t.Fatal(err)
	}
	return res.Digest
}

type staticSource string

func (s staticSource) WaitDigest(context.Context) (string, error) { return string(s), nil }
func (staticSource) DigestDeferred() bool                         { return false }
func (staticSource) UploadName() string                           { return "" }

func (e *env) verify(t *testing.T, repo, dgst string) *api.Verdict {
	t.Helper()
	ref, err := name.NewDigest(e.host + "/" + repo + "@" + dgst)
	if err != nil {
		t.Fatal(err)
	}
	verdict, err := e.v.Verify(t.Context(), ref)
	if err != nil {
		t.Fatalf("verify %s: %v", ref, err)
	}
	return verdict
}

// TestImagectlImageIsItsOwnCanonicalImage: an image built the way
// imagectl import builds it verifies to itself, for each disk format and
// compression, and a small disk's padded gzip layer too, so the gate
// writes nothing for it.
func TestImagectlImageIsItsOwnCanonicalImage(t *testing.T) {
	e := newEnv(t)
	reg := &countingRegistry{Registry: e.reg}
	e.v.Registry = reg
	for _, disk := range [][]byte{rawDisk(t, 8<<20, 1), make([]byte, 1<<20)} {
		for _, format := range []convert.Format{convert.FormatQCOW2, convert.FormatRaw} {
			for _, comp := range []containerdisk.Compression{containerdisk.CompressionGzip, containerdisk.CompressionZstd, containerdisk.CompressionNone} {
				repo := fmt.Sprintf("acme/%s-%s-%d", format, comp, len(disk))
				d := e.importDisk(t, repo, disk, containerdisk.Options{DiskFormat: format, Compression: comp},
					publish.ImportOptions{Labels: map[string]string{"team": "os"}, DefaultInstancetype: "u1.small", Created: time.Unix(1700000000, 0), OSName: "fedora-41"})
				reg.writes.Store(0)
				v := e.verify(t, repo, d)
				if v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
					t.Fatalf("%s: %+v", repo, v)
				}
				im := v.Images[0]
				if im.Canonical != d || im.Source != d || im.Format != string(format) || im.VirtualSize != int64(len(disk)) || im.Instancetype != "u1.small" {
					t.Errorf("%s: %+v; want canonical = source = %s", repo, im, d)
				}
				if n := reg.writes.Load(); n != 0 {
					t.Errorf("%s: the gate made %d writes to the registry for an image that is its own canonical image", repo, n)
				}
			}
		}
	}
}

// countingRegistry is a Registry that counts the verifier's writes and
// the times it opens each blob.
type countingRegistry struct {
	Registry
	writes atomic.Int32
	mu     sync.Mutex
	opens  map[string]int
}

func (c *countingRegistry) OpenBlob(ctx context.Context, repo name.Repository, digest string) (io.ReadCloser, error) {
	c.mu.Lock()
	if c.opens == nil {
		c.opens = map[string]int{}
	}
	c.opens[digest]++
	c.mu.Unlock()
	return c.Registry.OpenBlob(ctx, repo, digest)
}

func (c *countingRegistry) Upload(ctx context.Context, repo name.Repository, b registry.Blob) (registry.Uploaded, error) {
	c.writes.Add(1)
	return c.Registry.Upload(ctx, repo, b)
}

func (c *countingRegistry) Push(ctx context.Context, ref name.Reference, m remote.Taggable) (name.Digest, error) {
	c.writes.Add(1)
	return c.Registry.Push(ctx, ref, m)
}

// opened is how many times blob d was opened.
func (c *countingRegistry) opened(d string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opens[d]
}

// pushRaw pushes blobs and a manifest as any OCI client could and
// returns the manifest's digest.
func (e *env) pushRaw(t *testing.T, repo string, manifest []byte, mediaType string, blobs ...[]byte) string {
	t.Helper()
	r, err := name.NewRepository(e.host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blobs {
		pushBlob(t, e.reg, r, b)
	}
	d := digest.FromBytes(manifest).String()
	if _, err := e.reg.Push(t.Context(), r.Tag("v1"), registry.RawManifest{MediaType: types.MediaType(mediaType), Bytes: manifest}); err != nil {
		t.Fatal(err)
	}
	return d
}

// crafted is an image built by hand, each part open to change.
type crafted struct {
	layer          []byte
	layerMediaType string
	diffID         string
	config         ocispec.Image
	layerDesc      map[string]any // extra descriptor fields
	annotations    map[string]string
}

// craftImage is a containerDisk of disk as another tool builds it: a tar
// with its own headers (mtime, names), gzip-compressed.
func craftImage(t *testing.T, disk []byte) *crafted {
	t.Helper()
	tb := foreignTar(disk)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tb)
	zw.Close()
	return &crafted{
		layer: gz.Bytes(), layerMediaType: ocispec.MediaTypeImageLayerGzip, diffID: digest.FromBytes(tb).String(),
		config: ocispec.Image{Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"}},
	}
}

// foreignTar is a containerDisk tar of disk as another tool writes it:
// headers of its own (mtime, owner name).
func foreignTar(disk []byte) []byte {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	mt := time.Unix(1600000000, 0)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: 107, Gid: 107, ModTime: mt, Uname: "qemu"})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: 107, Gid: 107, Size: int64(len(disk)), ModTime: mt, Uname: "qemu"})
	tw.Write(disk)
	tw.Close()
	return tb.Bytes()
}

func (c *crafted) push(t *testing.T, e *env, repo string) string {
	t.Helper()
	cfg := c.config
	cfg.RootFS = ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.Digest(c.diffID)}}
	cfgBytes, _ := json.Marshal(cfg)
	layer := map[string]any{"mediaType": c.layerMediaType, "digest": digest.FromBytes(c.layer), "size": len(c.layer)}
	for k, v := range c.layerDesc {
		layer[k] = v
	}
	m := map[string]any{
		"schemaVersion": 2, "mediaType": ocispec.MediaTypeImageManifest,
		"config": ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfgBytes), Size: int64(len(cfgBytes))},
		"layers": []any{layer},
	}
	if c.annotations != nil {
		m["annotations"] = c.annotations
	}
	mb, _ := json.Marshal(m)
	return e.pushRaw(t, repo, mb, ocispec.MediaTypeImageManifest, cfgBytes, c.layer)
}

// TestForeignImageIsNormalised: a containerDisk another tool built is
// accepted and published anew, and the canonical image holds the same
// guest disk in imagepipe's own layer.
func TestForeignImageIsNormalised(t *testing.T) {
	e := newEnv(t)
	disk := rawDisk(t, 4<<20, 2)
	d := craftImage(t, disk).push(t, e, "acme/foreign")
	v := e.verify(t, "acme/foreign", d)
	if v.Verdict != api.VerdictAccepted {
		t.Fatalf("%+v", v)
	}
	im := v.Images[0]
	if im.Canonical == d || im.Format != "raw" {
		t.Fatalf("%+v", im)
	}
	// The canonical image is what imagectl would have built: it verifies
	// to itself, and its disk is the pushed one.
	again := e.verify(t, "acme/foreign", im.Canonical)
	if again.Verdict != api.VerdictAccepted || again.Images[0].Canonical != im.Canonical {
		t.Errorf("the canonical image does not verify to itself: %+v", again)
	}
}

// amplifier is a 512 MiB qcow2 disk of 320 KiB whose one data cluster
// is mapped 8192 times: its header is valid, its tables are not.
func amplifier() []byte {
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
	const copied = 1 << 63
	be.PutUint64(b[cs:], copied|3*cs)
	for j := range 8192 {
		be.PutUint64(b[3*cs+8*j:], copied|4*cs)
	}
	copy(b[4*cs:], bytes.Repeat([]byte("amplify!"), cs/8))
	return b
}

// TestHostileImagesAreRejected: each way of making the gate and CDI read
// two different images, and a disk whose header passes but whose tables
// amplify, is a rejection with its reason.
func TestHostileImagesAreRejected(t *testing.T) {
	e := newEnv(t)
	disk := rawDisk(t, 1<<20, 3)
	cases := map[string]struct {
		edit func(c *crafted)
		want reject.Reason
	}{
		"gzip bytes under the tar media type": {func(c *crafted) { c.layerMediaType = ocispec.MediaTypeImageLayer }, reject.LayerMediaType},
		"a layer descriptor with urls": {func(c *crafted) {
			c.layerDesc = map[string]any{"urls": []string{"http://169.254.169.254/disk.tar.gz"}}
		}, reject.ManifestShape},
		"a layer descriptor with data":      {func(c *crafted) { c.layerDesc = map[string]any{"data": "aGVsbG8="} }, reject.ManifestShape},
		"a diff ID that is not the layer's": {func(c *crafted) { c.diffID = digest.FromString("other").String() }, reject.ManifestShape},
		"an environment variable CDI would read": {func(c *crafted) {
			c.config.Config.Env = []string{"KUBEVIRT_IO_EVIL=1"}
		}, reject.ManifestShape},
		"a config for another OS": {func(c *crafted) { c.config.OS = "windows" }, reject.ManifestShape},
		"a virtual size annotation that lies": {func(c *crafted) {
			c.annotations = map[string]string{api.AnnotationVirtualSize: "4096"}
		}, reject.AnnotationMismatch},
		"a qcow2 whose one cluster is mapped 8192 times": {func(c *crafted) {
			*c = *craftImage(t, amplifier())
		}, reject.SharedCluster},
	}
	for name, tc := range cases {
		c := craftImage(t, disk)
		tc.edit(c)
		repo := "acme/" + strings.ToLower(strings.NewReplacer(" ", "-", "'", "").Replace(name))
		v := e.verify(t, repo, c.push(t, e, repo))
		if v.Verdict != api.VerdictRejected || len(v.Reasons) != 1 || v.Reasons[0].Code != string(tc.want) || len(v.Images) != 0 {
			t.Errorf("%s: %+v; want rejected for %s", name, v, tc.want)
		}
	}
}

// TestManifestReadingsMustAgree: a manifest the registry serves as one
// type while its body says another, and one with a key twice, are
// rejected before anything they name is read.
func TestManifestReadingsMustAgree(t *testing.T) {
	e := newEnv(t)
	c := craftImage(t, rawDisk(t, 1<<20, 4))
	good := c.push(t, e, "acme/good")
	raw, err := e.reg.FetchManifest(t.Context(), mustDigest(t, e.host+"/acme/good@"+good))
	if err != nil {
		t.Fatal(err)
	}
	asDocker := e.pushRaw(t, "acme/content-type", raw.Bytes, "application/vnd.docker.distribution.manifest.v2+json")
	dup := bytes.Replace(raw.Bytes, []byte(`"schemaVersion":2`), []byte(`"schemaVersion":2,"schemaVersion":2`), 1)
	twice := e.pushRaw(t, "acme/twice", dup, ocispec.MediaTypeImageManifest)
	for repo, d := range map[string]string{"acme/content-type": asDocker, "acme/twice": twice} {
		v := e.verify(t, repo, d)
		if v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(reject.ManifestShape) {
			t.Errorf("%s: %+v; want a %s rejection", repo, v, reject.ManifestShape)
		}
	}
}

func mustDigest(t *testing.T, s string) name.Digest {
	t.Helper()
	d, err := name.NewDigest(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestMoreReadingsAreRejected: more ways for one push to mean two things,
// each refused by the gate: a second compression inside the first, a hard
// link or a symlink where the disk should be, a disk under a GNU long
// name that is not disk/disk.img, and indexes that readers resolve
// differently.
func TestMoreReadingsAreRejected(t *testing.T) {
	e := newEnv(t)
	disk := rawDisk(t, 1<<20, 7)
	entry := func(h *tar.Header, data []byte) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: 107, Gid: 107})
		tw.WriteHeader(h)
		tw.Write(data)
		tw.Close()
		return b.Bytes()
	}
	withTar := func(tb []byte) func(*crafted) {
		return func(c *crafted) {
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			zw.Write(tb)
			zw.Close()
			c.layer, c.diffID = gz.Bytes(), digest.FromBytes(tb).String()
		}
	}
	cases := map[string]struct {
		edit func(*crafted)
		want reject.Reason
	}{
		"gzip inside gzip": {func(c *crafted) {
			inner := c.layer
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			zw.Write(inner)
			zw.Close()
			c.layer, c.diffID = gz.Bytes(), digest.FromBytes(inner).String()
		}, reject.InvalidLayer},
		"a hard link as the disk": {withTar(entry(&tar.Header{Typeflag: tar.TypeLink, Name: api.DiskPath, Linkname: "/etc/passwd", Mode: 0o444, Uid: 107, Gid: 107}, nil)), reject.TarEntry},
		"a symlink as the disk":   {withTar(entry(&tar.Header{Typeflag: tar.TypeSymlink, Name: api.DiskPath, Linkname: "/etc/passwd", Mode: 0o444, Uid: 107, Gid: 107}, nil)), reject.TarEntry},
		"a GNU long name":         {withTar(entry(&tar.Header{Typeflag: tar.TypeReg, Name: "disk/" + strings.Repeat("d", 120) + ".img", Mode: 0o444, Uid: 107, Gid: 107, Size: int64(len(disk)), Format: tar.FormatGNU}, disk)), reject.TarEntry},
		"a Docker foreign layer": {func(c *crafted) {
			c.layerMediaType = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
		}, reject.LayerMediaType},
	}
	for name, tc := range cases {
		c := craftImage(t, disk)
		tc.edit(c)
		repo := "acme/" + strings.ToLower(strings.NewReplacer(" ", "-").Replace(name))
		v := e.verify(t, repo, c.push(t, e, repo))
		if v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(tc.want) {
			t.Errorf("%s: %+v; want rejected for %s", name, v, tc.want)
		}
	}

	// Indexes: an entry whose media type is not what the registry serves,
	// an index inside an index, the same platform twice, and an entry
	// whose config names another platform.
	good := craftImage(t, disk).push(t, e, "acme/parts")
	goodRaw, err := e.reg.FetchManifest(t.Context(), mustDigest(t, e.host+"/acme/parts@"+good))
	if err != nil {
		t.Fatal(err)
	}
	arm := craftImage(t, disk)
	arm.config.Architecture = "arm64"
	armDigest := arm.push(t, e, "acme/parts")
	index := func(entries ...map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": ocispec.MediaTypeImageIndex, "manifests": entries})
		return b
	}
	desc := func(d, mt string, size int, arch string) map[string]any {
		return map[string]any{"mediaType": mt, "digest": d, "size": size, "platform": map[string]string{"os": "linux", "architecture": arch}}
	}
	amd := desc(good, ocispec.MediaTypeImageManifest, len(goodRaw.Bytes), "amd64")
	inner := index(amd)
	indexes := map[string]struct {
		doc   []byte
		blobs [][]byte
		want  reject.Reason
	}{
		"an entry typed as a Docker manifest": {index(desc(good, "application/vnd.docker.distribution.manifest.v2+json", len(goodRaw.Bytes), "amd64")), nil, reject.ManifestShape},
		"the same platform twice":             {index(amd, amd), nil, reject.ManifestShape},
		"an arm64 image listed as amd64":      {index(desc(armDigest, ocispec.MediaTypeImageManifest, 0, "amd64")), nil, reject.PlatformMismatch},
		"an index in an index":                {index(desc(digest.FromBytes(inner).String(), ocispec.MediaTypeImageIndex, len(inner), "amd64")), [][]byte{inner}, reject.ManifestShape},
	}
	for what, tc := range indexes {
		repo := "acme/parts"
		for _, b := range tc.blobs {
			r, _ := name.NewRepository(e.host + "/" + repo)
			if _, err := e.reg.Push(t.Context(), r.Digest(digest.FromBytes(b).String()), registry.RawManifest{MediaType: types.OCIImageIndex, Bytes: b}); err != nil {
				t.Fatal(err)
			}
		}
		d := e.pushRaw(t, repo, tc.doc, ocispec.MediaTypeImageIndex)
		v := e.verify(t, repo, d)
		if v.Verdict != api.VerdictRejected || v.Reasons[0].Code != string(tc.want) {
			t.Errorf("%s: %+v; want rejected for %s", what, v, tc.want)
		}
	}
}

// TestImagepipeHeadersAnotherEnd: a tar with imagepipe's own headers and
// disk but more zero padding after its end marker (as tools padding to
// 10 KiB records write) is not taken for imagepipe's tar: the canonical
// image gets imagepipe's layer, whose diff ID its config names, and it
// verifies to itself.
func TestImagepipeHeadersAnotherEnd(t *testing.T) {
	e := newEnv(t)
	disk := rawDisk(t, 1<<20, 15)
	var tb bytes.Buffer
	if _, err := containerdisk.WriteLayer(t.Context(), io.Discard, payload(disk), containerdisk.CompressionNone, &tb); err != nil {
		t.Fatal(err)
	}
	canonicalTar := digest.FromBytes(tb.Bytes()).String()
	tb.Write(make([]byte, 9*1024))
	d := gzippedTar(tb.Bytes()).push(t, e, "acme/padded")
	v := e.verify(t, "acme/padded", d)
	if v.Verdict != api.VerdictAccepted || v.Images[0].Canonical == d {
		t.Fatalf("%+v", v)
	}
	raw, err := e.reg.FetchManifest(t.Context(), mustDigest(t, e.host+"/acme/padded@"+v.Images[0].Canonical))
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw.Bytes, &m); err != nil {
		t.Fatal(err)
	}
	cfg, err := e.v.readBlob(t.Context(), mustDigest(t, e.host+"/acme/padded@"+d).Context(), m.Config, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var img ocispec.Image
	if err := json.Unmarshal(cfg, &img); err != nil || img.RootFS.DiffIDs[0].String() != canonicalTar {
		t.Errorf("the canonical config names diff ID %v (%v); want imagepipe's tar %s", img.RootFS.DiffIDs, err, canonicalTar)
	}
	if again := e.verify(t, "acme/padded", v.Images[0].Canonical); again.Verdict != api.VerdictAccepted || again.Images[0].Canonical != v.Images[0].Canonical {
		t.Errorf("the canonical image does not verify to itself: %+v", again)
	}
}

// gzippedTar is a linux/amd64 image whose layer is tarBytes, gzipped.
func gzippedTar(tarBytes []byte) *crafted {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarBytes)
	zw.Close()
	return &crafted{layer: gz.Bytes(), layerMediaType: ocispec.MediaTypeImageLayerGzip, diffID: digest.FromBytes(tarBytes).String(),
		config: ocispec.Image{Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"}}}
}

// payload is a disk held in memory, as containerdisk writes it.
type payload []byte

func (p payload) Size() int64 { return int64(len(p)) }
func (p payload) Write(_ context.Context, w io.Writer) error {
	_, err := w.Write(p)
	return err
}

// qcow2Of is the qcow2 file imagectl stores for raw.
func qcow2Of(t *testing.T, raw []byte) []byte {
	t.Helper()
	img, err := convert.Open(bytes.NewReader(raw), int64(len(raw)), convert.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := img.Plan(t.Context(), convert.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := p.Write(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestOwnQCOW2IsVerifiedAsItStreams: imagectl's qcow2 disk is verified as
// it streams, without its copy in the spool; one with imagepipe's tables
// whose data is not imagepipe's (a stored cluster of zeros) is verified
// from that copy, without a second read, and normalised, and its
// canonical image streams.
func TestOwnQCOW2IsVerifiedAsItStreams(t *testing.T) {
	e := newEnv(t)
	var logs bytes.Buffer
	e.v.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	raw := rawDisk(t, 4<<20, 3)
	d := e.importDisk(t, "acme/own", raw, containerdisk.Options{DiskFormat: convert.FormatQCOW2, Compression: containerdisk.CompressionZstd}, publish.ImportOptions{})
	if v := e.verify(t, "acme/own", d); v.Verdict != api.VerdictAccepted || v.Images[0].Canonical != d {
		t.Fatalf("%+v", v)
	}
	if !strings.Contains(logs.String(), "streamed=true") || strings.Contains(logs.String(), "reading the layer again") {
		t.Fatalf("imagectl's qcow2 was not verified as it streamed:\n%s", logs.String())
	}

	file := qcow2Of(t, raw)
	clear(file[len(file)-64<<10:]) // the last data cluster, stored as zeros
	var tb bytes.Buffer
	if _, err := containerdisk.WriteLayer(t.Context(), io.Discard, payload(file), containerdisk.CompressionNone, &tb); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	zeroed := gzippedTar(tb.Bytes()).push(t, e, "acme/zeroed")
	v := e.verify(t, "acme/zeroed", zeroed)
	if v.Verdict != api.VerdictAccepted || v.Images[0].Canonical == zeroed || v.Images[0].DiskSize >= int64(len(file)) {
		t.Fatalf("%+v; want accepted with a smaller canonical disk", v)
	}
	if strings.Contains(logs.String(), "reading the layer again") || !strings.Contains(logs.String(), "streamed=false") {
		t.Fatalf("the zeroed cluster was not verified from the spool's copy:\n%s", logs.String())
	}
	logs.Reset()
	if again := e.verify(t, "acme/zeroed", v.Images[0].Canonical); again.Images[0].Canonical != v.Images[0].Canonical || !strings.Contains(logs.String(), "streamed=true") {
		t.Errorf("the canonical image does not verify to itself as it streams: %+v\n%s", again, logs.String())
	}
}

// pushBlob uploads b into repo unless it holds it.
func pushBlob(t *testing.T, reg *registry.Client, repo name.Repository, b []byte) {
	t.Helper()
	d := digest.FromBytes(b).String()
	if _, err := reg.Upload(t.Context(), repo, registry.Blob{Digest: d, Write: func(ctx context.Context, w io.Writer) (string, map[string]string, error) {
		_, err := w.Write(b)
		return d, nil, err
	}}); err != nil {
		t.Fatal(err)
	}
}
