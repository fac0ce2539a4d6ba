package diskimage

import (
	"archive/tar"
	"context"
	"encoding/json"
	"io"
	"log"
	"math/rand/v2"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/registry"
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

func testClient(t *testing.T, opts ...registry.Option) *registry.Client {
	t.Helper()
	c, err := registry.New(append([]registry.Option{registry.WithCacheDir(t.TempDir())}, opts...)...)
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

// mustReference parses s in FormImage and converts it with c.
func mustReference(t *testing.T, c *registry.Client, s string) name.Reference {
	t.Helper()
	r, err := imageref.Parse(s, imageref.FormImage)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Reference(r)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
