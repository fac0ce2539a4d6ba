package containerdisk

import (
	"bufio"
	"bytes"
	stdgzip "compress/gzip"
	"encoding/binary"
	"hash/crc32"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// ownFraming opens blob, reads it to its end and returns what
// OwnCompressionFraming said after OpenLayer and after CopyDisk, or the
// error that stopped it.
func ownFraming(t *testing.T, mediaType string, blob []byte) (atOpen, atEnd bool, err error) {
	t.Helper()
	lr, err := OpenLayer(mediaType, bytes.NewReader(blob))
	if err != nil {
		return false, false, err
	}
	defer lr.Close()
	atOpen = lr.OwnCompressionFraming()
	if _, err := lr.CopyDisk(t.Context(), io.Discard); err != nil {
		return atOpen, false, err
	}
	return atOpen, lr.OwnCompressionFraming(), nil
}

// ownFramingDisks are disks whose layers take each shape imagepipe's
// writers make: a gzip layer padded or not, a zstd body frame that
// declares its size (one encoder call) or does not (a stream of blocks).
func ownFramingDisks() map[string][]byte {
	disks := testDisks()
	disks["empty qcow2"] = smallDisks()["empty qcow2"]
	disks["nothing"] = nil
	disks["3 KiB"] = bytes.Repeat([]byte("imagepipe"), 350)
	return disks
}

// TestImagepipeLayersHaveOwnFraming: every layer imagepipe's writers make
// is recognised as framed by them, whatever its size and compression.
func TestImagepipeLayersHaveOwnFraming(t *testing.T) {
	for name, disk := range ownFramingDisks() {
		for _, comp := range []Compression{CompressionGzip, CompressionZstd, CompressionNone} {
			_, layer, _ := buildLayer(t, disk, comp)
			atOpen, atEnd, err := ownFraming(t, comp.MediaType(), layer)
			if err != nil || !atOpen || !atEnd {
				t.Errorf("%s, %s (%d bytes): own framing %v after opening, %v at the end (%v); want true", name, comp, len(layer), atOpen, atEnd, err)
			}
		}
	}
}

// TestOwnGzipHeadersAreTheWriters: the headers the framing check takes as
// imagepipe's are the ones its gzip back ends write: this build's
// compressor and blockGzip (the ISA-L build's framing, around any
// deflate).
func TestOwnGzipHeadersAreTheWriters(t *testing.T) {
	want := pgzipHeader
	if GzipImplementation == "isa-l" {
		want = blockGzipHeader
	}
	if got := unpaddedGzipLayer(t, make([]byte, 4096)); !bytes.HasPrefix(got, want[:]) {
		t.Errorf("%s writes the header % x; the framing check expects % x", GzipImplementation, got[:gzipFixedHeaderSize], want)
	}
	var b bytes.Buffer
	w := newBlockGzip(&b, func(dst, src []byte, final bool, _ *blockScratch) ([]byte, error) {
		return append(dst, 1, 0, 0, 0xff, 0xff), nil // an empty final stored block
	})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b.Bytes(), blockGzipHeader[:]) {
		t.Errorf("blockGzip writes the header % x; the framing check expects % x", b.Bytes()[:gzipFixedHeaderSize], blockGzipHeader)
	}
}

// withHeaderCRC sets FHCRC in a gzip stream whose first member has no
// optional field, and inserts the header's CRC-16.
func withHeaderCRC(gz []byte) []byte {
	h := bytes.Clone(gz[:gzipFixedHeaderSize])
	h[gzipFlagsOffset] |= 1 << 1
	h = binary.LittleEndian.AppendUint16(h, uint16(crc32.ChecksumIEEE(h)))
	return append(h, gz[gzipFixedHeaderSize:]...)
}

// reframed is the tarball gzipped by the standard library in members cut
// at the given offsets, each member's header set by hdr.
func reframed(tarball []byte, hdr func(*stdgzip.Writer), cuts ...int) []byte {
	var out bytes.Buffer
	prev := 0
	for _, c := range append(cuts, len(tarball)) {
		zw := stdgzip.NewWriter(&out)
		if hdr != nil {
			hdr(zw)
		}
		zw.Write(tarball[prev:c])
		zw.Close()
		prev = c
	}
	return out.Bytes()
}

// zstdFramesOf is tarball as zstd frames cut at the given offsets, each
// encoded on its own by klauspost's encoder.
func zstdFramesOf(t *testing.T, tarball []byte, cuts ...int) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	var out []byte
	prev := 0
	for _, c := range append(cuts, len(tarball)) {
		out = enc.EncodeAll(tarball[prev:c], out)
		prev = c
	}
	return out
}

// TestOtherCompressionFramingIsNotOwn: a layer whose tar is imagepipe's
// but whose compression framing is not (each gzip header field, more
// members, another padding, other zstd frames) reads as it did, and is
// not taken for imagepipe's; bytes after the compressed stream are
// refused outright.
func TestOtherCompressionFramingIsNotOwn(t *testing.T) {
	disk := testDisks()["mixed"]
	_, gzLayer, tarball := buildLayer(t, disk, CompressionGzip)
	_, small, smallTar := buildLayer(t, smallDisks()["empty qcow2"], CompressionGzip)
	_, zsLayer, zsTar := buildLayer(t, disk, CompressionZstd)
	lead := len(zstdLeadPrefix(zstdLeadSize)) + zstdLeadSize
	skippable := []byte{0x5e, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 'i', 'm', 'g'}
	padded := func(gz []byte) []byte {
		p, err := padGzipHeader(gz)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	notOwn := map[string]struct {
		mediaType string
		blob      []byte
	}{
		"gzip with FNAME":                      {ocispec.MediaTypeImageLayerGzip, reframed(tarball, func(w *stdgzip.Writer) { w.Name = "disk.tar" })},
		"gzip with FCOMMENT":                   {ocispec.MediaTypeImageLayerGzip, reframed(tarball, func(w *stdgzip.Writer) { w.Comment = "built by hand" })},
		"gzip with FEXTRA":                     {ocispec.MediaTypeImageLayerGzip, reframed(tarball, func(w *stdgzip.Writer) { w.Extra = []byte("XY\x02\x00hi") })},
		"gzip with FHCRC":                      {ocispec.MediaTypeImageLayerGzip, withHeaderCRC(gzLayer)},
		"gzip with a time":                     {ocispec.MediaTypeImageLayerGzip, reframed(tarball, func(w *stdgzip.Writer) { w.ModTime = w.ModTime.AddDate(2020, 0, 0) })},
		"two gzip members":                     {ocispec.MediaTypeImageLayerGzip, reframed(tarball, nil, 700)},
		"an empty gzip member after the layer": {ocispec.MediaTypeImageLayerGzip, append(bytes.Clone(gzLayer), reframed(nil, nil)...)},
		"imagepipe's padding on a large layer": {ocispec.MediaTypeImageLayerGzip, padded(gzLayer)},
		"a small layer not padded":             {ocispec.MediaTypeImageLayerGzip, reframed(smallTar, nil)},
		"a zstd skippable frame between frames": {ocispec.MediaTypeImageLayerZstd,
			append(append(bytes.Clone(zsLayer[:lead]), skippable...), zsLayer[lead:]...)},
		"a zstd skippable frame at the end": {ocispec.MediaTypeImageLayerZstd, append(bytes.Clone(zsLayer), skippable...)},
		"one zstd frame":                    {ocispec.MediaTypeImageLayerZstd, zstdFramesOf(t, tarball)},
		"three zstd frames": {ocispec.MediaTypeImageLayerZstd,
			append(bytes.Clone(zsLayer[:lead]), zstdFramesOf(t, tarball[zstdLeadSize:], 4096)...)},
		"another encoder's body frame": {ocispec.MediaTypeImageLayerZstd,
			append(bytes.Clone(zsLayer[:lead]), zstdFramesOf(t, tarball[zstdLeadSize:])...)},
		"a lead frame whose block is compressed": {ocispec.MediaTypeImageLayerZstd, compressedLead(t, zsLayer, zsTar)},
	}
	if len(small) >= 2*cdiPeekSize {
		t.Fatalf("the small layer is %d bytes; the padding cases need one under %d", len(small), 2*cdiPeekSize)
	}
	for name, c := range notOwn {
		_, atEnd, err := ownFraming(t, c.mediaType, c.blob)
		if err != nil || atEnd {
			t.Errorf("%s: own framing %v (%v); want false and the layer read", name, atEnd, err)
		}
	}
	// Shown at once by the first header or frame: the gate then spools
	// the disk instead of streaming it.
	for _, name := range []string{"gzip with FNAME", "gzip with FHCRC", "gzip with a time", "one zstd frame", "a lead frame whose block is compressed"} {
		if atOpen, _, _ := ownFraming(t, notOwn[name].mediaType, notOwn[name].blob); atOpen {
			t.Errorf("%s: own framing after opening; want false", name)
		}
	}

	refused := map[string]struct {
		mediaType string
		blob      []byte
	}{
		"zeros after the gzip stream":  {ocispec.MediaTypeImageLayerGzip, append(bytes.Clone(gzLayer), make([]byte, 1024)...)},
		"a byte after the gzip stream": {ocispec.MediaTypeImageLayerGzip, append(bytes.Clone(gzLayer), 0x1f)},
		"zeros after the zstd stream":  {ocispec.MediaTypeImageLayerZstd, append(bytes.Clone(zsLayer), make([]byte, 1024)...)},
		"bytes after the zstd stream":  {ocispec.MediaTypeImageLayerZstd, append(bytes.Clone(zsLayer), "evil"...)},
	}
	for name, c := range refused {
		_, _, err := ownFraming(t, c.mediaType, c.blob)
		if re := reject.As(err); re == nil || re.Reason != reject.InvalidLayer {
			t.Errorf("%s: %v; want an %s rejection", name, err, reject.InvalidLayer)
		}
	}
}

// TestGzipMembersAreCounted: the build's gzip reader reads a stream of
// several members whole, as a multistream reader does, and counts them.
func TestGzipMembersAreCounted(t *testing.T) {
	data := bytes.Repeat([]byte("members "), 20000)
	for _, cuts := range [][]int{nil, {1}, {100, 70000}, {0, 0, 5}} {
		blob := reframed(data, nil, cuts...)
		zr, err := newGzipReader(bufio.NewReaderSize(bytes.NewReader(blob), 128<<10))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%d cuts: read %d bytes (%v); want %d", len(cuts), len(got), err, len(data))
		}
		if n := zr.(gzipMembers).memberCount(); n != len(cuts)+1 {
			t.Errorf("%d cuts: %d members counted; want %d", len(cuts), n, len(cuts)+1)
		}
	}
}

// TestZstdFramesFollowsFrames: the walk finds each frame of a stream,
// skippable ones too, whatever the sizes of the writes that bring it.
func TestZstdFramesFollowsFrames(t *testing.T) {
	_, layer, tarball := buildLayer(t, testDisks()["mixed"], CompressionZstd)
	three := zstdFramesOf(t, tarball, 100, 200000)
	skip := append([]byte{0x50, 0x2a, 0x4d, 0x18, 2, 0, 0, 0, 9, 9}, three...)
	for name, c := range map[string]struct {
		blob      []byte
		frames    int
		skippable bool
	}{"imagepipe's layer": {layer, 2, false}, "three frames": {three, 3, false}, "a skippable frame first": {skip, 4, true}} {
		for _, step := range []int{1, 7, 4096, len(c.blob)} {
			f := newZstdFrames()
			for off := 0; off < len(c.blob); off += step {
				f.Write(c.blob[off:min(off+step, len(c.blob))])
			}
			if !f.ended() || f.frames != c.frames || f.skippable != c.skippable {
				t.Errorf("%s in writes of %d: ended %v, %d frames, skippable %v; want %d frames", name, step, f.ended(), f.frames, f.skippable, c.frames)
			}
		}
	}
}

// FuzzZstdFrames: the walk follows every stream the decoder reads to its
// end, and sees the same whatever the writes that bring it. Nothing may
// panic.
func FuzzZstdFrames(f *testing.F) {
	var out, tarball bytes.Buffer
	if _, err := WriteLayer(f.Context(), &out, bytesPayload("a small disk"), CompressionZstd, &tarball); err != nil {
		f.Fatal(err)
	}
	layer := out.Bytes()
	f.Add(layer, 3)
	f.Add(append([]byte{0x50, 0x2a, 0x4d, 0x18, 1, 0, 0, 0, 0}, layer...), 1000)
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(false))
	f.Add(enc.EncodeAll(tarball.Bytes(), nil), 5)
	f.Add(rawZstdFrame([]byte("raw")), 2)
	f.Fuzz(func(t *testing.T, blob []byte, cut int) {
		whole := newZstdFrames()
		whole.Write(blob)
		split := newZstdFrames()
		cut = min(max(cut, 0), len(blob))
		split.Write(blob[:cut])
		split.Write(blob[cut:])
		if whole.ended() != split.ended() || whole.frames != split.frames || whole.skippable != split.skippable || whole.broken != split.broken {
			t.Fatalf("the walk depends on the writes: %+v, %+v", whole, split)
		}
		dec, err := zstd.NewReader(bytes.NewReader(blob), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			t.Fatal(err)
		}
		defer dec.Close()
		if _, err := io.Copy(io.Discard, io.LimitReader(dec, 64<<20)); err == nil && len(blob) > 0 && !whole.ended() {
			t.Fatalf("the decoder reads the stream but the walk does not end after a frame: %+v", whole)
		}
	})
}
