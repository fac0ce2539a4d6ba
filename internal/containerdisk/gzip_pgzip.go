//go:build !isal || !cgo

package containerdisk

import (
	"bufio"
	"io"
	"runtime"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/pgzip"
)

// newGzipReader reads a gzip stream of one or more members, as a
// multistream gzip reader does, counting them (gzipMembers). Builds with
// the isal tag inflate with ISA-L instead.
func newGzipReader(r *bufio.Reader) (io.ReadCloser, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	zr.Multistream(false)
	return &gunzip{r: r, zr: zr, n: 1}, nil
}

// gunzip reads member after member with one gzip.Reader: each Reset reads
// the next member's header where the last one's trailer ended (bufio.Reader
// is a flate.Reader, so the decompressor reads no further), which is what
// the reader does itself in multistream mode.
type gunzip struct {
	r   *bufio.Reader
	zr  *gzip.Reader
	n   int   // members begun
	err error // io.EOF once the stream ended after a member
}

func (g *gunzip) Read(p []byte) (int, error) {
	for g.err == nil {
		n, err := g.zr.Read(p)
		if err != io.EOF {
			return n, err
		}
		// The member ended and its trailer matched: another follows, or
		// the stream ends (io.EOF), or what follows is no member.
		if g.err = g.zr.Reset(g.r); g.err == nil {
			g.zr.Multistream(false)
			g.n++
		}
		if n > 0 {
			return n, nil
		}
	}
	return 0, g.err
}

func (g *gunzip) Close() error { return g.zr.Close() }

func (g *gunzip) memberCount() int { return g.n }

// GzipImplementation names the gzip compressor this binary was built
// with: "isa-l" (the isal build tag, with cgo) or "pgzip".
const GzipImplementation = "pgzip"

// newGzipWriter compresses with klauspost/pgzip at its fastest level, in
// parallel 1 MiB blocks. Builds with the isal tag use ISA-L instead.
func newGzipWriter(w io.Writer) (io.WriteCloser, error) {
	gz, err := pgzip.NewWriterLevel(w, pgzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if err := gz.SetConcurrency(1<<20, 2*runtime.GOMAXPROCS(0)); err != nil {
		return nil, err
	}
	return gz, nil
}
