package publish

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/registry"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// testEnv is a registry client and an importer sharing one cache
// directory of the test's own.
type testEnv struct {
	*registry.Client
	im *Importer
}

func (e testEnv) Import(ctx context.Context, ref name.Tag, disk Disk, src Source, opts ImportOptions) (*api.ImportResult, error) {
	return e.im.Import(ctx, ref, disk, src, opts)
}

func testClient(t *testing.T, opts ...registry.Option) testEnv {
	t.Helper()
	dir := t.TempDir()
	c, err := registry.New(append([]registry.Option{registry.WithCacheDir(dir)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return testEnv{c, &Importer{Registry: c, CacheDir: dir}}
}

func TestImportContainerDiskShape(t *testing.T) {
	host := disktest.Registry(t)
	for _, tc := range []struct {
		disk convert.Format
		comp containerdisk.Compression
	}{{convert.FormatQCOW2, containerdisk.CompressionGzip}, {convert.FormatRaw, containerdisk.CompressionZstd}, {convert.FormatQCOW2, containerdisk.CompressionNone}} {
		t.Run(string(tc.disk)+"-"+string(tc.comp), func(t *testing.T) {
			src := disktest.Disk(t, 8<<20, 1)
			c := testClient(t)
			ref := disktest.MustTag(t, host+"/acme/disk:"+string(tc.disk)+"-"+string(tc.comp))
			res, err := c.Import(t.Context(), ref, src.ContainerDisk(t, containerdisk.Options{DiskFormat: tc.disk, Compression: tc.comp}), src, ImportOptions{
				DefaultInstancetype: "u1.medium", Labels: map[string]string{"team": "a"}})
			if err != nil {
				t.Fatal(err)
			}
			manifest, labels, entries, disk := disktest.Pull(t, res.Pinned)
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
	host := disktest.Registry(t)
	src := disktest.Disk(t, 4<<20, 2)
	c := testClient(t)
	a, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/a:1"), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Another client (no build cache) builds the same image from scratch.
	b, err := testClient(t).Import(t.Context(), disktest.MustTag(t, host+"/acme/b:1"), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest || a.Reused || b.Reused {
		t.Fatalf("two builds of the same input: %s (reused %v) and %s (reused %v)", a.Digest, a.Reused, b.Digest, b.Reused)
	}
	again, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/a:2"), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Reused || again.Digest != a.Digest || again.UploadedBytes != 0 {
		t.Errorf("re-import: %+v", again)
	}
	// The client that built it mounts it into a third repository.
	mounted, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/c:1"), src.ContainerDisk(t, containerdisk.Options{}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !mounted.Reused || mounted.Digest != a.Digest || mounted.UploadedBytes != 0 {
		t.Errorf("import into another repository: %+v", mounted)
	}
	other, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/a:3"), src.ContainerDisk(t, containerdisk.Options{Compression: containerdisk.CompressionZstd}), src, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if other.Reused || other.Digest == a.Digest {
		t.Errorf("different options reused the image: %+v", other)
	}
}

func TestImportRejectedPushesNothing(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	// A qcow2 whose only compressed cluster is garbage: detected while
	// streaming, after the upload has started.
	bad := disktest.Source{Image: corruptCompressedQCOW2(t), Digest: "sha256:" + strings.Repeat("cd", 32)}
	_, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/bad:1"), bad.ContainerDisk(t, containerdisk.Options{}), bad, ImportOptions{})
	if reject.As(err) == nil {
		t.Fatalf("import of a corrupt image: %v, want a rejection", err)
	}
	tags, err := remote.List(disktest.MustTag(t, host+"/acme/bad:1").Context())
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

// TestImportWhileHashing: with the digest still being computed, the build
// starts at once; the result is the same image, and once an identical
// image exists a second import only tags it.
func TestImportWhileHashing(t *testing.T) {
	host := disktest.Registry(t)
	known := disktest.Disk(t, 4<<20, 5)
	c := testClient(t)
	want, err := testClient(t).Import(t.Context(), disktest.MustTag(t, host+"/acme/known:1"), known.ContainerDisk(t, containerdisk.Options{}), known, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	later := disktest.Source{Image: known.Image, Wait: func(ctx context.Context) (string, error) {
		select {
		case <-release:
			return known.Digest, nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}}
	close(release)
	got, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/later:1"), later.ContainerDisk(t, containerdisk.Options{}), later, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != want.Digest || got.SourceDigest != known.Digest {
		t.Errorf("while hashing: %+v, want digest %s", got, want.Digest)
	}
	again, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/later:2"), later.ContainerDisk(t, containerdisk.Options{}), later, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Reused || again.Digest != want.Digest {
		t.Errorf("second import while hashing: %+v", again)
	}
	failing := disktest.Source{Image: known.Image, Wait: func(context.Context) (string, error) {
		return "", errors.New("disk read error")
	}}
	if _, err := c.Import(t.Context(), disktest.MustTag(t, host+"/acme/later:3"), failing.ContainerDisk(t, containerdisk.Options{}), failing, ImportOptions{}); err == nil || !strings.Contains(err.Error(), "disk read error") {
		t.Errorf("hashing failure: %v", err)
	}
}
