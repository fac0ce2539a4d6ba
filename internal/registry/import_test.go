package registry

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// testRegistry starts go-containerregistry's in-process registry.
func testRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func testClient(t *testing.T, opts ...Option) *Client {
	t.Helper()
	c, err := New(append([]Option{WithCacheDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testDisk writes a sparse raw disk with some random data and opens it.
func testDisk(t *testing.T, size int64, seed uint64) testSrc {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.raw")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for _, off := range []int64{0, size / 3, size - int64(len(data))} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	img, err := convert.Open(f, size, convert.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return testSrc{Image: img, Digest: "sha256:" + strings.Repeat("ab", 32)}
}

// testSrc is a disk and where it came from: its digest, known at once or
// (wait) once computed.
type testSrc struct {
	Image  *convert.Image
	Digest string
	wait   func(context.Context) (string, error)
}

func (s testSrc) WaitDigest(ctx context.Context) (string, error) {
	if s.wait != nil {
		return s.wait(ctx)
	}
	return s.Digest, nil
}

func (s testSrc) DigestDeferred() bool { return s.Digest == "" && s.wait != nil }
func (s testSrc) UploadName() string   { return "" }

// disk is the containerDisk of s's image, stored as opts say.
func (s testSrc) disk(t testing.TB, opts containerdisk.Options) *containerdisk.Disk {
	t.Helper()
	d, err := containerdisk.NewDisk(s.Image, opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// pullDisk fetches ref and returns its manifest, config and the tar entries
// of its single layer, with disk/disk.img's bytes.
func pullDisk(t *testing.T, ref string) (manifest map[string]any, labels map[string]string, entries []*tar.Header, disk []byte) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := img.RawManifest()
	json.Unmarshal(raw, &manifest)
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	labels = cfg.Config.Labels
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, h)
		if h.Name == api.DiskPath {
			if disk, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return manifest, labels, entries, disk
}

func TestImportContainerDiskShape(t *testing.T) {
	host := testRegistry(t)
	for _, tc := range []struct {
		disk convert.Format
		comp containerdisk.Compression
	}{{convert.FormatQCOW2, containerdisk.CompressionGzip}, {convert.FormatRaw, containerdisk.CompressionZstd}, {convert.FormatQCOW2, containerdisk.CompressionNone}} {
		t.Run(string(tc.disk)+"-"+string(tc.comp), func(t *testing.T) {
			src := testDisk(t, 8<<20, 1)
			c := testClient(t)
			ref := mustTag(t, host+"/acme/disk:"+string(tc.disk)+"-"+string(tc.comp))
			res, err := c.Import(t.Context(), ref, src.disk(t, containerdisk.Options{DiskFormat: tc.disk, Compression: tc.comp}), src, ImportOptions{
				DefaultInstancetype: "u1.medium", Labels: map[string]string{"team": "a"}})
			if err != nil {
				t.Fatal(err)
			}
			manifest, labels, entries, disk := pullDisk(t, res.Pinned)
			if manifest["mediaType"] != "application/vnd.oci.image.manifest.v1+json" {
				t.Errorf("manifest media type %v", manifest["mediaType"])
			}
			if len(entries) != 2 || entries[0].Name != "disk/" || entries[1].Name != "disk/disk.img" {
				t.Fatalf("tar entries: %v", entries)
			}
			for _, h := range entries {
				if h.Uid != 107 || h.Gid != 107 {
					t.Errorf("%s owned by %d:%d", h.Name, h.Uid, h.Gid)
				}
			}
			if entries[0].Mode&0o777 != 0o555 || entries[1].Mode&0o777 != 0o444 {
				t.Errorf("modes %o %o", entries[0].Mode, entries[1].Mode)
			}
			// The disk in the layer converts back to the source.
			back, err := convert.Open(bytes.NewReader(disk), int64(len(disk)), convert.OpenOptions{Format: tc.disk})
			if err != nil {
				t.Fatal(err)
			}
			p, _ := back.Plan(t.Context(), convert.Options{To: convert.FormatRaw})
			var got bytes.Buffer
			if err := p.Write(t.Context(), &got); err != nil {
				t.Fatal(err)
			}
			rp, _ := src.Image.Plan(t.Context(), convert.Options{To: convert.FormatRaw})
			var want bytes.Buffer
			if err := rp.Write(t.Context(), &want); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				t.Error("the disk in the layer differs from the source")
			}
			if labels[api.AnnotationDiskFormat] != string(tc.disk) || labels["team"] != "a" || labels[api.AnnotationSourceDigest] != src.Digest {
				t.Errorf("labels %v", labels)
			}
		})
	}
}

func TestImportIsReproducibleAndReimportOnlyTags(t *testing.T) {
	host := testRegistry(t)
	src := testDisk(t, 4<<20, 2)
	c := testClient(t)
	a, err := c.Import(t.Context(), mustTag(t, host+"/acme/a:1"), src.disk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Another client (no build cache) builds the same image from scratch.
	b, err := testClient(t).Import(t.Context(), mustTag(t, host+"/acme/b:1"), src.disk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest || a.Reused || b.Reused {
		t.Fatalf("two builds of the same input: %s (reused %v) and %s (reused %v)", a.Digest, a.Reused, b.Digest, b.Reused)
	}
	again, err := c.Import(t.Context(), mustTag(t, host+"/acme/a:2"), src.disk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Reused || again.Digest != a.Digest || again.UploadedBytes != 0 {
		t.Errorf("re-import: %+v", again)
	}
	// The client that built it mounts it into a third repository.
	mounted, err := c.Import(t.Context(), mustTag(t, host+"/acme/c:1"), src.disk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !mounted.Reused || mounted.Digest != a.Digest || mounted.UploadedBytes != 0 {
		t.Errorf("import into another repository: %+v", mounted)
	}
	other, err := c.Import(t.Context(), mustTag(t, host+"/acme/a:3"), src.disk(t, containerdisk.Options{Compression: containerdisk.CompressionZstd}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if other.Reused || other.Digest == a.Digest {
		t.Errorf("different options reused the image: %+v", other)
	}
}

func TestImportRejectedPushesNothing(t *testing.T) {
	host := testRegistry(t)
	c := testClient(t)
	// A qcow2 whose only compressed cluster is garbage: detected while
	// streaming, after the upload has started.
	bad := testSrc{Image: corruptCompressedQCOW2(t), Digest: "sha256:" + strings.Repeat("cd", 32)}
	_, err := c.Import(t.Context(), mustTag(t, host+"/acme/bad:1"), bad.disk(t, containerdisk.Options{}), bad, ImportOptions{})
	if reject.As(err) == nil {
		t.Fatalf("import of a corrupt image: %v, want a rejection", err)
	}
	tags, err := remote.List(mustTag(t, host+"/acme/bad:1").Context())
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return // no repository, no tag
	}
	if err != nil {
		t.Fatalf("listing the tags after a rejected import: %v", err)
	}
	if len(tags) > 0 {
		t.Errorf("tags after a rejected import: %v", tags)
	}
}

// corruptCompressedQCOW2 builds, by hand, a 64 KiB-cluster qcow2 with one
// compressed cluster holding garbage.
func corruptCompressedQCOW2(t *testing.T) *convert.Image {
	t.Helper()
	const cs = 65536
	b := make([]byte, 5*cs)
	be := func(off int, v uint64, n int) {
		for i := n - 1; i >= 0; i-- {
			b[off+i] = byte(v)
			v >>= 8
		}
	}
	copy(b, "QFI\xfb")
	be(4, 3, 4)
	be(20, 16, 4)
	be(24, 1<<20, 8) // 1 MiB virtual
	be(36, 1, 4)
	be(40, cs, 8)   // L1 at cluster 1
	be(48, 3*cs, 8) // refcount table at cluster 3
	be(56, 1, 4)
	be(96, 4, 4)
	be(100, 104, 4)
	be(cs, 1<<63|2*cs, 8) // L1[0] → L2 at cluster 2
	// L2[0]: compressed, 2 sectors at cluster 4.
	be(2*cs, 1<<62|1<<54|4*cs, 8)
	for i := 4 * cs; i < 4*cs+1024; i++ {
		b[i] = 0xff
	}
	img, err := convert.Open(bytes.NewReader(b), int64(len(b)), convert.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestParseReference(t *testing.T) {
	c := testClient(t)
	for ref, ok := range map[string]bool{
		"registry.example.com/acme/rhel:10":       true,
		"127.0.0.1:5000/acme/team/rhel:10":        true,
		"registry.example.com/rhel:10":            false, // no tenant
		"registry.example.com/Acme/rhel:10":       false, // not a valid reference
		"registry.example.com/-acme/rhel:10":      false,
		"registry.example.com/acme/rhel:bad tag!": false,
	} {
		r, err := imageref.Parse(ref, imageref.FormImage)
		if err == nil {
			_, err = c.Reference(r)
		}
		if (err == nil) != ok {
			t.Errorf("Parse and Reference of %q: %v, want ok=%v", ref, err, ok)
		}
	}
}

// TestImportWhileHashing: with the digest still being computed, the build
// starts at once; the result is the same image, and once an identical
// image exists a second import only tags it.
func TestImportWhileHashing(t *testing.T) {
	host := testRegistry(t)
	known := testDisk(t, 4<<20, 5)
	c := testClient(t)
	want, err := testClient(t).Import(t.Context(), mustTag(t, host+"/acme/known:1"), known.disk(t, containerdisk.Options{}), known, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	later := testSrc{Image: known.Image, wait: func(ctx context.Context) (string, error) {
		select {
		case <-release:
			return known.Digest, nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}}
	close(release)
	got, err := c.Import(t.Context(), mustTag(t, host+"/acme/later:1"), later.disk(t, containerdisk.Options{}), later, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != want.Digest || got.SourceDigest != known.Digest {
		t.Errorf("while hashing: %+v, want digest %s", got, want.Digest)
	}
	again, err := c.Import(t.Context(), mustTag(t, host+"/acme/later:2"), later.disk(t, containerdisk.Options{}), later, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Reused || again.Digest != want.Digest {
		t.Errorf("second import while hashing: %+v", again)
	}
	failing := testSrc{Image: known.Image, wait: func(context.Context) (string, error) {
		return "", errors.New("disk read error")
	}}
	if _, err := c.Import(t.Context(), mustTag(t, host+"/acme/later:3"), failing.disk(t, containerdisk.Options{}), failing, ImportOptions{}); err == nil || !strings.Contains(err.Error(), "disk read error") {
		t.Errorf("hashing failure: %v", err)
	}
}
