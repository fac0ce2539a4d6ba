package containerdisk

import (
	"encoding/binary"
	"io"

	"github.com/klauspost/compress/zstd"
)

// zstdLeadSize is how many bytes of the tar stream the first zstd frame
// stores uncompressed: the two 512-byte tar headers.
const zstdLeadSize = 1024

// zstdEncoding names the zstd layout of layers, part of the build key: a
// change of layout must not let an identical re-import reuse an image of
// the old one.
const zstdEncoding = "zstd-lead-1024"

// zstdWriter writes a zstd stream that every released CDI importer reads.
// CDI up to v1.66 reads the layer's first 512 compressed bytes into a
// buffer to detect the format, then decompresses the first 512 bytes of
// the tar into that same buffer, overwriting compressed bytes its zstd
// decoder has not consumed yet when the first zstd block ends before byte
// 512 ("window size exceeded"; kubevirt/containerized-data-importer#4277,
// fixed by #4278). So the stream starts with a frame holding the first
// 1024 tar bytes as one raw (stored) block, which ends past byte 512 and
// is consumed whole before anything is decompressed; the rest of the tar
// follows as an ordinary zstd frame. Concatenated frames are one valid
// zstd stream (RFC 8878, section 3.1).
type zstdWriter struct {
	out  io.Writer
	lead []byte
	enc  *zstd.Encoder
}

func newZstdWriter(out io.Writer) *zstdWriter {
	return &zstdWriter{out: out, lead: make([]byte, 0, zstdLeadSize)}
}

func (z *zstdWriter) Write(p []byte) (int, error) {
	n := 0
	if z.enc == nil {
		take := min(len(p), zstdLeadSize-len(z.lead))
		z.lead = append(z.lead, p[:take]...)
		n, p = take, p[take:]
		if len(z.lead) < zstdLeadSize {
			return n, nil
		}
		if err := z.startBody(); err != nil {
			return n, err
		}
	}
	m, err := z.enc.Write(p)
	return n + m, err
}

// startBody writes the lead frame and starts the compressed frame.
func (z *zstdWriter) startBody() error {
	if _, err := z.out.Write(rawZstdFrame(z.lead)); err != nil {
		return err
	}
	enc, err := newZstdBodyEncoder(z.out)
	if err != nil {
		return err
	}
	z.enc = enc
	return nil
}

// newZstdBodyEncoder is the encoder of the frame after the lead frame.
func newZstdBodyEncoder(out io.Writer) (*zstd.Encoder, error) {
	return zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedFastest))
}

func (z *zstdWriter) Close() error {
	if z.enc == nil {
		// A stream shorter than the lead: one stored frame.
		_, err := z.out.Write(rawZstdFrame(z.lead))
		return err
	}
	return z.enc.Close()
}

// rawZstdFrame is one zstd frame storing data (at most 128 KiB) as a
// single raw block: magic number, a frame header declaring a single
// segment of len(data) bytes, and the block.
func rawZstdFrame(data []byte) []byte {
	frame := binary.LittleEndian.AppendUint32(nil, 0xFD2FB528)
	switch {
	case len(data) < 256:
		frame = append(frame, 0x20, byte(len(data))) // single segment, 1-byte size
	default:
		frame = append(frame, 0x60) // single segment, 2-byte size (less 256)
		frame = binary.LittleEndian.AppendUint16(frame, uint16(len(data)-256))
	}
	header := uint32(len(data))<<3 | 1 // last block, raw, its size
	frame = append(frame, byte(header), byte(header>>8), byte(header>>16))
	return append(frame, data...)
}
