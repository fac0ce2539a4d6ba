package registry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepipe/imagepipe/internal/convert"
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

// pushLayers pushes an OCI image made of the given layers, with annotations.
func pushLayers(t *testing.T, ref string, annotations map[string]string, layers ...v1.Layer) name.Reference {
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

// rawDisk is a valid raw disk's bytes (a raw disk is anything that matches
// no other format).
func rawDisk(n int) []byte { return bytes.Repeat([]byte("imagepipe"), n/9+1)[:n] }

func TestCheckAndExtractImportedImages(t *testing.T) {
	host := testRegistry(t)
	c := testClient(t)
	for _, tc := range []struct {
		disk convert.Format
		comp Compression
	}{{convert.FormatQCOW2, CompressionGzip}, {convert.FormatRaw, CompressionZstd}, {convert.FormatQCOW2, CompressionNone}} {
		t.Run(string(tc.disk)+"-"+string(tc.comp), func(t *testing.T) {
			src := testDisk(t, 8<<20, 3)
			res, err := c.Import(t.Context(), mustTag(t, host+"/acme/disk:"+string(tc.disk)+"-"+string(tc.comp)), src,
				ImportOptions{DiskFormat: tc.disk, Compression: tc.comp, DefaultPreference: "fedora"})
			if err != nil {
				t.Fatal(err)
			}
			ref, err := c.ParseReference(res.Pinned)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := c.CheckContainerDisk(t.Context(), ref)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Verdict != api.VerdictAccepted || rep.DiskFormat != string(tc.disk) || rep.VirtualSize != 8<<20 ||
				rep.Checked != api.CheckedHeader || rep.Digest != res.Digest || rep.LayerMediaType != tc.comp.mediaType() ||
				len(rep.Env) != 1 || !strings.HasSuffix(rep.Env[0], "=fedora") {
				t.Errorf("report = %+v", rep)
			}

			_, _, _, want := pullDisk(t, res.Pinned)
			var got bytes.Buffer
			ext, err := c.ExtractDisk(t.Context(), ref, &got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) || ext.Size != int64(len(want)) || ext.Format != tc.disk || ext.Digest != res.Digest {
				t.Errorf("extracted %d bytes (%+v), want the layer's %d", got.Len(), ext, len(want))
			}
		})
	}
}

func TestCheckAndExtractRejectBadShapes(t *testing.T) {
	host := testRegistry(t)
	c := testClient(t)
	disk := rawDisk(100 << 10)
	good := makeTar(t, diskDirEntry(), diskFileEntry(disk))
	withMode := func(e tarEntry, f func(*tarEntry)) tarEntry { f(&e); return e }
	uncompressed := func(b []byte) v1.Layer { return static.NewLayer(b, types.OCIUncompressedLayer) }
	for _, tc := range []struct {
		name        string
		layers      []v1.Layer
		annotations map[string]string
		reason      string // for both, unless extractOnly
		extractOnly bool   // CheckContainerDisk does not read that far
	}{
		{name: "no layer", reason: api.ReasonLayerCount},
		{name: "two layers", layers: []v1.Layer{uncompressed(good), uncompressed(makeTar(t, diskDirEntry()))}, reason: api.ReasonLayerCount},
		{name: "bzip2 layer", layers: []v1.Layer{static.NewLayer(good, "application/vnd.oci.image.layer.v1.tar+bzip2")}, reason: api.ReasonLayerMediaType},
		{name: "not gzip", layers: []v1.Layer{static.NewLayer(good, types.OCILayer)}, reason: api.ReasonInvalidLayer},
		{name: "not a tar", layers: []v1.Layer{uncompressed(bytes.Repeat([]byte{0xff}, 4096))}, reason: api.ReasonInvalidLayer},
		{name: "empty tar", layers: []v1.Layer{uncompressed(makeTar(t))}, reason: api.ReasonTarEntry},
		{name: "file first", layers: []v1.Layer{uncompressed(makeTar(t, diskFileEntry(disk)))}, reason: api.ReasonTarEntry},
		{name: "only the directory", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry()))}, reason: api.ReasonTarEntry},
		{name: "other name", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), withMode(diskFileEntry(disk), func(e *tarEntry) { e.name = "disk/other.img" })))}, reason: api.ReasonTarEntry},
		{name: "symlink", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), withMode(diskFileEntry(nil), func(e *tarEntry) { e.typ = tar.TypeSymlink })))}, reason: api.ReasonTarEntry},
		{name: "root owned", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), withMode(diskFileEntry(disk), func(e *tarEntry) { e.uid, e.gid = 0, 0 })))}, reason: api.ReasonDiskOwner},
		{name: "writable", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), withMode(diskFileEntry(disk), func(e *tarEntry) { e.mode = 0o666 })))}, reason: api.ReasonDiskMode},
		{name: "truncated", layers: []v1.Layer{uncompressed(good[:2048])}, reason: api.ReasonInvalidLayer},
		{name: "empty disk", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), diskFileEntry(nil)))}, reason: string(convert.ReasonVirtualSize)},
		{name: "declared qcow2", layers: []v1.Layer{uncompressed(good)}, annotations: map[string]string{api.AnnotationDiskFormat: "qcow2"}, reason: string(convert.ReasonFormatMismatch)},
		{name: "wrong virtual size", layers: []v1.Layer{uncompressed(good)}, annotations: map[string]string{api.AnnotationVirtualSize: "1024"}, reason: api.ReasonAnnotationMismatch},
		{name: "entry after the disk", layers: []v1.Layer{uncompressed(makeTar(t, diskDirEntry(), diskFileEntry(disk), tarEntry{name: "disk/b.img", typ: tar.TypeReg, mode: 0o444}))}, reason: api.ReasonTarEntry, extractOnly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := pushLayers(t, host+"/acme/bad:"+strings.ReplaceAll(tc.name, " ", "-"), tc.annotations, tc.layers...)
			rep, err := c.CheckContainerDisk(t.Context(), ref)
			if err != nil {
				t.Fatal(err)
			}
			if tc.extractOnly {
				if rep.Verdict != api.VerdictAccepted {
					t.Errorf("check: %+v", rep)
				}
			} else if rep.Verdict != api.VerdictRejected || len(rep.Reasons) != 1 || rep.Reasons[0].Code != tc.reason {
				t.Errorf("check: verdict %s, reasons %+v; want %s", rep.Verdict, rep.Reasons, tc.reason)
			}

			_, err = c.ExtractDisk(t.Context(), ref, &bytes.Buffer{})
			if tc.reason == string(convert.ReasonVirtualSize) || tc.reason == string(convert.ReasonFormatMismatch) || tc.reason == api.ReasonAnnotationMismatch {
				if err != nil { // the caller validates the disk itself
					t.Errorf("extract: %v", err)
				}
				return
			}
			se := AsShapeError(err)
			if se == nil || se.Reason != tc.reason || !errors.Is(err, convert.ErrRejected) {
				t.Errorf("extract: %v; want a %s shape error", err, tc.reason)
			}
		})
	}
}

func TestExtractChecksTheDiffID(t *testing.T) {
	host := testRegistry(t)
	c := testClient(t)
	// static layers claim their blob digest as diff ID: wrong for gzip.
	ref := pushLayers(t, host+"/acme/diffid:1", nil, static.NewLayer(gzipped(t, makeTar(t, diskDirEntry(), diskFileEntry(rawDisk(4096)))), types.OCILayer))
	if rep, err := c.CheckContainerDisk(t.Context(), ref); err != nil || rep.Verdict != api.VerdictAccepted {
		t.Fatalf("check: %+v, %v", rep, err)
	}
	_, err := c.ExtractDisk(t.Context(), ref, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "diff ID") || AsShapeError(err) != nil {
		t.Errorf("extract: %v; want a diff ID mismatch", err)
	}
}

func TestCheckReadsOnlyTheHead(t *testing.T) {
	host := testRegistry(t)
	c := testClient(t)
	// A qcow2 header whose L1 table lies past the first 64 KiB: the check
	// asks for it, gets nothing, and still passes the header.
	src := testDisk(t, 64<<20, 4)
	res, err := c.Import(t.Context(), mustTag(t, host+"/acme/big:1"), src, ImportOptions{Compression: CompressionNone})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := c.ParseReference(res.Pinned)
	rep, err := c.CheckContainerDisk(t.Context(), ref)
	if err != nil || rep.Verdict != api.VerdictAccepted || rep.Checked != api.CheckedHeader || rep.VirtualSize != 64<<20 {
		t.Fatalf("check: %+v, %v", rep, err)
	}

	h := &headReaderAt{head: []byte("0123456789")}
	buf := make([]byte, 4)
	if n, err := h.ReadAt(buf, 2); n != 4 || err != nil || h.beyond {
		t.Errorf("inside the head: %d, %v", n, err)
	}
	if n, err := h.ReadAt(buf, 8); n != 2 || !errors.Is(err, errBeyondHead) || !h.beyond {
		t.Errorf("across the end of the head: %d, %v", n, err)
	}
}

// FuzzDiskEntry checks the containerDisk shape check and the head read
// against their rules. Each input builds a layer from fuzzed tar headers
// (names, types, owner, mode, size) and disk bytes (zeros after data, up
// to size, never materialised beyond the head): diskEntry's verdict must
// be exactly the one the rules give for the headers as a tar reader reads
// them back (which reason, or acceptance), and an accepted disk's head
// must be exactly its first 64 KiB, or its first cluster (up to 2 MiB)
// when it starts with a qcow2 header, never more than the disk. Arbitrary
// tar bytes (raw) are also fed in as they are: whatever diskEntry accepts
// has the containerDisk shape, and the head read stays within 2 MiB and
// the declared size. Nothing may panic.
func FuzzDiskEntry(f *testing.F) {
	qcowHead := func(bits byte) []byte {
		b := make([]byte, 104)
		copy(b, "QFI\xfb\x00\x00\x00\x03")
		b[23] = bits
		return b
	}
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeReg), 107, 107, int64(0o444), int64(1000), []byte("imagepipe"), []byte(nil))
	// Heads of 256 KiB: a seed with 2 MiB clusters would make most
	// executions copy megabytes (TestReadDiskHeadSizes covers those).
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeReg), 107, 107, int64(0o444), int64(300<<10), qcowHead(18), []byte(nil))
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeReg), 107, 107, int64(0o444), int64(100<<10), qcowHead(16), []byte(nil))
	f.Add(api.DiskDir, byte(tar.TypeDir), api.DiskPath, byte(tar.TypeSymlink), 107, 107, int64(0o444), int64(0), []byte(nil), []byte(nil))
	f.Add("disk", byte(tar.TypeDir), "disk/other.img", byte(tar.TypeReg), 0, 0, int64(0o666), int64(10), []byte(nil), []byte(nil))
	f.Fuzz(checkDiskEntry)
}

// checkDiskEntry is FuzzDiskEntry's check of one input.
func checkDiskEntry(t *testing.T, dirName string, dirType byte, fileName string, fileType byte, uid, gid int, mode, size int64, data, raw []byte) {
	{
		if len(raw) > 0 {
			checkRawDiskEntry(t, raw)
		}
		size &= 4<<20 - 1 // up to 4 MiB: past the 2 MiB head limit
		var hdrs bytes.Buffer
		tw := tar.NewWriter(&hdrs)
		if tw.WriteHeader(&tar.Header{Name: dirName, Typeflag: dirType, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID}) != nil ||
			tw.WriteHeader(&tar.Header{Name: fileName, Typeflag: fileType, Mode: mode, Uid: uid, Gid: gid, Size: size}) != nil {
			return // not a header archive/tar writes
		}
		if int64(len(data)) > size {
			data = data[:size]
		}
		content := func() io.Reader {
			return io.MultiReader(bytes.NewReader(data), io.LimitReader(zeroReader{}, size-int64(len(data))))
		}

		// The rules, applied to the headers as read back.
		want, wantErr := "", false
		rd := tar.NewReader(bytes.NewReader(hdrs.Bytes()))
		dir, err := rd.Next()
		var file *tar.Header
		if err == nil && dir.Name == api.DiskDir && dir.Typeflag == tar.TypeDir {
			file, err = rd.Next()
		}
		switch {
		case err != nil && !errors.Is(err, io.EOF):
			wantErr = true
		case dir == nil || dir.Name != api.DiskDir || dir.Typeflag != tar.TypeDir:
			want = api.ReasonTarEntry
		case file == nil || file.Name != api.DiskPath || file.Typeflag != tar.TypeReg:
			want = api.ReasonTarEntry
		case file.Uid != api.DiskUID || file.Gid != api.DiskGID:
			want = api.ReasonDiskOwner
		case file.Mode&0o7777 != 0o444:
			want = api.ReasonDiskMode
		}

		tr := tar.NewReader(io.MultiReader(bytes.NewReader(hdrs.Bytes()), content()))
		h, err := diskEntry(tr)
		se := AsShapeError(err)
		switch {
		case wantErr:
			if err == nil || se != nil {
				t.Fatalf("headers a tar reader refuses: diskEntry = %v", err)
			}
			return
		case want != "":
			if se == nil || se.Reason != want {
				t.Fatalf("dir %q (%q), file %q (%q) %d:%d %o: diskEntry = %v, want reason %s", dirName, dirType, fileName, fileType, uid, gid, mode, err, want)
			}
			return
		case err != nil:
			t.Fatalf("dir %q, file %q %d:%d %o: diskEntry = %v, want acceptance", dirName, fileName, uid, gid, mode, err)
		}
		if h.Size != size {
			t.Fatalf("header size %d, want %d", h.Size, size)
		}

		head, err := readDiskHead(tr, h.Size)
		if err != nil {
			t.Fatalf("reading the head of a %d-byte disk: %v", size, err)
		}
		wantLen := min(size, convert.ProbeSize)
		if len(data) >= 24 && wantLen >= 24 && string(data[:4]) == "QFI\xfb" {
			if bits := binary.BigEndian.Uint32(data[20:24]); bits > 16 && bits <= 21 {
				wantLen = min(size, 1<<bits)
			}
		}
		if int64(len(head)) != wantLen || len(head) > 2<<20 {
			t.Fatalf("head of %d bytes, want %d", len(head), wantLen)
		}
		n := min(len(data), len(head))
		if !bytes.Equal(head[:n], data[:n]) || slices.ContainsFunc(head[n:], func(b byte) bool { return b != 0 }) {
			t.Fatal("the head is not the disk's first bytes")
		}
		convert.Open(&headReaderAt{head: head}, h.Size, convert.OpenOptions{AllowISO: true})
	}
}

// TestReadDiskHeadSizes: the head is the first 64 KiB, or the whole first
// cluster of a qcow2 image with clusters of 128 KiB to 2 MiB, never more
// than the disk.
func TestReadDiskHeadSizes(t *testing.T) {
	for _, tc := range []struct {
		bits       byte
		size, want int64
	}{
		{16, 4 << 20, 64 << 10}, {17, 4 << 20, 128 << 10}, {21, 4 << 20, 2 << 20}, {21, 1 << 20, 1 << 20},
		{22, 4 << 20, 64 << 10}, {9, 4 << 20, 64 << 10}, {21, 100, 100},
	} {
		disk := make([]byte, tc.size)
		copy(disk, "QFI\xfb\x00\x00\x00\x03")
		if len(disk) > 23 {
			disk[23] = tc.bits
		}
		head, err := readDiskHead(bytes.NewReader(disk), tc.size)
		if err != nil || int64(len(head)) != tc.want || !bytes.Equal(head, disk[:tc.want]) {
			t.Errorf("cluster bits %d, %d-byte disk: %d bytes, %v; want %d", tc.bits, tc.size, len(head), err, tc.want)
		}
	}
}

// checkRawDiskEntry runs the shape check and head read on raw tar bytes.
func checkRawDiskEntry(t *testing.T, raw []byte) {
	tr := tar.NewReader(bytes.NewReader(raw))
	h, err := diskEntry(tr)
	if err != nil {
		return
	}
	if h.Name != api.DiskPath || h.Typeflag != tar.TypeReg || h.Uid != api.DiskUID || h.Gid != api.DiskGID || h.Mode&0o7777 != 0o444 {
		t.Fatalf("diskEntry accepted %+v", h)
	}
	head, err := readDiskHead(tr, h.Size)
	if err != nil {
		return
	}
	if len(head) > 2<<20 || int64(len(head)) > h.Size {
		t.Fatalf("read %d bytes of head of a %d-byte disk", len(head), h.Size)
	}
	convert.Open(&headReaderAt{head: head}, h.Size, convert.OpenOptions{AllowISO: true})
}

// zeroReader reads zeros.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
