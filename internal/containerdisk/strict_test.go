package containerdisk

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"testing"

	stdgzip "compress/gzip"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// readLayer opens blob as mediaType and reads it to its end, as the gate
// and export do.
func readLayer(t *testing.T, mediaType string, blob []byte) error {
	t.Helper()
	lr, err := OpenLayer(mediaType, bytes.NewReader(blob))
	if err != nil {
		return err
	}
	defer lr.Close()
	_, err = lr.CopyDisk(t.Context(), io.Discard)
	return err
}

// diskTar is a containerDisk tar of disk whose file header is changed by
// edit, followed by trailer.
func diskTar(t *testing.T, disk []byte, edit func(*tar.Header), trailer []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID})
	h := &tar.Header{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: api.DiskUID, Gid: api.DiskGID, Size: int64(len(disk))}
	if edit != nil {
		edit(h)
	}
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	tw.Write(disk)
	tw.Close()
	return append(b.Bytes(), trailer...)
}

// withRawPAX puts a PAX extended header with the record key=value in
// front of the second entry of tarball (disk/disk.img). Go's tar writer
// drops records it reserves (GNU.sparse.*), so the block is built here.
func withRawPAX(t *testing.T, tarball []byte, key, value string) []byte {
	t.Helper()
	rec := fmt.Sprintf(" %s=%s\n", key, value)
	for n := len(rec); ; n++ {
		if r := strconv.Itoa(n) + rec; len(r) == n {
			rec = r
			break
		}
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "PaxHeaders/disk.img", Size: int64(len(rec)), Format: tar.FormatUSTAR})
	tw.Write([]byte(rec))
	tw.Flush()
	pax := b.Bytes()
	pax[156] = tar.TypeXHeader
	copy(pax[148:156], "        ")
	var sum int
	for _, c := range pax[:512] {
		sum += int(c)
	}
	copy(pax[148:156], fmt.Sprintf("%06o\x00 ", sum))
	out := append([]byte(nil), tarball[:512]...)
	out = append(out, pax...)
	return append(out, tarball[512:]...)
}

func gzipped(b []byte) []byte {
	var out bytes.Buffer
	zw := stdgzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

// TestLayerContentMustMatchItsMediaType: CDI's importer decides a layer's
// compression by its bytes, so a layer whose bytes and media type disagree
// has two readings and is refused, whichever way round.
func TestLayerContentMustMatchItsMediaType(t *testing.T) {
	disk := make([]byte, 4096)
	plain := diskTar(t, disk, nil, nil)
	_, zstdLayer, _ := buildLayer(t, disk, CompressionZstd)
	skippable := append([]byte{0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4}, zstdLayer...)
	xzMagic := append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, plain...)
	cases := []struct {
		name, mediaType string
		blob            []byte
	}{
		{"gzip bytes under the tar media type", ocispec.MediaTypeImageLayer, gzipped(plain)},
		{"tar bytes under the gzip media type", ocispec.MediaTypeImageLayerGzip, plain},
		{"zstd bytes under the gzip media type", ocispec.MediaTypeImageLayerGzip, zstdLayer},
		{"gzip bytes under the zstd media type", ocispec.MediaTypeImageLayerZstd, gzipped(plain)},
		{"a zstd skippable frame first", ocispec.MediaTypeImageLayerZstd, skippable},
		{"xz bytes under the tar media type", ocispec.MediaTypeImageLayer, xzMagic},
	}
	for _, c := range cases {
		err := readLayer(t, c.mediaType, c.blob)
		if re := reject.As(err); re == nil || re.Reason != reject.LayerMediaType {
			t.Errorf("%s: %v; want a %s rejection", c.name, err, reject.LayerMediaType)
		}
	}
	// The controls: each compression under its own media type.
	for mt, blob := range map[string][]byte{ocispec.MediaTypeImageLayer: plain, ocispec.MediaTypeImageLayerGzip: gzipped(plain), ocispec.MediaTypeImageLayerZstd: zstdLayer} {
		if err := readLayer(t, mt, blob); err != nil {
			t.Errorf("%s: %v", mt, err)
		}
	}
}

// TestLayerTrailersAndPAXAreRefused: bytes that one reader takes as more
// of the layer and another ignores, and PAX records that rename or
// reshape the disk entry, are refused; zero padding after the tar is not.
func TestLayerTrailersAndPAXAreRefused(t *testing.T) {
	disk := make([]byte, 4096)
	refused := map[string]struct {
		mediaType string
		blob      []byte
		want      reject.Reason
	}{
		"data after the tar's end":     {ocispec.MediaTypeImageLayer, diskTar(t, disk, nil, []byte("disk/evil.img")), reject.InvalidLayer},
		"data after the gzip stream":   {ocispec.MediaTypeImageLayerGzip, append(gzipped(diskTar(t, disk, nil, nil)), "trailing"...), reject.InvalidLayer},
		"zeros past the trailer limit": {ocispec.MediaTypeImageLayerGzip, gzipped(diskTar(t, disk, nil, make([]byte, MaxTarTrailer+1024))), reject.InvalidLayer},
		"a PAX path record": {ocispec.MediaTypeImageLayer, diskTar(t, disk, func(h *tar.Header) {
			h.PAXRecords = map[string]string{"path": api.DiskPath}
		}, nil), reject.TarEntry},
		"a PAX sparse map": {ocispec.MediaTypeImageLayer, withRawPAX(t, diskTar(t, disk, nil, nil), "GNU.sparse.size", "4096"), reject.TarEntry},
	}
	for name, c := range refused {
		err := readLayer(t, c.mediaType, c.blob)
		if re := reject.As(err); re == nil || re.Reason != c.want {
			t.Errorf("%s: %v; want a %s rejection", name, err, c.want)
		}
	}
	accepted := map[string][]byte{
		"10 KiB of zero records after the tar": diskTar(t, disk, nil, make([]byte, 10240)),
		"a PAX mtime record": diskTar(t, disk, func(h *tar.Header) {
			h.PAXRecords = map[string]string{"mtime": "1.5"}
		}, nil),
	}
	for name, blob := range accepted {
		if err := readLayer(t, ocispec.MediaTypeImageLayer, blob); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// fixChecksum sets the checksum of the tar header block blk.
func fixChecksum(blk []byte) {
	copy(blk[148:156], "        ")
	var sum int
	for _, c := range blk[:tarBlockSize] {
		sum += int(c)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

// longHeader is a GNU long-name or long-link header block with its data,
// naming target, for the entry that follows it.
func longHeader(t *testing.T, typ byte, target string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "././@LongLink", Size: int64(len(target) + 1), Format: tar.FormatGNU})
	tw.Write(append([]byte(target), 0))
	tw.Flush()
	blk := b.Bytes()
	blk[156] = typ
	fixChecksum(blk)
	return blk
}

// withRawName is tarball (diskTar's) whose disk header has raw as its
// ustar name.
func withRawName(tarball []byte, raw string) []byte {
	out := bytes.Clone(tarball)
	blk := out[tarBlockSize : 2*tarBlockSize]
	clear(blk[:100])
	copy(blk, raw)
	fixChecksum(blk)
	return out
}

// TestTarHeadersReadersDisagreeOnAreRefused: a GNU long-name or long-link
// header (a reader without GNU extensions sees the entry under its raw
// name, ../../etc/evil.img say), a directory that declares data, and a
// PAX size record the ustar size contradicts are refused; owner names,
// in the ustar header or PAX records, are not.
func TestTarHeadersReadersDisagreeOnAreRefused(t *testing.T) {
	disk := make([]byte, 4096)
	plain := diskTar(t, disk, nil, nil)
	evil := withRawName(plain, "../../etc/evil.img")
	insert := func(tarball []byte, at int, b []byte) []byte {
		return append(append(bytes.Clone(tarball[:at]), b...), tarball[at:]...)
	}
	// A directory whose size field says 1 block: a reader that skips a
	// directory's data takes the disk's header for it.
	dirWithData := bytes.Clone(plain)
	copy(dirWithData[124:136], "00000001000\x00")
	fixChecksum(dirWithData)
	paxSize := diskTar(t, disk, func(h *tar.Header) { h.PAXRecords = map[string]string{"size": "4096"} }, nil)
	// The disk's ustar size field says 2 blocks more than the record.
	paxLies := bytes.Clone(paxSize)
	fileHdr := paxLies[len(paxLies)-len(disk)-1024-tarBlockSize:]
	copy(fileHdr[124:136], "00000014000\x00")
	fixChecksum(fileHdr)

	refused := map[string][]byte{
		"a GNU long name over the raw name ../../etc/evil.img": insert(evil, 512, longHeader(t, tar.TypeGNULongName, api.DiskPath)),
		"a GNU long link on the disk":                          insert(plain, 512, longHeader(t, tar.TypeGNULongLink, "/etc/passwd")),
		"a GNU long name on the directory":                     insert(plain, 0, longHeader(t, tar.TypeGNULongName, api.DiskDir)),
		"a directory that declares data":                       dirWithData,
		"a PAX size the ustar size contradicts":                paxLies,
	}
	for name, blob := range refused {
		err := readLayer(t, ocispec.MediaTypeImageLayer, blob)
		if re := reject.As(err); re == nil || re.Reason != reject.TarEntry {
			t.Errorf("%s: %v; want a %s rejection", name, err, reject.TarEntry)
		}
	}
	accepted := map[string][]byte{
		"owner names":                   diskTar(t, disk, func(h *tar.Header) { h.Uname, h.Gname = "root", "wheel" }, nil),
		"a PAX uname":                   withRawPAX(t, plain, "uname", "root"),
		"a PAX gname":                   withRawPAX(t, plain, "gname", "wheel"),
		"a PAX size the ustar size has": paxSize,
	}
	for name, blob := range accepted {
		if err := readLayer(t, ocispec.MediaTypeImageLayer, blob); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := readLayer(t, ocispec.MediaTypeImageLayer, evil); err == nil || !errors.Is(err, reject.ErrRejected) {
		t.Errorf("the raw name alone: %v; want a rejection", err)
	}
}
