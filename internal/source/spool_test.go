package source_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/source"
)

// zstdOf compresses data as one zstd frame.
func zstdOf(t *testing.T, data []byte) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	return zw.EncodeAll(data, nil)
}

// patterned returns n bytes of a non-zero repeating pattern.
func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i%251) + 1
	}
	return b
}

// TestStreamRawWritesNothing: with StreamRaw a compressed raw stream is read
// through without a temporary file, and reports the size, the data and
// digest a spool would have.
func TestStreamRawWritesNothing(t *testing.T) {
	data := make([]byte, 5<<20+1000)
	copy(data[1<<20:], patterned(3<<20)) // a zero first MiB, 3 MiB data, zeros after
	copy(data[len(data)-100:], "tail bytes")
	wrapped := zstdOf(t, data)
	tmp := t.TempDir()
	source.SetStdin(t, bytes.NewReader(wrapped))
	img := mustOpen(t, "-", source.Options{TempDir: tmp, StreamRaw: true})
	assertEmpty(t, tmp)
	if !img.Streamed || img.Size != int64(len(data)) || img.Digest != digestOf(wrapped) || img.Wrapper != convert.WrapperZstd {
		t.Fatalf("streamed=%v size=%d digest=%s wrapper=%s", img.Streamed, img.Size, img.Digest, img.Wrapper)
	}
	// 3 MiB of data, plus the 4 KiB block holding the tail bytes.
	if want := int64(3<<20 + 1000); img.DataBytes != want {
		t.Errorf("DataBytes = %d, want %d", img.DataBytes, want)
	}
	// The head and the tail read back; the middle does not, loudly.
	head := make([]byte, 4096)
	if _, err := img.ReaderAt.ReadAt(head, 0); err != nil || !bytes.Equal(head, data[:4096]) {
		t.Errorf("head: %v", err)
	}
	tail := make([]byte, 600)
	if n, err := img.ReaderAt.ReadAt(tail, int64(len(data))-512); n != 512 || !bytes.Equal(tail[:n], data[len(data)-512:]) {
		t.Errorf("tail: %d, %v", n, err)
	}
	if _, err := img.ReaderAt.ReadAt(head, 3<<20); !errors.Is(err, source.ErrNotSpooled) {
		t.Errorf("reading the middle: %v, want ErrNotSpooled", err)
	}
	// The engine judges it raw from what was kept.
	ci, err := convert.Open(img.ReaderAt, img.Size, convert.OpenOptions{})
	if err != nil || ci.Info().Format != convert.FormatRaw {
		t.Fatalf("convert.Open: %v", err)
	}
}

// TestStreamRawSpoolsQCOW2: a qcow2 stream needs random access and is
// spooled even with StreamRaw, within MaxSpool.
func TestStreamRawSpoolsQCOW2(t *testing.T) {
	data := make([]byte, 2<<20)
	copy(data, "QFI\xfb\x00\x00\x00\x03")
	source.SetStdin(t, bytes.NewReader(zstdOf(t, data)))
	img := mustOpen(t, "-", source.Options{TempDir: t.TempDir(), StreamRaw: true})
	if img.Streamed || !bytes.Equal(readAll(t, img), data) {
		t.Fatalf("a qcow2 stream was not spooled whole")
	}
	source.SetStdin(t, bytes.NewReader(zstdOf(t, data)))
	_, err := source.Open(t.Context(), "-", source.Options{TempDir: t.TempDir(), StreamRaw: true, MaxSpool: 1 << 20})
	if re := reject.As(err); re == nil || re.Reason != reject.SpoolLimit {
		t.Fatalf("a 2 MiB qcow2 stream under a 1 MiB spool cap: %v, want %s", err, reject.SpoolLimit)
	}
}

// TestSpoolCap: a stream whose spool passes MaxSpool is rejected with
// ReasonSpoolLimit, compressed or not, and leaves nothing behind.
func TestSpoolCap(t *testing.T) {
	data := patterned(6 << 20)
	for name, in := range map[string][]byte{"raw": data, "zstd": zstdOf(t, data)} {
		t.Run(name, func(t *testing.T) {
			tmp := t.TempDir()
			source.SetStdin(t, bytes.NewReader(in))
			_, err := source.Open(t.Context(), "-", source.Options{TempDir: tmp, MaxSpool: 4 << 20})
			if re := reject.As(err); re == nil || re.Reason != reject.SpoolLimit {
				t.Fatalf("Open: %v, want %s", err, reject.SpoolLimit)
			}
			assertEmpty(t, tmp)
			// A negative MaxSpool spools nothing at all.
			source.SetStdin(t, bytes.NewReader(in))
			_, err = source.Open(t.Context(), "-", source.Options{TempDir: tmp, MaxSpool: -1})
			if re := reject.As(err); re == nil || re.Reason != reject.SpoolLimit {
				t.Fatalf("Open with MaxSpool -1: %v, want %s", err, reject.SpoolLimit)
			}
		})
	}
}

// countingServer serves data with a Content-Length and counts the bytes it
// managed to write.
func countingServer(t *testing.T, data []byte) (*httptest.Server, *atomic.Int64) {
	var sent atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		for off := 0; off < len(data); off += 64 << 10 {
			n, err := w.Write(data[off:min(off+64<<10, len(data))])
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &sent
}

// TestSpaceKnownSize: an unwrapped download whose Content-Length does not
// fit the free space (minus the margin) is refused after its first bytes,
// before a temporary file exists; the error names the directory and both
// figures.
func TestSpaceKnownSize(t *testing.T) {
	data := patterned(64 << 20)
	srv, sent := countingServer(t, data)
	tmp := t.TempDir()
	source.SetFreeSpace(t, source.SpoolMargin+32<<20)
	_, err := source.Open(t.Context(), srv.URL+"/disk.img", source.Options{TempDir: tmp})
	var se *source.SpaceError
	if !errors.As(err, &se) || se.Dir != tmp || se.Need != int64(len(data)) || se.Available != source.SpoolMargin+32<<20 {
		t.Fatalf("Open: %v, want a SpaceError for %s", err, tmp)
	}
	if s := sent.Load(); s > 16<<20 {
		t.Errorf("the server sent %d of %d bytes before the refusal", s, len(data))
	}
	assertEmpty(t, tmp)
	// Streaming for inspect needs no space at all.
	img := mustOpen(t, srv.URL+"/disk.img", source.Options{TempDir: tmp, StreamRaw: true})
	if !img.Streamed || img.Size != int64(len(data)) {
		t.Fatalf("streamed=%v size=%d", img.Streamed, img.Size)
	}
}

// TestSpaceUnknownSize: a compressed stream, whose final size is unknown,
// stops with a SpaceError once the free space nears the margin.
func TestSpaceUnknownSize(t *testing.T) {
	tmp := t.TempDir()
	source.SetFreeSpace(t, source.SpoolMargin+4<<20)
	source.SetStdin(t, bytes.NewReader(zstdOf(t, patterned(32<<20))))
	_, err := source.Open(t.Context(), "-", source.Options{TempDir: tmp})
	var se *source.SpaceError
	if !errors.As(err, &se) || se.Need != -1 || se.Dir != tmp {
		t.Fatalf("Open: %v, want a SpaceError of unknown need", err)
	}
	assertEmpty(t, tmp)
}

// TestStreamRawSpoolCap: streaming applies the spool cap too, so inspect
// rejects what convert and import would.
func TestStreamRawSpoolCap(t *testing.T) {
	tmp := t.TempDir()
	source.SetStdin(t, bytes.NewReader(zstdOf(t, patterned(6<<20))))
	_, err := source.Open(t.Context(), "-", source.Options{TempDir: tmp, StreamRaw: true, MaxSpool: 4 << 20})
	if re := reject.As(err); re == nil || re.Reason != reject.SpoolLimit {
		t.Fatalf("Open: %v, want %s", err, reject.SpoolLimit)
	}
}
