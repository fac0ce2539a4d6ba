package convert

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// Unwrap looks at the first bytes of r and, when they start a gzip, zstd
// or xz stream, returns a reader of the decompressed image. Unwrapped
// streams return r (buffered) and WrapperNone. A bzip2 wrapper, or a wrapper
// inside a wrapper, is rejected. The caller closes the returned reader.
func Unwrap(r io.Reader) (io.ReadCloser, Wrapper, error) {
	return UnwrapWith(r, UnwrapOptions{})
}

// UnwrapOptions tune UnwrapWith. The zero value uses the built-in decoders.
type UnwrapOptions struct {
	// XZ, when set, decodes xz streams instead of the pure-Go decoder
	// (github.com/ulikunitz/xz), which is several times slower than liblzma:
	// internal/source runs the system's xz program with it. It is given the
	// stream from its first byte and returns the decompressed bytes. Its
	// reader must fail on a corrupt or truncated stream, never end it early
	// as if it were complete, and its Close must stop the work and release
	// what it holds. It returns a nil reader, having read nothing, to leave
	// the stream to the built-in decoder (when the program cannot start).
	XZ func(compressed io.Reader) io.ReadCloser
}

// UnwrapWith is Unwrap with options.
func UnwrapWith(r io.Reader, opts UnwrapOptions) (io.ReadCloser, Wrapper, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(8)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, WrapperNone, fmt.Errorf("reading the image: %w", err)
	}
	w := DetectWrapper(head)
	var inner io.ReadCloser
	switch w {
	case WrapperNone:
		return io.NopCloser(br), w, nil
	case WrapperBzip2:
		return nil, w, reject.New(reject.UnsupportedFormat, "bzip2-compressed images are not supported; use gzip, zstd or xz")
	case WrapperGzip:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, w, reject.New(reject.Wrapper, "the gzip header is invalid: %v", err)
		}
		inner = zr
	case WrapperZstd:
		zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(128<<20), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, w, reject.New(reject.Wrapper, "the zstd header is invalid: %v", err)
		}
		inner = zr.IOReadCloser()
	case WrapperXZ:
		if opts.XZ != nil {
			if inner = opts.XZ(br); inner != nil {
				break
			}
		}
		xr, err := xz.NewReader(br)
		if err != nil {
			return nil, w, reject.New(reject.Wrapper, "the xz header is invalid: %v", err)
		}
		inner = io.NopCloser(xr)
	}
	// Peek at the inner stream so a nested wrapper is refused up front.
	ib := bufio.NewReaderSize(inner, 64<<10)
	ihead, err := ib.Peek(8)
	if err != nil && !errors.Is(err, io.EOF) {
		inner.Close()
		return nil, w, reject.New(reject.Wrapper, "the %s stream is corrupt: %v", w, err)
	}
	if nested := DetectWrapper(ihead); nested != WrapperNone {
		inner.Close()
		return nil, w, reject.New(reject.Wrapper, "the %s stream holds another %s stream; decompress it once before uploading", w, nested)
	}
	return struct {
		io.Reader
		io.Closer
	}{truncationReader{ib, w}, inner}, w, nil
}

// truncationReader turns the io.ErrUnexpectedEOF with which a decoder
// reports a stream that stops short into an error of its own: readers of
// the image (io.ReadFull in Spool) take io.ErrUnexpectedEOF for the
// ordinary end of a short last read, and would keep a truncated image as
// if it were whole.
type truncationReader struct {
	r io.Reader
	w Wrapper
}

func (t truncationReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("the %s stream ends before its end marker (truncated)", t.w)
	}
	return n, err
}

// SpoolLimit is the largest unwrapped stream Spool accepts for a maximum
// virtual size: the size plus room for qcow2 metadata.
func SpoolLimit(maxVirtual int64) int64 {
	if maxVirtual <= 0 {
		maxVirtual = DefaultMaxVirtualSize
	}
	return maxVirtual + maxVirtual/64 + 64<<20
}

// Spool copies r into f, an empty file, leaving 4 KiB blocks of zeros as
// holes, and returns the number of bytes. It stops with a reject.Wrapper
// rejection once more than limit bytes arrive, so a decompression bomb
// costs at most limit bytes of (mostly sparse) disk.
func Spool(ctx context.Context, r io.Reader, f *os.File, limit int64) (int64, error) {
	out := newOutput(f)
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return out.n, err
		}
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if out.n+int64(n) > limit {
				return out.n, reject.New(reject.Wrapper, "the decompressed image exceeds %d bytes", limit)
			}
			if werr := out.writeData(buf[:n]); werr != nil {
				return out.n, fmt.Errorf("spooling the decompressed image: %w", werr)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return out.n, out.finish()
		}
		if err != nil {
			return out.n, reject.New(reject.Wrapper, "the compressed stream is corrupt: %v", err)
		}
	}
}
