package containerdisk

import (
	"encoding/binary"
	"errors"
	"io"
)

// cdiPeekSize is how many bytes of a layer CDI's importer reads before it
// knows the layer's format (image.MaxExpectedHdrSize, 512 in releases up to
// v1.66 at least). A shorter
// layer fails there with "could not process image header: unexpected EOF",
// and the DataVolume retries it forever.
const cdiPeekSize = 512

// gzipPaddedHeaderSize is the size of the first member's header in a
// padded gzip layer: the peek falls wholly inside it.
const gzipPaddedHeaderSize = cdiPeekSize

// gzipPadding names the padding rule in Compression.Compressor, part of
// the build key: an image built under another rule is never reused.
const gzipPadding = "pad-512"

// gzip header fields (RFC 1952, section 2.3).
const (
	gzipFixedHeaderSize = 10
	gzipFlagExtra       = 1 << 2 // FEXTRA
	gzipFlagsOffset     = 3
	gzipTrailerSize     = 8
)

// gzipPadSubfield is the ID of the FEXTRA subfield that pads a small
// layer (RFC 1952, section 2.3.1.1): unregistered, so no reader gives it a
// meaning (BGZF's "BC" would be one), and its SI2 is not 0, which the RFC
// reserves.
var gzipPadSubfield = [2]byte{'I', 'P'}

// gzipPadder holds back the first bytes a gzip writer produces. Once more
// than cdiPeekSize-1 bytes have come they pass on unchanged, so a layer of
// cdiPeekSize bytes or more is exactly the compressor's output. A smaller
// one is, on Close, rewritten with an FEXTRA field that makes its header
// gzipPaddedHeaderSize bytes long (padGzipHeader).
//
// Why the header, and why that is enough for CDI's importer (v1.64 to
// v1.66, pkg/importer/format-readers.go, reached from processLayer in
// pkg/importer/transport.go for registry and containerDisk sources): it
// reads the layer's first 512 bytes into a buffer with io.ReadFull, finds
// the gzip magic there, and stacks a gzip reader (compress/gzip up to
// v1.65, klauspost/pgzip from v1.66) on io.MultiReader(bytes.NewReader
// (buffer), rest of the layer). It then reads the first 512 decompressed
// bytes into that same buffer to look for a nested format (they are the
// tar's first header, matched as "tar"), re-reads them through one more
// MultiReader, and hands the top reader to archive/tar. The buffer is
// overwritten while the gzip reader may still hold peeked bytes unread
// (kubevirt/containerized-data-importer#4277, which broke zstd layers;
// see zstdWriter). Both gzip readers parse the whole header, FEXTRA
// included, inside NewReader, before they decompress anything; with a
// 512-byte header every peeked byte is consumed before the first
// decompressed byte is written over them, whatever their buffering. (The
// readers wrap the MultiReader in a 4 KiB bufio.Reader, whose first fill
// takes all 512 peeked bytes at once, which is why unpadded layers of 512
// bytes or more are also read correctly.)
type gzipPadder struct {
	out     io.Writer
	head    []byte
	passing bool
}

func newGzipPadder(out io.Writer) *gzipPadder {
	return &gzipPadder{out: out, head: make([]byte, 0, cdiPeekSize)}
}

func (p *gzipPadder) Write(b []byte) (int, error) {
	if p.passing {
		return p.out.Write(b)
	}
	if len(p.head)+len(b) < cdiPeekSize {
		p.head = append(p.head, b...)
		return len(b), nil
	}
	p.passing = true
	if _, err := p.out.Write(p.head); err != nil {
		return 0, err
	}
	p.head = nil
	return p.out.Write(b)
}

// Close writes a layer that stayed under cdiPeekSize bytes, padded. It is
// called once the gzip writer has closed, when the member is complete.
func (p *gzipPadder) Close() error {
	if p.passing {
		return nil
	}
	padded, err := padGzipHeader(p.head)
	if err != nil {
		return err
	}
	p.passing = true
	_, err = p.out.Write(padded)
	return err
}

// errGzipHeader is returned when a compressor's output does not start
// with the plain gzip header padGzipHeader expects.
var errGzipHeader = errors.New("the gzip compressor wrote a header with optional fields; cannot pad it")

// padGzipHeader returns the gzip stream gz, whose first member's header has
// no optional fields (ours never do), with an FEXTRA field holding one
// zero-filled subfield that makes that header gzipPaddedHeaderSize bytes
// long. The compressed data, the trailer and thus the decompressed bytes
// are unchanged: every gzip reader skips FEXTRA (RFC 1952: a reader must
// be able to skip subfields it does not know).
func padGzipHeader(gz []byte) ([]byte, error) {
	if len(gz) < gzipFixedHeaderSize+gzipTrailerSize || gz[0] != 0x1f || gz[1] != 0x8b || gz[2] != 8 || gz[gzipFlagsOffset] != 0 {
		return nil, errGzipHeader
	}
	xlen := gzipPaddedHeaderSize - gzipFixedHeaderSize - 2 // XLEN counts what follows it
	out := make([]byte, 0, len(gz)+2+xlen)
	out = append(out, gz[:gzipFixedHeaderSize]...)
	out[gzipFlagsOffset] |= gzipFlagExtra
	out = binary.LittleEndian.AppendUint16(out, uint16(xlen))
	out = append(out, gzipPadSubfield[:]...)
	out = binary.LittleEndian.AppendUint16(out, uint16(xlen-4)) // subfield LEN
	out = append(out, make([]byte, xlen-4)...)
	return append(out, gz[gzipFixedHeaderSize:]...), nil
}

// paddedGzip closes the gzip writer, then the padder behind it.
type paddedGzip struct {
	io.Writer
	zw  io.Closer
	pad *gzipPadder
}

func (p paddedGzip) Close() error {
	if err := p.zw.Close(); err != nil {
		return err
	}
	return p.pad.Close()
}
