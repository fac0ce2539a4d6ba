package containerdisk

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// TestGzipWriter checks the build's gzip compressor (ISA-L or pgzip)
// against the standard library's decompressor, for sizes around block
// boundaries, and that its output does not depend on write sizes.
func TestGzipWriter(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 1000, gzipBlockSize - 1, gzipBlockSize, gzipBlockSize + 1, 5*gzipBlockSize + 12345} {
		data := make([]byte, n)
		for i := range data {
			if i%3 == 0 {
				data[i] = byte(rng.Uint32())
			} else {
				data[i] = byte(i / 100)
			}
		}
		var a, b bytes.Buffer
		for _, step := range []struct {
			buf   *bytes.Buffer
			chunk int
		}{{&a, 4096}, {&b, 777777}} {
			w, err := newGzipWriter(step.buf)
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off < len(data); off += step.chunk {
				if _, err := w.Write(data[off:min(off+step.chunk, len(data))]); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Errorf("%s, %d bytes: output depends on write sizes", GzipImplementation, n)
		}
		zr, err := gzip.NewReader(&a)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s, %d bytes: round trip failed: %v", GzipImplementation, n, err)
		}
	}
}

type failingWriter struct{ after int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.after -= len(p); f.after < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

// TestBlockGzipReportsWriteErrors: an output failure ends the stream with
// the error instead of hanging.
func TestBlockGzipReportsWriteErrors(t *testing.T) {
	w := newBlockGzip(&failingWriter{after: 100}, func(dst, src []byte, final bool, _ *blockScratch) ([]byte, error) {
		return append(dst, src...), nil // "stored", enough to exercise the plumbing
	})
	var err error
	for i := 0; i < 64 && err == nil; i++ {
		_, err = w.Write(make([]byte, gzipBlockSize))
	}
	if cerr := w.Close(); cerr == nil {
		t.Fatal("Close after a failed write returned nil")
	}
}
