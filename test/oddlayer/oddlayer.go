package oddlayer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Case is one layer of the disk and the gate's expected verdict on an
// image made of it.
type Case struct {
	Name      string
	MediaType string
	Layer     []byte
	// DiffID is the sha256 of the tar in Layer, which the image's config
	// names.
	DiffID string
	// Reject is the reason the gate refuses the image for; "" when it
	// accepts it.
	Reject reject.Reason
	// Kept: the gate keeps Layer as the canonical layer. Otherwise the
	// canonical layer is one the gate wrote.
	Kept bool
}

// Compression is the compression of the case's layer.
func (c Case) Compression() containerdisk.Compression {
	comp, _ := containerdisk.CompressionOf(c.MediaType)
	return comp
}

// QCOW2 is the qcow2 file imagepipe's writer makes of the raw disk raw:
// the disk the gate verifies as it streams.
func QCOW2(ctx context.Context, raw []byte) ([]byte, error) {
	img, err := convert.Open(bytes.NewReader(raw), int64(len(raw)), convert.OpenOptions{})
	if err != nil {
		return nil, err
	}
	plan, err := img.Plan(ctx, convert.Options{})
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := plan.Write(ctx, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// CanonicalTar is imagepipe's tar around disk: the canonical layer's tar
// when disk is a canonical disk.
func CanonicalTar(disk []byte) []byte {
	head, tail := containerdisk.TarFraming(int64(len(disk)))
	return bytes.Join([][]byte{head, disk, tail}, nil)
}

// Cases are the layers of disk, a disk imagepipe's writer made (QCOW2).
func Cases(ctx context.Context, disk []byte) ([]Case, error) {
	own := CanonicalTar(disk)
	head, _ := containerdisk.TarFraming(int64(len(disk)))
	if len(head) != 2*blockSize {
		return nil, fmt.Errorf("a %d-byte disk has %d bytes of tar headers; the cases expect two blocks", len(disk), len(head))
	}
	const dirHeader, fileHeader = 0, blockSize // offsets in own
	mtime := time.Unix(1700000000, 0)
	foreign := func(edit func(dir, file *tar.Header)) []byte {
		dir := &tar.Header{Typeflag: tar.TypeDir, Name: api.DiskDir, Mode: 0o555, Uid: api.DiskUID, Gid: api.DiskGID}
		file := &tar.Header{Typeflag: tar.TypeReg, Name: api.DiskPath, Mode: 0o444, Uid: api.DiskUID, Gid: api.DiskGID, Size: int64(len(disk))}
		edit(dir, file)
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(dir)
		tw.WriteHeader(file)
		tw.Write(disk)
		tw.Close()
		return b.Bytes()
	}
	before := func(at int, entries ...[]byte) []byte {
		return bytes.Join([][]byte{own[:at], bytes.Join(entries, nil), own[at:]}, nil)
	}
	pax := func(records ...string) []byte {
		return entry(tar.TypeXHeader, "PaxHeaders/disk.img", paxRecords(records...))
	}
	evil := bytes.Clone(own)
	setName(evil[fileHeader:fileHeader+blockSize], "../../etc/evil.img")

	tars := []struct {
		name   string
		tar    []byte
		reject reject.Reason
	}{
		{"PAX mtime, atime and ctime records", before(fileHeader, pax("mtime", "1700000000.5", "atime", "1700000001", "ctime", "1700000002")), ""},
		{"a PAX mtime record on the directory", before(dirHeader, pax("mtime", "1700000000")), ""},
		{"PAX uname and gname records", before(fileHeader, pax("uname", "root", "gname", "root")), ""},
		{"a PAX size record", before(fileHeader, pax("size", strconv.Itoa(len(disk)))), ""},
		{"a PAX path record", before(fileHeader, pax("path", api.DiskPath)), reject.TarEntry},
		{"a PAX linkpath record", before(fileHeader, pax("linkpath", "/etc/passwd")), reject.TarEntry},
		{"PAX uid and gid records", before(fileHeader, pax("uid", "107", "gid", "107")), reject.TarEntry},
		// Version 1.0 has archive/tar read a sparse map from the disk's
		// first block, which holds none.
		{"PAX GNU.sparse 1.0 records", before(fileHeader, pax("GNU.sparse.major", "1", "GNU.sparse.minor", "0", "GNU.sparse.realsize", strconv.Itoa(len(disk)))), reject.InvalidLayer},
		{"a PAX GNU.sparse.size record", before(fileHeader, pax("GNU.sparse.size", strconv.Itoa(len(disk)))), reject.TarEntry},
		{"a PAX SCHILY.xattr record", before(fileHeader, pax("SCHILY.xattr.security.capability", "x")), reject.TarEntry},
		{"a PAX comment record", before(fileHeader, pax("comment", "built by hand")), reject.TarEntry},
		{"a global PAX header", before(dirHeader, entry(tar.TypeXGlobalHeader, "pax_global_header", paxRecords("mtime", "1700000000"))), reject.TarEntry},
		{"a GNU long name over the raw name ../../etc/evil.img", bytes.Join([][]byte{evil[:fileHeader], entry(tar.TypeGNULongName, "././@LongLink", []byte(api.DiskPath+"\x00")), evil[fileHeader:]}, nil), reject.TarEntry},
		{"a GNU long link", before(fileHeader, entry(tar.TypeGNULongLink, "././@LongLink", []byte("/etc/passwd\x00"))), reject.TarEntry},
		{"foreign owner names", foreign(func(dir, file *tar.Header) { dir.Uname, file.Uname, file.Gname = "root", "root", "wheel" }), ""},
		{"modification times", foreign(func(dir, file *tar.Header) { dir.ModTime, file.ModTime = mtime, mtime }), ""},
		{"GNU tar headers", foreign(func(dir, file *tar.Header) { dir.Format, file.Format = tar.FormatGNU, tar.FormatGNU }), ""},
		{"a PAX hdrcharset record", before(fileHeader, pax("hdrcharset", "BINARY")), reject.TarEntry},
		{"a PAX charset record", before(fileHeader, pax("charset", "ISO-IR 10646 2000 UTF-8")), reject.TarEntry},
		{"PAX GNU.sparse 0.1 records", before(fileHeader, pax("GNU.sparse.numblocks", "1", "GNU.sparse.map", "0,"+strconv.Itoa(len(disk)), "GNU.sparse.name", api.DiskPath, "GNU.sparse.realsize", strconv.Itoa(len(disk)))), reject.TarEntry},
		{"an old GNU sparse entry", oldGNUSparse(own, fileHeader), reject.TarEntry},
		{"10 KiB of padding after the end marker", append(bytes.Clone(own), make([]byte, 10<<10)...), ""},
		{"one more zero block after the end marker", append(bytes.Clone(own), make([]byte, blockSize)...), ""},
	}
	var cases []Case
	for _, c := range tars {
		// compress/gzip's default header is one imagepipe writes: only the
		// tar tells this layer from one imagepipe could have made.
		cases = append(cases, Case{Name: "tar: " + c.name, MediaType: ocispec.MediaTypeImageLayerGzip, Layer: gzipMembers(c.tar, nil), DiffID: digestOf(c.tar), Reject: c.reject})
		// The same tar in zstd, as skopeo or containerd would compress it.
		enc, _ := zstd.NewWriter(nil)
		cases = append(cases, Case{Name: "tar in zstd: " + c.name, MediaType: ocispec.MediaTypeImageLayerZstd, Layer: enc.EncodeAll(c.tar, nil), DiffID: digestOf(c.tar), Reject: c.reject})
		enc.Close()
	}

	written := map[containerdisk.Compression][]byte{}
	for _, comp := range []containerdisk.Compression{containerdisk.CompressionGzip, containerdisk.CompressionZstd, containerdisk.CompressionNone} {
		var b bytes.Buffer
		if _, err := containerdisk.WriteLayer(ctx, &b, payload(disk), comp, nil); err != nil {
			return nil, err
		}
		written[comp] = b.Bytes()
	}
	gz, zs := written[containerdisk.CompressionGzip], written[containerdisk.CompressionZstd]
	padded := bytes.Clone(gz)
	if len(padded) < 2*blockSize {
		return nil, fmt.Errorf("imagepipe's gzip layer of the disk is %d bytes; the padding case needs 1 KiB or more", len(padded))
	}
	// The FEXTRA field imagepipe pads small layers with (XLEN 500: the
	// subfield "IP" of 496 zeros), on a layer that needs none.
	padded = bytes.Join([][]byte{padded[:10], {0xf4, 0x01, 'I', 'P', 0xf0, 0x01}, make([]byte, 496), padded[10:]}, nil)
	padded[3] |= 1 << 2
	lead := bytes.Index(zs[4:], zs[:4]) + 4 // the body frame's magic number
	if lead < 4 {
		return nil, fmt.Errorf("imagepipe's zstd layer has no second frame")
	}
	skippable := []byte{0x5e, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 'e', 'v', 'i', 'l'}
	zstdFrames := func(cuts ...int) []byte {
		enc, _ := zstd.NewWriter(nil)
		defer enc.Close()
		var out []byte
		prev := 0
		for _, c := range append(cuts, len(own)) {
			out = enc.EncodeAll(own[prev:c], out)
			prev = c
		}
		return out
	}

	streams := []struct {
		name      string
		mediaType string
		layer     []byte
		reject    reject.Reason
		kept      bool
	}{
		{"imagepipe's gzip layer", ocispec.MediaTypeImageLayerGzip, gz, "", true},
		{"imagepipe's zstd layer", ocispec.MediaTypeImageLayerZstd, zs, "", true},
		{"imagepipe's uncompressed layer", ocispec.MediaTypeImageLayer, own, "", true},
		{"imagepipe's tar in compress/gzip's stream", ocispec.MediaTypeImageLayerGzip, gzipMembers(own, nil), "", true},
		{"gzip with FNAME", ocispec.MediaTypeImageLayerGzip, gzipMembers(own, func(w *gzip.Writer) { w.Name = "../../etc/evil.img" }), "", false},
		{"gzip with FCOMMENT", ocispec.MediaTypeImageLayerGzip, gzipMembers(own, func(w *gzip.Writer) { w.Comment = "built by hand" }), "", false},
		{"gzip with FEXTRA", ocispec.MediaTypeImageLayerGzip, gzipMembers(own, func(w *gzip.Writer) { w.Extra = []byte("XY\x04\x00evil") }), "", false},
		{"gzip with FHCRC", ocispec.MediaTypeImageLayerGzip, withHeaderCRC(gzipMembers(own, nil)), "", false},
		{"gzip with a modification time", ocispec.MediaTypeImageLayerGzip, gzipMembers(own, func(w *gzip.Writer) { w.ModTime = mtime }), "", false},
		{"gzip with other XFL and OS bytes", ocispec.MediaTypeImageLayerGzip, withHeaderBytes(gz, 2, 3), "", false},
		{"two gzip members", ocispec.MediaTypeImageLayerGzip, gzipMembers(own, nil, 700), "", false},
		{"an empty gzip member after imagepipe's", ocispec.MediaTypeImageLayerGzip, append(bytes.Clone(gz), gzipMembers(nil, nil)...), "", false},
		{"imagepipe's padding on a large gzip layer", ocispec.MediaTypeImageLayerGzip, padded, "", false},
		{"bytes after the gzip stream", ocispec.MediaTypeImageLayerGzip, append(bytes.Clone(gz), "evil"...), reject.InvalidLayer, false},
		{"zeros after the gzip stream", ocispec.MediaTypeImageLayerGzip, append(bytes.Clone(gz), make([]byte, 1024)...), reject.InvalidLayer, false},
		{"a zstd skippable frame between frames", ocispec.MediaTypeImageLayerZstd, bytes.Join([][]byte{zs[:lead], skippable, zs[lead:]}, nil), "", false},
		{"a zstd skippable frame at the end", ocispec.MediaTypeImageLayerZstd, append(bytes.Clone(zs), skippable...), "", false},
		{"a zstd skippable frame first", ocispec.MediaTypeImageLayerZstd, append(bytes.Clone(skippable), zs...), reject.LayerMediaType, false},
		// klauspost's default encoder, as skopeo and containerd compress
		// layers: the first block ends before byte 512, where CDI's
		// importer up to v1.66 misreads a stream, so the layer is read
		// and never kept.
		{"one zstd frame", ocispec.MediaTypeImageLayerZstd, zstdFrames(), "", false},
		{"three zstd frames", ocispec.MediaTypeImageLayerZstd, zstdFrames(1024, 4096), "", false},
		{"bytes after the zstd stream", ocispec.MediaTypeImageLayerZstd, append(bytes.Clone(zs), "evil"...), reject.InvalidLayer, false},
	}
	for _, c := range streams {
		cases = append(cases, Case{Name: "stream: " + c.name, MediaType: c.mediaType, Layer: c.layer, DiffID: digestOf(own), Reject: c.reject, Kept: c.kept})
	}
	return cases, nil
}

const blockSize = 512

// entry is a tar entry of type typ named name holding data, as a header
// block and data blocks.
func entry(typ byte, name string, data []byte) []byte {
	blk := make([]byte, blockSize)
	setName(blk, name)
	copy(blk[100:], "0000644\x00")
	copy(blk[108:], "0000000\x00")
	copy(blk[116:], "0000000\x00")
	copy(blk[124:], fmt.Sprintf("%011o\x00", len(data)))
	copy(blk[136:], "00000000000\x00")
	blk[156] = typ
	copy(blk[257:], "ustar\x0000")
	fixChecksum(blk)
	padded := make([]byte, (len(data)+blockSize-1)/blockSize*blockSize)
	copy(padded, data)
	return append(blk, padded...)
}

// setName writes name into the name field of the header block blk.
func setName(blk []byte, name string) {
	clear(blk[:100])
	copy(blk[:100], name)
	fixChecksum(blk)
}

// fixChecksum sets the checksum of the header block blk.
func fixChecksum(blk []byte) {
	copy(blk[148:156], "        ")
	var sum int
	for _, c := range blk[:blockSize] {
		sum += int(c)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

// paxRecords is the data of a PAX header holding the records key, value,
// ...: each "LEN key=value\n", LEN counting itself.
func paxRecords(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		rec := " " + kv[i] + "=" + kv[i+1] + "\n"
		n := len(rec) + 1
		for len(strconv.Itoa(n))+len(rec) != n {
			n++
		}
		b = append(b, strconv.Itoa(n)+rec...)
	}
	return b
}

// gzipMembers is tarball gzipped by compress/gzip, in members cut at the
// given offsets, each member's header set by hdr.
func gzipMembers(tarball []byte, hdr func(*gzip.Writer), cuts ...int) []byte {
	var out bytes.Buffer
	prev := 0
	for _, c := range append(cuts, len(tarball)) {
		zw := gzip.NewWriter(&out)
		if hdr != nil {
			hdr(zw)
		}
		zw.Write(tarball[prev:c])
		zw.Close()
		prev = c
	}
	return out.Bytes()
}

// withHeaderCRC sets FHCRC in a gzip stream whose first member has no
// optional field, and inserts the header's CRC-16.
// withHeaderBytes is gz with its header's XFL and OS bytes set.
func withHeaderBytes(gz []byte, xfl, os byte) []byte {
	out := bytes.Clone(gz)
	out[8], out[9] = xfl, os
	return out
}

// oldGNUSparse is tarball with the header block at off turned into an old
// GNU sparse entry (type 'S', GNU magic) declaring no sparse map, its
// checksum set again.
func oldGNUSparse(tarball []byte, off int) []byte {
	out := bytes.Clone(tarball)
	blk := out[off : off+blockSize]
	blk[156] = tar.TypeGNUSparse
	copy(blk[257:265], "ustar  \x00")
	copy(blk[148:156], "        ")
	sum := 0
	for _, c := range blk {
		sum += int(c)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return out
}

func withHeaderCRC(gz []byte) []byte {
	h := bytes.Clone(gz[:10])
	h[3] |= 1 << 1
	h = binary.LittleEndian.AppendUint16(h, uint16(crc32.ChecksumIEEE(h)))
	return append(h, gz[10:]...)
}

// Tar is the tar a layer of mediaType holds, decompressed by the
// standard library's gzip reader or klauspost's zstd decoder, as
// registry clients read layers.
func Tar(mediaType string, layer []byte) ([]byte, error) {
	switch mediaType {
	case ocispec.MediaTypeImageLayerGzip:
		zr, err := gzip.NewReader(bytes.NewReader(layer))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	case ocispec.MediaTypeImageLayerZstd:
		zr, err := zstd.NewReader(bytes.NewReader(layer))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		return io.ReadAll(zr)
	case ocispec.MediaTypeImageLayer:
		return layer, nil
	}
	return nil, fmt.Errorf("a layer of media type %q", mediaType)
}

func digestOf(b []byte) string { return digest.FromBytes(b).String() }

// payload is a disk held in memory, as containerdisk writes it.
type payload []byte

func (p payload) Size() int64 { return int64(len(p)) }
func (p payload) Write(_ context.Context, w io.Writer) error {
	_, err := w.Write(p)
	return err
}
