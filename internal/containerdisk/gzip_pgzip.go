//go:build !isal || !cgo

package containerdisk

import (
	"bufio"
	"io"
	"runtime"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/pgzip"
)

// newGzipReader reads a gzip stream of one or more members. Builds with
// the isal tag inflate with ISA-L instead.
func newGzipReader(r *bufio.Reader) (io.ReadCloser, error) {
	return gzip.NewReader(r)
}

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
