// Package disktest holds what the tests of the registry client and of
// containerDisk images share: an in-process registry, a small random disk
// that stands for an imported source, images pushed as any OCI client
// would, a reader of a pushed containerDisk and a recorder of progress
// reports. Only tests import it.
package disktest

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
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	godigest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Registry starts go-containerregistry's in-process registry for t and
// returns its host.
func Registry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// Disk writes a sparse raw disk of size bytes with some random data (from
// seed) and opens it.
func Disk(t *testing.T, size int64, seed uint64) Source {
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
	return Source{Image: img, Digest: "sha256:" + strings.Repeat("ab", 32)}
}

// Source is a disk and where it came from: its digest, known at once or
// (Wait) once computed. It is an import's registry.Source.
type Source struct {
	Image  *convert.Image
	Digest string
	Wait   func(context.Context) (string, error)
}

func (s Source) WaitDigest(ctx context.Context) (string, error) {
	if s.Wait != nil {
		return s.Wait(ctx)
	}
	return s.Digest, nil
}

func (s Source) DigestDeferred() bool { return s.Digest == "" && s.Wait != nil }
func (s Source) UploadName() string   { return "" }

// ContainerDisk is the containerDisk of s's image, stored as opts say.
func (s Source) ContainerDisk(t testing.TB, opts containerdisk.Options) *containerdisk.Disk {
	t.Helper()
	d, err := containerdisk.NewDisk(s.Image, opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustTag parses s as a tag.
func MustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// Pull fetches ref and returns its manifest, config labels and the tar
// entries of its single layer, with disk/disk.img's bytes.
func Pull(t *testing.T, ref string) (manifest map[string]any, labels map[string]string, entries []*tar.Header, disk []byte) {
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

// Progress records progress calls (its Report is a progress callback):
// how many, the last one, and whether done ever shrank or passed the
// total.
type Progress struct {
	mu          sync.Mutex
	calls       int
	done, total int64
	bad         bool
}

// Report is the progress callback.
func (l *Progress) Report(done, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if done < l.done || done > total {
		l.bad = true
	}
	l.done, l.total = done, total
}

// Finished fails t unless progress was reported, never went back or past
// the total, and ended at the total; it returns the total.
func (l *Progress) Finished(t *testing.T, what string) int64 {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.calls == 0 {
		t.Fatalf("%s: progress was never reported", what)
	}
	if l.bad {
		t.Errorf("%s: done shrank or passed the total", what)
	}
	if l.done != l.total {
		t.Errorf("%s: last report %d/%d, want done equal to the total", what, l.done, l.total)
	}
	return l.total
}

// PushLayers pushes an OCI image made of layers, with annotations (nil
// for none), to ref, as any OCI client could, and returns ref parsed.
func PushLayers(t *testing.T, ref string, annotations map[string]string, layers ...v1.Layer) name.Reference {
	t.Helper()
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		t.Fatal(err)
	}
	if annotations != nil {
		img = mutate.Annotations(img, annotations).(v1.Image)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return r
}

// PushRandomSubject pushes a small random image to repo ("HOST/REPO")
// and returns it pinned by digest with its manifest's descriptor: a
// subject to attach referrers to.
func PushRandomSubject(t *testing.T, repo string) (name.Digest, ocispec.Descriptor) {
	t.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	subject, err := name.NewDigest(repo + "@" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(subject, img); err != nil {
		t.Fatal(err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	mt, err := img.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	return subject, ocispec.Descriptor{MediaType: string(mt), Digest: godigest.Digest(d.String()), Size: int64(len(raw))}
}
