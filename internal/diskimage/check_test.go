package diskimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/disktest"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// tarEntry is one entry of a hand-built layer.
type tarEntry struct {
	name     string
	typ      byte
	uid, gid int
	mode     int64
	data     []byte
}

func diskDirEntry() tarEntry {
	return tarEntry{name: api.DiskDir, typ: tar.TypeDir, uid: 107, gid: 107, mode: 0o555}
}

func diskFileEntry(data []byte) tarEntry {
	return tarEntry{name: api.DiskPath, typ: tar.TypeReg, uid: 107, gid: 107, mode: 0o444, data: data}
}

func makeTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Uid: e.uid, Gid: e.gid, Mode: e.mode, Size: int64(len(e.data))}
		if e.typ == tar.TypeSymlink {
			h.Linkname, h.Size = "/etc/passwd", 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// rawDisk is a valid raw disk's bytes (a raw disk is anything that matches
// no other format).
func rawDisk(n int) []byte { return bytes.Repeat([]byte("imagepipe"), n/9+1)[:n] }

func TestCheckAndExtractImportedImages(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	for _, tc := range []struct {
		disk convert.Format
		comp containerdisk.Compression
	}{{convert.FormatQCOW2, containerdisk.CompressionGzip}, {convert.FormatRaw, containerdisk.CompressionZstd}, {convert.FormatQCOW2, containerdisk.CompressionNone}} {
		t.Run(string(tc.disk)+"-"+string(tc.comp), func(t *testing.T) {
			src := disktest.Disk(t, 8<<20, 3)
			res, err := importer(c).Import(t.Context(), disktest.MustTag(t, host+"/acme/disk:"+string(tc.disk)+"-"+string(tc.comp)),
				src.ContainerDisk(t, containerdisk.Options{DiskFormat: tc.disk, Compression: tc.comp}), src, publish.ImportOptions{DefaultPreference: "fedora"})
			if err != nil {
				t.Fatal(err)
			}
			ref := mustReference(t, res.Pinned)
			rep, err := Check(t.Context(), c, ref)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Verdict != api.VerdictAccepted || rep.DiskFormat != string(tc.disk) || rep.VirtualSize != 8<<20 ||
				rep.Checked != api.CheckedHeader || rep.Digest != res.Digest || rep.LayerMediaType != tc.comp.MediaType() ||
				len(rep.Env) != 1 || !strings.HasSuffix(rep.Env[0], "=fedora") {
				t.Errorf("report = %+v", rep)
			}

			_, _, _, want := disktest.Pull(t, res.Pinned)
			var got bytes.Buffer
			ext, err := Extract(t.Context(), c, ref, &got, ExtractOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) || ext.Size != int64(len(want)) || ext.Format != string(tc.disk) || ext.Digest != res.Digest {
				t.Errorf("extracted %d bytes (%+v), want the layer's %d", got.Len(), ext, len(want))
			}
		})
	}
}

func TestCheckAndExtractRejectBadShapes(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	disk := rawDisk(100 << 10)
	good := makeTar(t, diskDirEntry(), diskFileEntry(disk))
	withMode := func(e tarEntry, f func(*tarEntry)) tarEntry { f(&e); return e }
	uncompressed := func(b []byte) v1.Layer { return static.NewLayer(b, types.OCIUncompressedLayer) }
	for _, tc := range []struct {
		name        string
		layers      []v1.Layer
		annotations map[string]string
		reason      reject.Reason // for both, unless extractOnly
		extractOnly bool          // Check does not read that far
	}{
		{name: "no layer", reason: reject.LayerCount},
		{name: "two layers", layers: []v1.Layer{uncompressed(good), uncompressed(makeTar(t, diskDirEntry()))}, reason: reject.LayerCount},
		{name: "bzip2 layer", layers: []v1.Layer{static.NewLayer(good, "application/vnd.oci.image.layer.v1.tar+bzip2")}, reason: reject.LayerMediaType},
		{name: "tar bytes under the gzip media type", layers: []v1.Layer{static.NewLayer(good, types.OCILayer)}, reason: reject.LayerMediaType},
		{name: "not a tar", layers: []v1.Layer{uncompressed(bytes.Repeat([]byte{0xff}, 4096))}, reason: reject.InvalidLayer},
		{name: "empty tar", layers: []v1.Layer{uncompressed(makeTar(t))}, reason: reject.TarEntry},
		{name: "file first", layers: []v1.Layer{uncompressed(makeTar(t, diskFileEntry(disk)))}, reason: reject.TarEntry},
		{name: "only the directory", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry()))}, reason: reject.TarEntry},
		{name: "other name", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), withMode(diskFileEntry(disk), func(e *tarEntry) { e.name = "disk/other.img" })))}, reason: reject.TarEntry},
		{name: "symlink", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), withMode(diskFileEntry(nil), func(e *tarEntry) { e.typ = tar.TypeSymlink })))}, reason: reject.TarEntry},
		{name: "root owned", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), withMode(diskFileEntry(disk), func(e *tarEntry) { e.uid, e.gid = 0, 0 })))}, reason: reject.DiskOwner},
		{name: "writable", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), withMode(diskFileEntry(disk), func(e *tarEntry) { e.mode = 0o666 })))}, reason: reject.DiskMode},
		{name: "truncated", layers: []v1.Layer{uncompressed(good[:2048])}, reason: reject.InvalidLayer},
		{name: "empty disk", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), diskFileEntry(nil)))}, reason: reject.VirtualSize},
		{name: "declared qcow2", layers: []v1.Layer{uncompressed(good)}, annotations: map[string]string{api.AnnotationDiskFormat: "qcow2"}, reason: reject.FormatMismatch},
		{name: "wrong virtual size", layers: []v1.Layer{uncompressed(good)}, annotations: map[string]string{api.AnnotationVirtualSize: "1024"}, reason: reject.AnnotationMismatch},
		{name: "entry after the disk", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), diskFileEntry(disk), tarEntry{name: "disk/b.img", typ: tar.TypeReg, mode: 0o444}))}, reason: reject.TarEntry, extractOnly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := disktest.PushLayers(t, host+"/acme/bad:"+strings.ReplaceAll(tc.name, " ", "-"), tc.annotations, tc.layers...)
			rep, err := Check(t.Context(), c, ref)
			if err != nil {
				t.Fatal(err)
			}
			if tc.extractOnly {
				if rep.Verdict != api.VerdictAccepted {
					t.Errorf("check: %+v", rep)
				}
			} else if rep.Verdict != api.VerdictRejected || len(rep.Reasons) != 1 || rep.Reasons[0].Code != string(tc.reason) {
				t.Errorf("check: verdict %s, reasons %+v; want %s", rep.Verdict, rep.Reasons, tc.reason)
			}

			_, err = Extract(t.Context(), c, ref, &bytes.Buffer{}, ExtractOptions{})
			if tc.reason == reject.VirtualSize || tc.reason == reject.FormatMismatch || tc.reason == reject.AnnotationMismatch {
				if err != nil { // the caller validates the disk itself
					t.Errorf("extract: %v", err)
				}
				return
			}
			se := reject.As(err)
			if se == nil || !se.Reason.IsShape() || se.Reason != tc.reason || !errors.Is(err, reject.ErrRejected) {
				t.Errorf("extract: %v; want a %s shape error", err, tc.reason)
			}
		})
	}
}

func TestExtractChecksTheDiffID(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	// static layers claim their blob digest as diff ID: wrong for gzip.
	ref := disktest.PushLayers(t, host+"/acme/diffid:1", nil, static.NewLayer(gzipped(t, makeTar(t, diskDirEntry(), diskFileEntry(rawDisk(4096)))), types.OCILayer))
	if rep, err := Check(t.Context(), c, ref); err != nil || rep.Verdict != api.VerdictAccepted {
		t.Fatalf("check: %+v, %v", rep, err)
	}
	_, err := Extract(t.Context(), c, ref, &bytes.Buffer{}, ExtractOptions{})
	if err == nil || !strings.Contains(err.Error(), "diff ID") || reject.As(err) != nil {
		t.Errorf("extract: %v; want a diff ID mismatch", err)
	}
}

func TestCheckReadsOnlyTheHead(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	// A qcow2 header whose L1 table lies past the first 64 KiB: the check
	// asks for it, gets nothing, and still passes the header.
	src := disktest.Disk(t, 64<<20, 4)
	res, err := importer(c).Import(t.Context(), disktest.MustTag(t, host+"/acme/big:1"), src.ContainerDisk(t, containerdisk.Options{Compression: containerdisk.CompressionNone}), src, publish.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := mustReference(t, res.Pinned)
	rep, err := Check(t.Context(), c, ref)
	if err != nil || rep.Verdict != api.VerdictAccepted || rep.Checked != api.CheckedHeader || rep.VirtualSize != 64<<20 {
		t.Fatalf("check: %+v, %v", rep, err)
	}
}

// emptyDisk opens an all-zero raw disk of size bytes, whose layers are
// as small as layers get.
func emptyDisk(t *testing.T, size int64) disktest.Source {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "empty.raw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	img, err := convert.Open(f, size, convert.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return disktest.Source{Image: img, Digest: "sha256:" + strings.Repeat("cd", 32)}
}

// TestCheckAndExtractAcceptAPaddedGzipLayer: an empty disk's gzip layer,
// padded to CDI's 512 bytes in its header, is accepted by the checks the
// hub runs before an import and extracts to the disk with its diff ID.
func TestCheckAndExtractAcceptAPaddedGzipLayer(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	src := emptyDisk(t, 1<<30)
	res, err := importer(c).Import(t.Context(), disktest.MustTag(t, host+"/acme/empty:1"), src.ContainerDisk(t, containerdisk.Options{}), src, publish.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.LayerSize < 512 {
		t.Fatalf("the layer is %d bytes", res.LayerSize)
	}
	ref := mustReference(t, res.Pinned)
	rep, err := Check(t.Context(), c, ref)
	if err != nil || rep.Verdict != api.VerdictAccepted || rep.LayerSize != res.LayerSize || rep.VirtualSize != 1<<30 || rep.DiskFormat != "qcow2" {
		t.Fatalf("check: %+v, %v", rep, err)
	}
	var got bytes.Buffer
	ext, err := Extract(t.Context(), c, ref, &got, ExtractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, _, want := disktest.Pull(t, res.Pinned)
	if !bytes.Equal(got.Bytes(), want) || ext.Format != "qcow2" {
		t.Errorf("extracted %d bytes (%+v), want the layer's %d", got.Len(), ext, len(want))
	}
}

// TestCheckAndExtractRejectGarbageBehindAPaddedHeader: a gzip layer whose
// header is padded like imagectl's (a 512-byte header of FEXTRA) but whose
// data is not deflate, or whose FEXTRA says more than the blob holds, is
// rejected as an invalid layer, and a 64 KiB FEXTRA (the most its length
// can say) with a valid tar behind it is read like any other.
func TestCheckAndExtractRejectGarbageBehindAPaddedHeader(t *testing.T) {
	host := disktest.Registry(t)
	c := testClient(t)
	good := makeTar(t, diskDirEntry(), diskFileEntry(rawDisk(4096)))
	withExtra := func(extra int, data []byte) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Extra = make([]byte, extra)
		zw.Write(data)
		zw.Close()
		return b.Bytes()
	}
	padded := withExtra(500, good)
	garbage := append(append([]byte(nil), padded[:512]...), bytes.Repeat([]byte{0xff}, 4096)...)
	short := append(append([]byte(nil), padded[:10]...), 0xf4, 0x01, 'I', 'P')
	for name, tc := range map[string]struct {
		blob   []byte
		reject bool
	}{
		"garbage behind the header": {garbage, true},
		"FEXTRA past the end":       {short, true},
		"64 KiB FEXTRA":             {withExtra(65535, good), false},
	} {
		t.Run(name, func(t *testing.T) {
			ref := disktest.PushLayers(t, host+"/acme/padded:"+strings.ReplaceAll(name, " ", "-"), nil, static.NewLayer(tc.blob, types.OCILayer))
			rep, err := Check(t.Context(), c, ref)
			if err != nil {
				t.Fatal(err)
			}
			if tc.reject {
				if rep.Verdict != api.VerdictRejected || len(rep.Reasons) != 1 || rep.Reasons[0].Code != string(reject.InvalidLayer) {
					t.Errorf("check: verdict %s, reasons %+v; want %s", rep.Verdict, rep.Reasons, reject.InvalidLayer)
				}
				_, err = Extract(t.Context(), c, ref, &bytes.Buffer{}, ExtractOptions{})
				if se := reject.As(err); se == nil || se.Reason != reject.InvalidLayer {
					t.Errorf("extract: %v; want a %s rejection", err, reject.InvalidLayer)
				}
				return
			}
			if rep.Verdict != api.VerdictAccepted {
				t.Errorf("check: %+v", rep)
			}
			var got bytes.Buffer
			// The static layer's diff ID is its blob digest: only the disk matters here.
			if _, err := Extract(t.Context(), c, ref, &got, ExtractOptions{}); (err != nil && !strings.Contains(err.Error(), "diff ID")) || !bytes.Equal(got.Bytes(), rawDisk(4096)) {
				t.Errorf("extract: %d bytes, %v", got.Len(), err)
			}
		})
	}
}
