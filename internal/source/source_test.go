package source_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/source"

	"github.com/imagepipe/imagepipe/internal/need"
)

// isolateCache points the digest cache at a fresh directory for one test.
func isolateCache(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("IMAGEPIPE_CACHE", dir)
	return dir
}

// imageBytes returns n deterministic bytes: random data with a run of zeros
// in the middle, so spooling has a hole to leave.
func imageBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, uint64(n)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	clear(b[n/4 : n/2])
	return b
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// sha256sum is the digest of path in Image.Digest form, from the sha256sum
// tool when it is installed.
func sha256sum(t *testing.T, path string) string {
	t.Helper()
	if _, err := exec.LookPath("sha256sum"); err == nil {
		out, err := exec.Command("sha256sum", path).Output()
		if err != nil {
			t.Fatalf("sha256sum: %v", err)
		}
		return "sha256:" + strings.Fields(string(out))[0]
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return digestOf(data)
}

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// compress runs tool (gzip, zstd or xz) on path and returns the new file.
func compress(t *testing.T, tool, path string) string {
	t.Helper()
	need.Program(t, tool)
	out, err := exec.Command(tool, "-c", path).Output()
	if err != nil {
		t.Fatalf("%s -c %s: %v", tool, path, err)
	}
	return writeFile(t, filepath.Dir(path), filepath.Base(path)+"."+tool, out)
}

func readAll(t *testing.T, img *source.Image) []byte {
	t.Helper()
	data, err := io.ReadAll(io.NewSectionReader(img.ReaderAt, 0, img.Size))
	if err != nil {
		t.Fatalf("reading the image: %v", err)
	}
	return data
}

// assertEmpty fails when dir holds anything: temporary files must not
// outlive Open's errors or Close.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind in the temp dir: %s", e.Name())
	}
}

func mustOpen(t *testing.T, spec string, opts source.Options) *source.Image {
	t.Helper()
	img, err := source.Open(t.Context(), spec, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", spec, err)
	}
	t.Cleanup(func() { img.Close() })
	return img
}

func TestOpenLocalPlain(t *testing.T) {
	isolateCache(t)
	data := imageBytes(3<<20 + 123)
	path := writeFile(t, t.TempDir(), "disk.raw", data)
	want := sha256sum(t, path)

	var lastDone, lastTotal int64
	hits := source.CacheHits()
	img := mustOpen(t, path, source.Options{Progress: func(done, total int64) { lastDone, lastTotal = done, total }})
	f, ok := img.ReaderAt.(*os.File)
	if !ok {
		t.Fatalf("ReaderAt is %T, want the *os.File itself", img.ReaderAt)
	}
	if f.Name() != path {
		t.Errorf("ReaderAt is %s, want %s", f.Name(), path)
	}
	if img.Digest != want || img.Size != int64(len(data)) || img.OriginalSize != img.Size || img.Wrapper != convert.WrapperNone || img.Name != path {
		t.Errorf("got %+v, want digest %s, size %d, no wrapper", img, want, len(data))
	}
	if lastDone != int64(len(data)) || lastTotal != int64(len(data)) {
		t.Errorf("last progress = %d/%d, want %d/%d", lastDone, lastTotal, len(data), len(data))
	}
	if got := source.CacheHits() - hits; got != 0 {
		t.Errorf("first open: %d cache hits, want 0", got)
	}
	if err := img.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("Close touched the tenant's file: %v", err)
	}

	// Unchanged: served from the cache, with the same digest.
	again := mustOpen(t, path, source.Options{Checksum: want})
	if got := source.CacheHits() - hits; got != 1 {
		t.Errorf("second open: %d cache hits, want 1", got)
	}
	if again.Digest != want {
		t.Errorf("cached digest = %s, want %s", again.Digest, want)
	}

	// Rewritten with the same size: the cache must not answer.
	data[0] ^= 0xff
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	changed := mustOpen(t, path, source.Options{})
	if got := source.CacheHits() - hits; got != 1 {
		t.Errorf("after a rewrite: %d cache hits, want still 1", got)
	}
	if want := digestOf(data); changed.Digest != want {
		t.Errorf("digest after a rewrite = %s, want %s", changed.Digest, want)
	}
}

func TestOpenLocalCorruptCache(t *testing.T) {
	cacheDir := isolateCache(t)
	cacheFile := filepath.Join(cacheDir, "digests.json")
	if err := os.WriteFile(cacheFile, []byte(`{"version":1,"entries":[{"path":`), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, t.TempDir(), "disk.raw", imageBytes(1<<20))
	hits := source.CacheHits()
	img := mustOpen(t, path, source.Options{})
	if want := sha256sum(t, path); img.Digest != want {
		t.Errorf("digest = %s, want %s", img.Digest, want)
	}
	// The corrupt file was replaced by a good one.
	mustOpen(t, path, source.Options{})
	if got := source.CacheHits() - hits; got != 1 {
		t.Errorf("%d cache hits after repairing the cache, want 1", got)
	}

	// An unwritable cache location does not fail the import either.
	t.Setenv("IMAGEPIPE_CACHE", filepath.Join(path, "not-a-dir"))
	if _, err := source.Open(t.Context(), path, source.Options{}); err != nil {
		t.Errorf("Open with an unusable cache: %v", err)
	}
}

func TestOpenLocalCacheBounded(t *testing.T) {
	cacheDir := isolateCache(t)
	dir := t.TempDir()
	// Fill the cache with 1000 older entries, then open one more file.
	var entries []string
	for i := range 1000 {
		entries = append(entries, fmt.Sprintf(`{"path":"/old/%d","dev":1,"ino":%d,"size":1,"mtime_ns":1,"ctime_ns":1,"digest":"sha256:00","stored_ns":%d}`, i, i, i+1))
	}
	cache := filepath.Join(cacheDir, "digests.json")
	if err := os.WriteFile(cache, []byte(`{"version":1,"entries":[`+strings.Join(entries, ",")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	mustOpen(t, writeFile(t, dir, "new.raw", imageBytes(4096)), source.Options{})
	data, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), `"path"`); n != 1000 {
		t.Errorf("the cache holds %d entries, want 1000", n)
	}
	if !strings.Contains(string(data), "new.raw") || strings.Contains(string(data), `"/old/0"`) {
		t.Errorf("the cache did not keep the newest entries")
	}
}

func TestOpenLocalWrapped(t *testing.T) {
	for _, tool := range []string{"gzip", "zstd", "xz"} {
		t.Run(tool, func(t *testing.T) {
			isolateCache(t)
			data := imageBytes(2<<20 + 77)
			dir := t.TempDir()
			path := compress(t, tool, writeFile(t, dir, "disk.raw", data))
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			tmp := t.TempDir()
			img, err := source.Open(t.Context(), path, source.Options{TempDir: tmp})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if img.Wrapper != convert.Wrapper(tool) {
				t.Errorf("wrapper = %q, want %s", img.Wrapper, tool)
			}
			if _, ok := img.ReaderAt.(*os.File); !ok {
				t.Errorf("ReaderAt is %T, want a spooled *os.File", img.ReaderAt)
			}
			if got := readAll(t, img); !bytes.Equal(got, data) {
				t.Errorf("unwrapped bytes differ from the original (%d vs %d bytes)", len(got), len(data))
			}
			if want := sha256sum(t, path); img.Digest != want {
				t.Errorf("digest = %s, want the compressed file's %s", img.Digest, want)
			}
			if img.OriginalSize != st.Size() || img.Size != int64(len(data)) {
				t.Errorf("sizes = %d original, %d unwrapped; want %d, %d", img.OriginalSize, img.Size, st.Size(), len(data))
			}
			if err := img.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			assertEmpty(t, tmp)

			hits := source.CacheHits()
			again := mustOpen(t, path, source.Options{TempDir: tmp})
			if source.CacheHits()-hits != 1 || again.Digest != img.Digest {
				t.Errorf("second open: %d cache hits, digest %s; want 1, %s", source.CacheHits()-hits, again.Digest, img.Digest)
			}
		})
	}
}

func TestOpenLocalRejects(t *testing.T) {
	isolateCache(t)
	dir := t.TempDir()
	raw := writeFile(t, dir, "disk.raw", imageBytes(1<<20))
	nested := compress(t, "gzip", compress(t, "zstd", raw))

	tmp := t.TempDir()
	_, err := source.Open(t.Context(), nested, source.Options{TempDir: tmp})
	if re := reject.As(err); re == nil || re.Reason != reject.Wrapper {
		t.Errorf("nested wrapper: err = %v, want a %s rejection", err, reject.Wrapper)
	}
	if err == nil || !strings.Contains(err.Error(), nested) {
		t.Errorf("error %q does not name the source", err)
	}

	_, err = source.Open(t.Context(), compress(t, "xz", raw), source.Options{TempDir: tmp, MaxSize: 1 << 19})
	if re := reject.As(err); re == nil {
		t.Errorf("over the cap: err = %v, want a rejection", err)
	}
	assertEmpty(t, tmp)

	if _, err := source.Open(t.Context(), dir, source.Options{}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: err = %v, want not a regular file", err)
	}
	if _, err := source.Open(t.Context(), filepath.Join(dir, "missing"), source.Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want ErrNotExist", err)
	}
	if _, err := source.Open(t.Context(), "ftp://host/disk", source.Options{}); err == nil {
		t.Errorf("ftp:// opened")
	}
}

func TestOpenChecksum(t *testing.T) {
	isolateCache(t)
	dir := t.TempDir()
	data := imageBytes(1 << 20)
	raw := writeFile(t, dir, "disk.raw", data)
	gz := compress(t, "gzip", raw)
	wrong := "sha256:" + strings.Repeat("ab", 32)
	for _, path := range []string{raw, gz} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			want := sha256sum(t, path)
			tmp := t.TempDir()
			_, err := source.Open(t.Context(), path, source.Options{TempDir: tmp, Checksum: strings.ToUpper(want[7:])})
			if err == nil || !strings.Contains(err.Error(), "sha256:<64 hex digits>") {
				t.Errorf("checksum without its algorithm: err = %v", err)
			}
			img := mustOpen(t, path, source.Options{TempDir: tmp, Checksum: "sha256:" + strings.ToUpper(want[7:])})
			img.Close()

			_, err = source.Open(t.Context(), path, source.Options{TempDir: tmp, Checksum: wrong})
			var ce *source.ChecksumError
			if !errors.As(err, &ce) || ce.Want != wrong || ce.Got != want {
				t.Fatalf("wrong checksum: err = %v, want a ChecksumError{%s, %s}", err, wrong, want)
			}
			if msg := err.Error(); !strings.Contains(msg, wrong) || !strings.Contains(msg, want) || !strings.Contains(msg, path) {
				t.Errorf("message %q does not name both digests and the source", msg)
			}
			assertEmpty(t, tmp)
		})
	}
}

func TestOpenStdin(t *testing.T) {
	dir := t.TempDir()
	data := imageBytes(3<<20 + 5)
	raw := writeFile(t, dir, "disk.raw", data)
	for _, path := range []string{raw, compress(t, "zstd", raw)} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			content, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				w.Write(content)
				w.Close()
			})
			defer wg.Wait()
			defer r.Close() // before wg.Wait, so a failed Open cannot leave the writer blocked
			source.SetStdin(t, r)

			var lastTotal int64
			tmp := t.TempDir()
			img := mustOpen(t, "-", source.Options{TempDir: tmp, Progress: func(_, total int64) { lastTotal = total }})
			if got := readAll(t, img); !bytes.Equal(got, data) {
				t.Errorf("bytes from stdin differ from the original")
			}
			if want := digestOf(content); img.Digest != want || img.OriginalSize != int64(len(content)) {
				t.Errorf("digest %s of %d bytes, want %s of %d", img.Digest, img.OriginalSize, want, len(content))
			}
			if lastTotal != -1 {
				t.Errorf("progress total = %d, want -1 (unknown)", lastTotal)
			}
			img.Close()
			assertEmpty(t, tmp)
		})
	}
}

func TestOpenStdinOverCap(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		w.Write(imageBytes(2 << 20)) // fails with EPIPE once Open gives up
		w.Close()
	})
	defer wg.Wait()
	defer r.Close() // before wg.Wait, so the writer is not left blocked
	source.SetStdin(t, r)
	tmp := t.TempDir()
	_, err = source.Open(t.Context(), "-", source.Options{TempDir: tmp, MaxSize: 1 << 20})
	if re := reject.As(err); re == nil || re.Reason != reject.VirtualSize {
		t.Errorf("err = %v, want a %s rejection", err, reject.VirtualSize)
	}
	if err == nil || !strings.Contains(err.Error(), "opening stdin") {
		t.Errorf("error %q does not name stdin", err)
	}
	assertEmpty(t, tmp)
}

// serveImage serves data at /disk, with Range support (http.ServeContent)
// or without.
func serveImage(t *testing.T, data []byte, ranges bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/disk" {
			http.NotFound(w, r)
			return
		}
		if ranges {
			http.ServeContent(w, r, "disk", time.Unix(1e9, 0), bytes.NewReader(data))
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Write(data)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestOpenHTTP(t *testing.T) {
	dir := t.TempDir()
	data := imageBytes(3<<20 + 9)
	raw := writeFile(t, dir, "disk.raw", data)
	for _, path := range []string{raw, compress(t, "gzip", raw)} {
		content, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, ranges := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/ranges=%v", filepath.Base(path), ranges), func(t *testing.T) {
				srv := serveImage(t, content, ranges)
				var lastDone, lastTotal int64
				tmp := t.TempDir()
				img := mustOpen(t, srv.URL+"/disk", source.Options{
					TempDir:  tmp,
					Checksum: digestOf(content),
					Progress: func(done, total int64) { lastDone, lastTotal = done, total },
				})
				if got := readAll(t, img); !bytes.Equal(got, data) {
					t.Errorf("downloaded bytes differ from the original")
				}
				if img.Digest != digestOf(content) || img.OriginalSize != int64(len(content)) {
					t.Errorf("digest %s of %d bytes, want %s of %d", img.Digest, img.OriginalSize, digestOf(content), len(content))
				}
				if lastDone != int64(len(content)) || lastTotal != int64(len(content)) {
					t.Errorf("last progress = %d/%d, want %d/%d", lastDone, lastTotal, len(content), len(content))
				}
				img.Close()
				assertEmpty(t, tmp)
			})
		}
	}
}

// cutOnce serves data with Range support, but cuts the first full response
// after half the body. It records the Range headers it is sent.
type cutOnce struct {
	data   []byte
	ranges bool
	cut    atomic.Bool
	mu     sync.Mutex
	seen   []string
}

func (c *cutOnce) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.seen = append(c.seen, r.Header.Get("Range"))
	c.mu.Unlock()
	w.Header().Set("ETag", `"v1"`)
	if r.Header.Get("Range") == "" && !c.cut.Swap(true) {
		if c.ranges {
			w.Header().Set("Accept-Ranges", "bytes")
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(c.data)))
		w.WriteHeader(http.StatusOK)
		w.Write(c.data[:len(c.data)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // drops the connection mid-body
	}
	http.ServeContent(w, r, "disk", time.Time{}, bytes.NewReader(c.data))
}

func TestOpenHTTPResume(t *testing.T) {
	source.SetResumeBackoff(t, time.Millisecond)
	dir := t.TempDir()
	data := imageBytes(4 << 20)
	gz := compress(t, "gzip", writeFile(t, dir, "disk.raw", data))
	content, err := os.ReadFile(gz)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ranges", func(t *testing.T) {
		h := &cutOnce{data: content, ranges: true}
		srv := httptest.NewServer(h)
		defer srv.Close()
		img := mustOpen(t, srv.URL, source.Options{Checksum: digestOf(content)})
		if got := readAll(t, img); !bytes.Equal(got, data) {
			t.Errorf("resumed download differs from the original")
		}
		if img.Digest != digestOf(content) {
			t.Errorf("digest = %s, want %s", img.Digest, digestOf(content))
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.seen) != 2 || !strings.HasPrefix(h.seen[1], "bytes=") || h.seen[1] == "bytes=0-" {
			t.Errorf("requests had Range headers %q, want none then bytes=N-", h.seen)
		}
	})

	t.Run("no ranges", func(t *testing.T) {
		srv := httptest.NewServer(&cutOnce{data: content})
		defer srv.Close()
		tmp := t.TempDir()
		_, err := source.Open(t.Context(), srv.URL, source.Options{TempDir: tmp})
		if err == nil {
			t.Fatal("a cut download without Range support succeeded")
		}
		if reject.As(err) != nil {
			t.Errorf("a network failure was reported as a rejection: %v", err)
		}
		if !strings.Contains(err.Error(), srv.URL) {
			t.Errorf("error %q does not name the URL", err)
		}
		assertEmpty(t, tmp)
	})
}

func TestOpenHTTPErrors(t *testing.T) {
	data := imageBytes(1 << 20)
	srv := serveImage(t, data, true)

	t.Run("404", func(t *testing.T) {
		_, err := source.Open(t.Context(), srv.URL+"/missing", source.Options{})
		if err == nil || !strings.Contains(err.Error(), "404 Not Found") || !strings.Contains(err.Error(), srv.URL+"/missing") {
			t.Errorf("err = %v, want one naming the URL and 404 Not Found", err)
		}
	})

	t.Run("query redacted", func(t *testing.T) {
		_, err := source.Open(t.Context(), srv.URL+"/missing?X-Amz-Signature=s3cr3t", source.Options{})
		if err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("err = %v, want one without the query string", err)
		}
	})

	t.Run("content-length over MaxSize", func(t *testing.T) {
		big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(1<<30))
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			// No body: a client that reads waits until the server gives up
			// and then sees a truncated body, not a size rejection.
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}))
		defer big.Close()
		tmp := t.TempDir()
		_, err := source.Open(t.Context(), big.URL, source.Options{TempDir: tmp, MaxSize: 1 << 20})
		if re := reject.As(err); re == nil || re.Reason != reject.VirtualSize {
			t.Errorf("err = %v, want a %s rejection", err, reject.VirtualSize)
		}
		assertEmpty(t, tmp)
	})

	t.Run("redirects", func(t *testing.T) {
		hops := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
			if n == 0 {
				http.Redirect(w, r, srv.URL+"/disk", http.StatusFound)
				return
			}
			http.Redirect(w, r, "/"+strconv.Itoa(n-1), http.StatusFound)
		}))
		defer hops.Close()
		img := mustOpen(t, hops.URL+"/4", source.Options{}) // 5 redirects
		if img.Digest != digestOf(data) {
			t.Errorf("digest after redirects = %s, want %s", img.Digest, digestOf(data))
		}
		if _, err := source.Open(t.Context(), hops.URL+"/5", source.Options{}); err == nil || !strings.Contains(err.Error(), "redirects") {
			t.Errorf("6 redirects: err = %v, want a redirect limit error", err)
		}
	})

	t.Run("checksum mismatch", func(t *testing.T) {
		tmp := t.TempDir()
		wrong := "sha256:" + strings.Repeat("0", 64)
		_, err := source.Open(t.Context(), srv.URL+"/disk", source.Options{TempDir: tmp, Checksum: wrong})
		var ce *source.ChecksumError
		if !errors.As(err, &ce) || ce.Got != digestOf(data) {
			t.Errorf("err = %v, want a ChecksumError with the real digest", err)
		}
		assertEmpty(t, tmp)
	})
}

// TestOpenLocalDeferredDigest: with DeferDigest, Open does not wait for the
// hash; WaitDigest gives it, the cache remembers it, and closing early
// stops the hashing cleanly.
func TestOpenLocalDeferredDigest(t *testing.T) {
	isolateCache(t)
	data := imageBytes(5<<20 + 7)
	path := writeFile(t, t.TempDir(), "disk.raw", data)
	want := sha256sum(t, path)

	img := mustOpen(t, path, source.Options{DeferDigest: true})
	if _, ok := img.ReaderAt.(*os.File); !ok {
		t.Fatalf("ReaderAt is %T, want the *os.File", img.ReaderAt)
	}
	got, err := img.WaitDigest(t.Context())
	if err != nil || got != want {
		t.Fatalf("WaitDigest = %q, %v; want %s", got, err, want)
	}
	img.Close()

	hits := source.CacheHits()
	again := mustOpen(t, path, source.Options{DeferDigest: true})
	if again.Digest != want || source.CacheHits()-hits != 1 {
		t.Errorf("second open: digest %q, %d cache hits; want the cached digest", again.Digest, source.CacheHits()-hits)
	}
	again.Close()

	other := writeFile(t, t.TempDir(), "other.raw", imageBytes(9<<20))
	early := mustOpen(t, other, source.Options{DeferDigest: true})
	if err := early.Close(); err != nil {
		t.Errorf("Close while hashing: %v", err)
	}
}

// TestDigestOfSparseFile: holes, which are hashed without being read, give
// the same digest as reading every byte.
func TestDigestOfSparseFile(t *testing.T) {
	isolateCache(t)
	path := filepath.Join(t.TempDir(), "sparse.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(64 << 20)
	f.WriteAt(imageBytes(3<<20), 5<<20)
	f.WriteAt([]byte("end"), 40<<20+11)
	f.Close()
	want := sha256sum(t, path)
	img := mustOpen(t, path, source.Options{})
	defer img.Close()
	if img.Digest != want {
		t.Errorf("digest %s, want %s", img.Digest, want)
	}
}

// TestForgedDigestCacheIgnored: a digest cache that others may write is
// ignored, so a digest planted in it cannot make a different file pass
// --checksum; the same forgery in a private cache would be believed, which
// shows that the permission check is what stops it.
func TestForgedDigestCacheIgnored(t *testing.T) {
	cacheDir := isolateCache(t)
	path := writeFile(t, t.TempDir(), "disk.raw", imageBytes(1<<20))
	want := sha256sum(t, path)
	mustOpen(t, path, source.Options{}) // records the true digest
	cache := filepath.Join(cacheDir, "digests.json")
	data, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	forged := "sha256:" + strings.Repeat("f", 64)
	if err := os.WriteFile(cache, []byte(strings.Replace(string(data), want, forged, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(cache, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := source.Open(t.Context(), path, source.Options{Checksum: forged}); err == nil {
		t.Fatal("a digest planted in a world-writable cache passed --checksum")
	}
	if img := mustOpen(t, path, source.Options{}); img.Digest != want {
		t.Errorf("digest = %s, want %s", img.Digest, want)
	}

	// The control: private, the planted entry is believed.
	if err := os.WriteFile(cache, []byte(strings.Replace(string(data), want, forged, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(cache, 0o600); err != nil {
		t.Fatal(err)
	}
	if img := mustOpen(t, path, source.Options{}); img.Digest != forged {
		t.Errorf("a private cache entry was not used (digest %s): the test no longer shows what the permission check does", img.Digest)
	}
}
