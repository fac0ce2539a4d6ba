package containerdisk

import (
	"bytes"
	"encoding/binary"
	"io"
)

// The compression framing imagepipe's writers emit, and how a layer being
// read is compared with it (LayerReader.OwnCompressionFraming). The
// framing is everything of a compressed layer but its coded data: gzip
// member headers and their count, zstd frames and their headers, and
// anything after them. The coded data (deflate blocks, zstd blocks) is the
// compressor's: it differs between builds (ISA-L or pgzip) and is not
// compared; the decoders read all of it and check it against the members'
// CRC and size and the frames' checksums.

// The gzip member headers imagepipe's gzip back ends write (RFC 1952,
// section 2.3): no optional field, OS unknown. blockGzip (the ISA-L
// build) writes no time and XFL 0; pgzip at BestSpeed writes XFL 4
// ("fastest") and, as MTIME, the zero time.Time's Unix seconds cut to 32
// bits (0x886e0900).
var (
	blockGzipHeader = [gzipFixedHeaderSize]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}
	pgzipHeader     = [gzipFixedHeaderSize]byte{0x1f, 0x8b, 8, 0, 0x00, 0x09, 0x6e, 0x88, 4, 0xff}
)

// gzipStart is what a gzip layer's first bytes are: one of imagepipe's
// member headers as is, the same padded by gzipPadder, or anything else.
type gzipStart int

const (
	gzipStartOther gzipStart = iota
	gzipStartPlain
	gzipStartPadded
)

// classifyGzipStart names the header that b, the first bytes of a gzip
// layer (gzipPaddedHeaderSize of them, or all when it is shorter), starts
// with.
func classifyGzipStart(b []byte) gzipStart {
	for _, h := range [][gzipFixedHeaderSize]byte{blockGzipHeader, pgzipHeader} {
		if bytes.HasPrefix(b, h[:]) {
			return gzipStartPlain
		}
		padded, err := padGzipHeader(append(h[:], make([]byte, gzipTrailerSize)...))
		if err == nil && bytes.HasPrefix(b, padded[:gzipPaddedHeaderSize]) {
			return gzipStartPadded
		}
	}
	return gzipStartOther
}

// gzipMembers is implemented by the gzip readers: the members begun so
// far, the first one included.
type gzipMembers interface{ memberCount() int }

// zstd frame magic numbers (RFC 8878, sections 3.1.1 and 3.1.2).
const (
	zstdFrameMagic     = 0xFD2FB528
	zstdSkippableMagic = 0x184D2A50 // its low 4 bits are free
)

// zstdKeptFrames is how many frames' headers zstdFrames keeps: one more
// than imagepipe's writer makes.
const zstdKeptFrames = 3

// zstdFrames follows the frames of a zstd stream as its bytes pass,
// without decoding them: each frame's header, its blocks' headers and its
// checksum are read and the rest is skipped (RFC 8878, section 3.1). The
// decoder checks the stream; a stream this walk cannot follow is only
// not imagepipe's.
type zstdFrames struct {
	state     zstdField
	acc       []byte // the field being gathered
	want      int    // its length
	skip      int64  // bytes to pass before it
	fhd       byte   // the current frame's header descriptor
	cur       int    // the current frame's index in kept, or -1
	frames    int    // frames begun, skippable ones included
	skippable bool
	broken    bool
	kept      []zstdFrameHead
}

// zstdFrameHead is a frame's header and the header of its first block.
type zstdFrameHead struct{ header, block []byte }

// zstdField is the field zstdFrames gathers next.
type zstdField int

const (
	zstdMagic       zstdField = iota // 4 bytes: a frame's magic number
	zstdSkipSize                     // 4 bytes: a skippable frame's size
	zstdDescriptor                   // 1 byte: the frame header descriptor
	zstdHeaderRest                   // the rest of the frame header
	zstdBlockHeader                  // 3 bytes
)

func newZstdFrames() *zstdFrames { return &zstdFrames{want: 4, cur: -1} }

func (z *zstdFrames) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 && !z.broken {
		if z.skip > 0 {
			k := min(int64(len(p)), z.skip)
			z.skip -= k
			p = p[k:]
			continue
		}
		k := min(len(p), z.want-len(z.acc))
		z.acc = append(z.acc, p[:k]...)
		p = p[k:]
		if len(z.acc) == z.want {
			z.field(z.acc)
			z.acc = z.acc[:0]
		}
	}
	return n, nil
}

// field takes a gathered field and says which comes next.
func (z *zstdFrames) field(b []byte) {
	next := func(f zstdField, n int) { z.state, z.want = f, n }
	switch z.state {
	case zstdMagic:
		z.frames++
		z.cur = -1
		switch m := binary.LittleEndian.Uint32(b); {
		case m == zstdFrameMagic:
			if len(z.kept) < zstdKeptFrames {
				z.cur = len(z.kept)
				z.kept = append(z.kept, zstdFrameHead{header: bytes.Clone(b)})
			}
			next(zstdDescriptor, 1)
		case m&^0xf == zstdSkippableMagic:
			z.skippable = true
			next(zstdSkipSize, 4)
		default:
			z.broken = true
		}
	case zstdSkipSize:
		z.skip = int64(binary.LittleEndian.Uint32(b))
		next(zstdMagic, 4)
	case zstdDescriptor:
		z.fhd = b[0]
		z.keep(b)
		if z.fhd&0x08 != 0 { // reserved
			z.broken = true
			return
		}
		single := z.fhd&0x20 != 0
		n := [4]int{0, 1, 2, 4}[z.fhd&3] // dictionary ID
		if !single {
			n++ // window descriptor
		}
		n += [4]int{0, 2, 4, 8}[z.fhd>>6] // content size
		if single && z.fhd>>6 == 0 {
			n++
		}
		next(zstdHeaderRest, n) // at least 1
	case zstdHeaderRest:
		z.keep(b)
		next(zstdBlockHeader, 3)
	case zstdBlockHeader:
		if z.cur >= 0 && z.kept[z.cur].block == nil {
			z.kept[z.cur].block = bytes.Clone(b)
		}
		h := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16
		last, kind, size := h&1 != 0, h>>1&3, int64(h>>3)
		switch kind {
		case 1: // RLE: one byte, repeated
			size = 1
		case 3: // reserved
			z.broken = true
			return
		}
		z.skip = size
		if !last {
			next(zstdBlockHeader, 3)
			return
		}
		if z.fhd&0x04 != 0 {
			z.skip += 4 // content checksum
		}
		next(zstdMagic, 4)
	}
}

// keep appends b to the current frame's kept header.
func (z *zstdFrames) keep(b []byte) {
	if z.cur >= 0 {
		z.kept[z.cur].header = append(z.kept[z.cur].header, b...)
	}
}

// ended reports whether the bytes so far end after a whole frame.
func (z *zstdFrames) ended() bool {
	return !z.broken && z.state == zstdMagic && len(z.acc) == 0 && z.skip == 0
}

// zstdLeadPrefix is the frame header and block header of imagepipe's
// lead frame holding n tar bytes (rawZstdFrame).
func zstdLeadPrefix(n int) []byte {
	f := rawZstdFrame(make([]byte, n))
	return f[:len(f)-n]
}

// zstdBodyHeader is the frame header imagepipe's encoder writes ahead of
// n tar bytes. It depends on n alone, and on n only while the input fits
// in one call of the encoder (which then declares its size); past 1 MiB,
// several of klauspost's largest blocks, the stream's header is always
// the same. So n zero bytes, or 1 MiB of them, show it.
func zstdBodyHeader(n int64) []byte {
	var b bytes.Buffer
	enc, err := newZstdBodyEncoder(&b)
	if err != nil {
		return nil
	}
	if _, err := enc.Write(make([]byte, min(n, 1<<20))); err != nil {
		return nil
	}
	if err := enc.Close(); err != nil {
		return nil
	}
	f := newZstdFrames()
	f.Write(b.Bytes())
	if len(f.kept) == 0 {
		return nil
	}
	return f.kept[0].header
}

// streamFraming records the framing of a layer's compressed stream as it
// is read: its size, and, as its media type declares, the start and
// member count of a gzip stream or the frames of a zstd one.
type streamFraming struct {
	content string // contentGzip, contentZstd or contentTar
	size    int64
	gzip    gzipStart
	members gzipMembers
	zstd    *zstdFrames
}

func newStreamFraming(mediaType string) *streamFraming {
	content, _ := mediaTypeContent(mediaType) // an unknown type is refused when the layer is opened
	s := &streamFraming{content: content}
	if content == contentZstd {
		s.zstd = newZstdFrames()
	}
	return s
}

// Write sees every byte of the compressed stream, in order.
func (s *streamFraming) Write(p []byte) (int, error) {
	s.size += int64(len(p))
	if s.zstd != nil {
		s.zstd.Write(p)
	}
	return len(p), nil
}

var _ io.Writer = (*streamFraming)(nil)

// own reports whether the framing is imagepipe's. With ended false, the
// stream has been read only in part, and own says whether what was read
// could still be; with ended true, the whole stream was read and decoded
// to tarSize bytes.
//
// gzip: one member, whose header is one of imagepipe's, padded exactly
// when the unpadded layer would be shorter than cdiPeekSize (gzipPadder).
// zstd: the lead frame holding the tar's first zstdLeadSize bytes as one
// raw block (rawZstdFrame), then one frame with the header imagepipe's
// encoder writes for the rest, and no skippable frame. The lead frame's
// block header is compared too: that block ends past cdiPeekSize, which
// is what has CDI's importer read the stream as the gate does (see
// zstdWriter); a first block that ends sooner, compressed say, is not
// imagepipe's. Nothing after the last member or frame; the reader refuses
// such bytes anyway.
func (s *streamFraming) own(ended bool, tarSize int64) bool {
	switch s.content {
	case contentGzip:
		if s.members == nil || s.members.memberCount() != 1 {
			return false
		}
		const padding = gzipPaddedHeaderSize - gzipFixedHeaderSize
		switch {
		case s.gzip == gzipStartPlain:
			return !ended || s.size >= cdiPeekSize
		case s.gzip == gzipStartPadded:
			return !ended || s.size-padding < cdiPeekSize
		}
		return false
	case contentZstd:
		z := s.zstd
		if z.broken || z.skippable || z.frames > 2 {
			return false
		}
		if !ended {
			return len(z.kept) == 0 || z.kept[0].block == nil || bytes.Equal(append(bytes.Clone(z.kept[0].header), z.kept[0].block...), zstdLeadPrefix(zstdLeadSize))
		}
		lead, frames := min(tarSize, zstdLeadSize), 1
		if tarSize > zstdLeadSize {
			frames = 2
		}
		if !z.ended() || z.frames != frames || !bytes.Equal(append(bytes.Clone(z.kept[0].header), z.kept[0].block...), zstdLeadPrefix(int(lead))) {
			return false
		}
		return frames == 1 || bytes.Equal(z.kept[1].header, zstdBodyHeader(tarSize-zstdLeadSize))
	}
	return true
}
