package convert

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/imagepipe/imagepipe/internal/reject"
)

// fuzzSpoolLimit is the spool cap of FuzzUnwrap: small, so a stream that
// claims to expand far is cut off quickly.
const fuzzSpoolLimit = 256 << 10

// FuzzUnwrap feeds arbitrary bytes to Unwrap and Spool, and round-trips
// them through each wrapper. It fails unless:
//   - Unwrap reports the wrapper DetectWrapper sees, fails only with a
//     *reject.Error (bzip2 as unsupported-format), and never returns a
//     stream that starts with another wrapper;
//   - an unwrapped input reads back byte for byte;
//   - Spool of any stream fails only with an invalid-wrapper rejection,
//     never spools more than its cap, and when it succeeds has written
//     exactly the bytes the stream gave;
//   - bytes without a wrapper, wrapped with gzip, zstd or xz, unwrap to
//     themselves under that wrapper.
//
// The seeds reach each case: each wrapper whole and cut short, bzip2, a
// wrapper inside another, no wrapper, and a stream past the spool cap.
func FuzzUnwrap(f *testing.F) {
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})
	f.Add(compressCluster(f, []byte("QFI\xfb"), true))
	f.Add([]byte("\xfd7zXZ\x00\x00"))
	f.Add([]byte("BZh9"))
	f.Add([]byte("raw bytes"))
	zenc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(zenc.EncodeAll(bytes.Repeat([]byte{7}, 1<<20), nil)) // expands past the cap
	var gz bytes.Buffer
	gw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	gzipped := func(b []byte) []byte {
		var buf bytes.Buffer
		w, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	// Whole gzip and xz streams, which unwrap and spool; one wrapper
	// inside another; and a gzip stream cut in its middle, whose head
	// unwraps but whose Spool must fail.
	disk := bytes.Repeat([]byte("imagepipe disk "), 300)
	f.Add(gzipped(disk))
	var xzd bytes.Buffer
	xw, err := xz.WriterConfig{DictCap: 4096, BufSize: 4096}.NewWriter(&xzd)
	if err != nil {
		f.Fatal(err)
	}
	xw.Write(disk)
	xw.Close()
	f.Add(xzd.Bytes())
	f.Add(gzipped(zenc.EncodeAll(disk, nil)))
	noise := make([]byte, 16<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	cut := gzipped(noise)
	f.Add(cut[:len(cut)/2])
	spool, err := os.CreateTemp(f.TempDir(), "spool")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { spool.Close() })

	f.Fuzz(func(t *testing.T, data []byte) {
		w := DetectWrapper(data[:min(len(data), 8)])
		r, got, err := Unwrap(bytes.NewReader(data))
		if got != w {
			t.Fatalf("Unwrap reports %q, DetectWrapper %q", got, w)
		}
		if err != nil {
			re := reject.As(err)
			if re == nil {
				t.Fatalf("Unwrap failed without a rejection: %v", err)
			}
			if w == WrapperNone {
				t.Fatalf("an unwrapped input was rejected: %v", err)
			}
			if w == WrapperBzip2 && re.Reason != reject.UnsupportedFormat {
				t.Fatalf("bzip2 rejected as %s", re.Reason)
			}
		} else {
			if w == WrapperBzip2 {
				t.Fatal("a bzip2 stream was accepted")
			}
			checkUnwrapped(t, r, data, w, spool)
		}

		// Round trips, for inputs that do not look wrapped themselves.
		if w != WrapperNone || len(data) > fuzzSpoolLimit {
			return
		}
		gz.Reset()
		gw.Reset(&gz)
		gw.Write(data)
		gw.Close()
		var xzb bytes.Buffer
		// A buffer no larger than the dictionary makes ulikunitz/xz write
		// streams that neither it nor XZ Utils can read (seed
		// xz-writer-small-buffer).
		xw, err := xz.WriterConfig{DictCap: 4096, BufSize: 64 << 10}.NewWriter(&xzb)
		if err != nil {
			t.Fatal(err)
		}
		xw.Write(data)
		xw.Close()
		for _, c := range []struct {
			w Wrapper
			b []byte
		}{{WrapperGzip, gz.Bytes()}, {WrapperZstd, zenc.EncodeAll(data, nil)}, {WrapperXZ, xzb.Bytes()}} {
			r, got, err := Unwrap(bytes.NewReader(c.b))
			if err != nil {
				t.Fatalf("%s round trip: %v", c.w, err)
			}
			out, rerr := io.ReadAll(r)
			r.Close()
			if got != c.w || rerr != nil || !bytes.Equal(out, data) {
				t.Fatalf("%s round trip: wrapper %q, %v, %d bytes back of %d", c.w, got, rerr, len(out), len(data))
			}
		}
	})
}

// checkUnwrapped checks the stream Unwrap returned for data: no nested
// wrapper at its head, the input itself when unwrapped, and a Spool into
// spool bounded by the cap.
func checkUnwrapped(t *testing.T, r io.ReadCloser, data []byte, w Wrapper, spool *os.File) {
	t.Helper()
	defer r.Close()
	counted := &countingReader{r: r}
	if err := spool.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	n, err := Spool(context.Background(), counted, spool, fuzzSpoolLimit)
	if n > fuzzSpoolLimit {
		t.Fatalf("Spool wrote %d bytes over its cap of %d", n, fuzzSpoolLimit)
	}
	if err != nil {
		if re := reject.As(err); re == nil || re.Reason != reject.Wrapper {
			t.Fatalf("Spool failed without an invalid-wrapper rejection: %v", err)
		}
		if w == WrapperNone && len(data) <= fuzzSpoolLimit {
			t.Fatalf("Spool of %d unwrapped bytes failed: %v", len(data), err)
		}
		return
	}
	if n != counted.n {
		t.Fatalf("Spool reports %d bytes of %d read", n, counted.n)
	}
	got := make([]byte, n)
	if _, err := spool.ReadAt(got, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if len(got) >= 8 && DetectWrapper(got[:8]) != WrapperNone && w != WrapperNone {
		t.Fatalf("the %s stream unwrapped to another wrapper", w)
	}
	if w == WrapperNone && !bytes.Equal(got, data) {
		t.Fatalf("an unwrapped input of %d bytes spooled to %d different bytes", len(data), len(got))
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
