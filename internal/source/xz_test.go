package source_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/internal/source"

	"github.com/imagepipe/imagepipe/internal/need"
)

// xzBytes compresses data with the xz program and extra arguments.
func xzBytes(t *testing.T, data []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("xz", append([]string{"-c"}, args...)...)
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("xz: %v", err)
	}
	return out
}

// verdict is how Open failed: the rejection reason, or failed for a
// failure that is no rejection.
type verdict struct {
	reason reject.Reason
	failed bool
}

func verdictOf(err error) verdict {
	if re := reject.As(err); re != nil {
		return verdict{reason: re.Reason}
	}
	return verdict{failed: true}
}

// xzOutcome is what Open made of a source: its bytes and digest, or its
// verdict.
type xzOutcome struct {
	digest string
	data   []byte
	verdict
}

func openOutcome(t *testing.T, spec string, opts source.Options) (xzOutcome, error) {
	t.Helper()
	tmp := t.TempDir()
	opts.TempDir = tmp
	img, err := source.Open(t.Context(), spec, opts)
	defer assertEmpty(t, tmp)
	if err != nil {
		return xzOutcome{verdict: verdictOf(err)}, err
	}
	defer img.Close()
	return xzOutcome{digest: img.Digest, data: readAll(t, img)}, nil
}

// xzCase is an xz stream, valid or broken, and whether it decodes under
// the caps given.
type xzCase struct {
	name     string
	in       []byte
	maxSize  int64
	maxSpool int64
	ok       bool
}

// xzCases returns an image and the xz streams that TestXZProgramAgreesWithGo
// and TestXZProgramStreamAgrees decode: valid ones, broken ones, and ones
// over a cap.
func xzCases(t *testing.T) ([]byte, []xzCase) {
	t.Helper()
	data := imageBytes(3<<20 + 11)
	whole := xzBytes(t, data)
	multiBlock := xzBytes(t, data, "-T2", "--block-size=1MiB")
	corrupt := bytes.Clone(whole)
	corrupt[len(corrupt)/2] ^= 0xff
	gz, err := exec.Command("sh", "-c", "head -c 100000 /dev/zero | gzip -c").Output()
	if err != nil {
		t.Fatal(err)
	}
	return data, []xzCase{
		{name: "whole", in: whole, ok: true},
		{name: "multi-block", in: multiBlock, ok: true},
		{name: "two streams", in: append(bytes.Clone(whole), whole...), ok: true},
		{name: "stream padding", in: append(bytes.Clone(whole), 0, 0, 0, 0), ok: true},
		{name: "truncated", in: whole[:len(whole)/2]},
		{name: "truncated before the index", in: whole[:len(whole)-40]},
		{name: "corrupt", in: corrupt},
		{name: "garbage after", in: append(bytes.Clone(whole), "garbage!"...)},
		{name: "nested gzip", in: xzBytes(t, gz)},
		{name: "over the size cap", in: whole, maxSize: 1 << 20},
		{name: "over the spool cap", in: whole, maxSpool: 1 << 20},
	}
}

// TestXZProgramAgreesWithGo: the xz program and the pure-Go decoder give
// the same image and digest for valid streams, and the same rejection for
// broken ones: truncated, corrupt, with garbage after the stream, nested,
// or expanding past the cap.
func TestXZProgramAgreesWithGo(t *testing.T) {
	program := need.Program(t, "xz")
	isolateCache(t)
	data, cases := xzCases(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "disk.xz", tc.in)
			opts := source.Options{MaxSize: tc.maxSize, MaxSpool: tc.maxSpool}
			source.SetXZProgram(t, "")
			inGo, goErr := openOutcome(t, path, opts)
			source.SetXZProgram(t, program)
			viaProgram, progErr := openOutcome(t, path, opts)
			if tc.ok != (progErr == nil) || tc.ok != (goErr == nil) {
				t.Fatalf("want success %v; xz program: %v; Go: %v", tc.ok, progErr, goErr)
			}
			if viaProgram.reason != inGo.reason || viaProgram.failed != inGo.failed || viaProgram.digest != inGo.digest || !bytes.Equal(viaProgram.data, inGo.data) {
				t.Errorf("the xz program (%v) and Go (%v) disagree", progErr, goErr)
			}
			if !tc.ok && viaProgram.reason == "" {
				t.Errorf("the xz program's error is no rejection: %v", progErr)
			}
			if tc.ok && !bytes.Equal(viaProgram.data, data) && !strings.Contains(tc.name, "two streams") {
				t.Errorf("decoded %d bytes, want the original %d", len(viaProgram.data), len(data))
			}
		})
	}
	// A stream header and nothing else: the program says the input ends
	// early; the Go decoder gives an empty image, which the disk engine
	// rejects as empty.
	t.Run("header only", func(t *testing.T) {
		path := writeFile(t, t.TempDir(), "disk.xz", cases[0].in[:12])
		source.SetXZProgram(t, program)
		if out, err := openOutcome(t, path, source.Options{}); out.reason != reject.Wrapper {
			t.Errorf("the xz program: %v, want a %s rejection", err, reject.Wrapper)
		}
		source.SetXZProgram(t, "")
		if out, err := openOutcome(t, path, source.Options{}); err != nil || len(out.data) != 0 {
			t.Errorf("Go: %v, %d bytes; want an empty image", err, len(out.data))
		}
	})
	if testing.Verbose() {
		source.SetXZProgram(t, program)
		for _, tc := range cases {
			if tc.name == "corrupt" {
				path := writeFile(t, t.TempDir(), "disk.xz", tc.in)
				_, err := source.Open(t.Context(), path, source.Options{})
				t.Logf("a corrupt stream: %v", err)
			}
		}
	}
}

// streamOutcome is what Open made of a source it read through
// (Options.StreamRaw): the sizes, digest, head and tail it kept, or its
// verdict.
type streamOutcome struct {
	size, dataBytes int64
	digest          string
	head, tail      []byte
	verdict
}

func openStreamed(t *testing.T, spec string, opts source.Options) (streamOutcome, error) {
	t.Helper()
	tmp := t.TempDir()
	opts.TempDir, opts.StreamRaw = tmp, true
	img, err := source.Open(t.Context(), spec, opts)
	defer assertEmpty(t, tmp)
	if err != nil {
		return streamOutcome{verdict: verdictOf(err)}, err
	}
	defer img.Close()
	if !img.Streamed {
		t.Fatal("the image was spooled, not streamed")
	}
	out := streamOutcome{size: img.Size, dataBytes: img.DataBytes, digest: img.Digest}
	out.head = make([]byte, min(img.Size, 1<<20))
	out.tail = make([]byte, min(img.Size, 64<<10))
	if _, err := img.ReaderAt.ReadAt(out.head, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("reading the head: %v", err)
	}
	if _, err := img.ReaderAt.ReadAt(out.tail, img.Size-int64(len(out.tail))); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("reading the tail: %v", err)
	}
	return out, nil
}

// TestXZProgramStreamAgrees: read through without a spool (imagectl
// inspect), a file or a stream gives the same size, data count, digest,
// head and tail, or the same rejection, whether the xz program writes to a
// memory file, to a pipe (where no memory file can be made), or the Go
// decoder decodes it; and nothing is written to the temporary directory.
func TestXZProgramStreamAgrees(t *testing.T) {
	program := needXZ(t)
	isolateCache(t)
	data, cases := xzCases(t)
	decoders := []struct {
		name string
		set  func(t *testing.T)
	}{
		{"go", func(t *testing.T) { source.SetXZProgram(t, "") }},
		{"memory file", func(t *testing.T) { source.SetXZProgram(t, program) }},
		{"pipe", func(t *testing.T) { source.SetXZProgram(t, program); source.UseXZPipe(t) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "disk.xz", tc.in)
			opts := source.Options{MaxSize: tc.maxSize, MaxSpool: tc.maxSpool}
			var first streamOutcome
			for i, dec := range decoders {
				for _, spec := range []string{path, "-"} {
					t.Run(dec.name+"/"+spec, func(t *testing.T) {
						dec.set(t)
						source.SetStdin(t, bytes.NewReader(tc.in))
						got, err := openStreamed(t, spec, opts)
						if tc.ok != (err == nil) {
							t.Fatalf("err = %v, want success %v", err, tc.ok)
						}
						if !tc.ok && got.reason == "" {
							t.Errorf("the error is no rejection: %v", err)
						}
						if i == 0 && spec == path {
							first = got
							return
						}
						if got.size != first.size || got.dataBytes != first.dataBytes || got.digest != first.digest ||
							got.reason != first.reason || got.failed != first.failed ||
							!bytes.Equal(got.head, first.head) || !bytes.Equal(got.tail, first.tail) {
							t.Errorf("differs from the Go decoder reading the file (err %v): size %d/%d, data %d/%d, digest %s/%s, reason %q/%q",
								err, got.size, first.size, got.dataBytes, first.dataBytes, got.digest, first.digest, got.reason, first.reason)
						}
					})
				}
			}
			if tc.ok && tc.name == "whole" && (first.size != int64(len(data)) || !bytes.Equal(first.head, data[:1<<20])) {
				t.Errorf("the Go decoder read %d bytes, want the original %d", first.size, len(data))
			}
		})
	}
}

// TestXZProgramMissingFallsBack: an xz program that cannot start leaves
// the stream to the Go decoder.
func TestXZProgramMissingFallsBack(t *testing.T) {
	need.Program(t, "xz")
	isolateCache(t)
	data := imageBytes(1 << 20)
	path := writeFile(t, t.TempDir(), "disk.xz", xzBytes(t, data))
	source.SetXZProgram(t, "/nonexistent/xz")
	img := mustOpen(t, path, source.Options{})
	if got := readAll(t, img); !bytes.Equal(got, data) {
		t.Error("decoded bytes differ from the original")
	}
}

// TestXZProgramSourceFails: a download cut short under the xz program is a
// network failure, not a rejection of the image, and leaves nothing
// behind; so is one cut exactly after a complete stream, whose missing
// rest the program cannot see.
func TestXZProgramSourceFails(t *testing.T) {
	program := need.Program(t, "xz")
	source.SetXZProgram(t, program)
	data := imageBytes(2 << 20)
	whole := xzBytes(t, data)
	two := append(bytes.Clone(whole), whole...)
	for name, cut := range map[string]int{"mid-stream": len(whole) / 2, "after a whole stream": len(whole)} {
		t.Run(name, func(t *testing.T) {
			// No Accept-Ranges: the download cannot resume.
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(len(two)))
				w.Write(two[:cut])
				panic(http.ErrAbortHandler) // the connection drops
			}))
			defer srv.Close()
			tmp := t.TempDir()
			_, err := source.Open(t.Context(), srv.URL+"/disk.xz", source.Options{TempDir: tmp})
			if err == nil || reject.As(err) != nil || !strings.Contains(err.Error(), "reading") {
				t.Errorf("err = %v, want a reading failure that is no rejection", err)
			}
			assertEmpty(t, tmp)
		})
	}
	if _, err := os.Stat(program); errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}

// TestXZProgramKilled: an xz program that dies of a signal (as the OOM
// killer would end it) says nothing about the image: the error is no
// rejection. The program here is a stand-in that kills itself.
func TestXZProgramKilled(t *testing.T) {
	need.Program(t, "xz")
	isolateCache(t)
	dir := t.TempDir()
	killed := writeFile(t, dir, "xz", []byte("#!/bin/sh\nkill -KILL $$\n"))
	if err := os.Chmod(killed, 0o755); err != nil {
		t.Fatal(err)
	}
	source.SetXZProgram(t, killed)
	path := writeFile(t, dir, "disk.xz", xzBytes(t, imageBytes(1<<20)))
	_, err := source.Open(t.Context(), path, source.Options{TempDir: t.TempDir()})
	if err == nil || reject.As(err) != nil || !strings.Contains(err.Error(), "the xz program stopped") {
		t.Errorf("err = %v, want a failure of the program that is no rejection", err)
	}
}

func TestXZUtilsVersion(t *testing.T) {
	for out, ok := range map[string]bool{
		"xz (XZ Utils) 5.4.1\nliblzma 5.4.1\n": true,
		"xz (XZ Utils) 5.2.5\n":                true,
		"xz (XZ Utils) 6.0.0\n":                true,
		"xz (XZ Utils) 5.0.8\n":                false,
		"BusyBox v1.36.1 multi-call binary.\n": false,
		"":                                     false,
	} {
		if got := source.XZUtilsVersionOK(out); got != ok {
			t.Errorf("%q: %v, want %v", out, got, ok)
		}
	}
}

// TestOpenTruncatedWrapped: a compressed file cut short is rejected as a
// broken wrapper, whether the cut shows in the first MiB or later.
func TestOpenTruncatedWrapped(t *testing.T) {
	isolateCache(t)
	dir := t.TempDir()
	raw := writeFile(t, dir, "disk.raw", imageBytes(6<<20))
	for _, tool := range []string{"gzip", "zstd", "xz"} {
		whole, err := os.ReadFile(compress(t, tool, raw))
		if err != nil {
			t.Fatal(err)
		}
		for _, keep := range []int{len(whole) / 8, len(whole) * 3 / 4} {
			t.Run(tool+"/"+strconv.Itoa(keep), func(t *testing.T) {
				path := writeFile(t, t.TempDir(), "cut."+tool, whole[:keep])
				out, err := openOutcome(t, path, source.Options{})
				if out.reason != reject.Wrapper {
					t.Errorf("err = %v, want a %s rejection", err, reject.Wrapper)
				}
			})
		}
	}
}

// needXZ returns the path of the xz program, skipping the test without one.
func needXZ(t *testing.T) string {
	t.Helper()
	program := need.Program(t, "xz")
	return program
}

// TestXZProgramSpoolHasTheSameHoles: the xz program writes the spool
// itself and leaves only 8 KiB runs of zeros as holes; the spool it leaves
// holds the same data blocks as the Go decoder's, whose holes are every
// 4 KiB block of zeros, whether it read a file or a stream; streaming
// (inspect) counts the same data either way.
func TestXZProgramSpoolHasTheSameHoles(t *testing.T) {
	program := needXZ(t)
	isolateCache(t)
	// Alternate 4 KiB of data and 4 KiB of zeros: no 8 KiB run of zeros.
	data := make([]byte, 8<<20)
	for off := 0; off < len(data); off += 8 << 10 {
		copy(data[off:off+4<<10], patterned(4<<10))
	}
	path := writeFile(t, t.TempDir(), "disk.xz", xzBytes(t, data))
	blocks := map[string]int64{}
	allocated := func(img *source.Image) int64 {
		st, err := img.ReaderAt.(*os.File).Stat()
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Blocks * 512
	}
	source.SetXZProgram(t, program)
	img := mustOpen(t, path, source.Options{TempDir: t.TempDir()})
	if got := readAll(t, img); !bytes.Equal(got, data) {
		t.Error("the xz program's spool differs from the original")
	}
	blocks["program spool, file"] = allocated(img)
	compressed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	source.SetStdin(t, bytes.NewReader(compressed))
	blocks["program spool, stdin"] = allocated(mustOpen(t, "-", source.Options{TempDir: t.TempDir()}))
	blocks["program stream"] = mustOpen(t, path, source.Options{TempDir: t.TempDir(), StreamRaw: true}).DataBytes
	source.SetXZProgram(t, "")
	blocks["go spool"] = allocated(mustOpen(t, path, source.Options{TempDir: t.TempDir()}))
	blocks["go stream"] = mustOpen(t, path, source.Options{TempDir: t.TempDir(), StreamRaw: true}).DataBytes
	for name, n := range blocks {
		if want := int64(len(data) / 2); n != want {
			t.Errorf("%s: %d bytes of data, want %d", name, n, want)
		}
	}
}

// TestXZProgramBomb: a few KiB of xz expanding to GiBs of data (not
// zeros, which would cost no disk) is stopped by the file size limit the
// program runs under, at the spool cap or the size cap, whichever is
// smaller, with the rejection the Go decoder gives; nothing is left.
func TestXZProgramBomb(t *testing.T) {
	program := needXZ(t)
	isolateCache(t)
	// 256 MiB of 0x01 bytes: about 40 KiB of xz.
	cmd := exec.Command("sh", "-c", "head -c 268435456 /dev/zero | tr '\\0' '\\1' | xz -1 -c")
	bomb, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, t.TempDir(), "bomb.xz", bomb)
	for _, tc := range []struct {
		name   string
		opts   source.Options
		reason reject.Reason
	}{
		{"spool cap", source.Options{MaxSpool: 16 << 20}, reject.SpoolLimit},
		{"size cap", source.Options{MaxSize: 16 << 20}, reject.Wrapper},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, prog := range []string{program, ""} {
				source.SetXZProgram(t, prog)
				out, err := openOutcome(t, path, tc.opts)
				if out.reason != tc.reason {
					t.Errorf("xz program %q: %v, want a %s rejection", prog, err, tc.reason)
				}
			}
		})
	}
	if _, err := os.Stat("core"); err == nil {
		t.Error("the stopped xz program left a core file")
	}
}

// slowSource gives the first part of a stream, then waits for release
// before giving the rest.
// firstRead, when set, is closed once the first part has been read.
type slowSource struct {
	first, rest []byte
	release     <-chan struct{}
	firstRead   chan struct{}
}

func (s *slowSource) Read(p []byte) (int, error) {
	if len(s.first) > 0 {
		n := copy(p, s.first)
		s.first = s.first[n:]
		return n, nil
	}
	if s.firstRead != nil {
		close(s.firstRead)
		s.firstRead = nil
	}
	<-s.release
	if len(s.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.rest)
	s.rest = s.rest[n:]
	return n, nil
}

// TestXZProgramStoppedMidStream: while the xz program writes the spool, a
// temporary directory filling up stops it with a SpaceError, and a
// cancelled context stops it with the context's error; either way nothing
// is left behind and the error is no verdict on the image.
func TestXZProgramStoppedMidStream(t *testing.T) {
	program := needXZ(t)
	isolateCache(t)
	source.SetXZProgram(t, program)
	stream := xzBytes(t, patterned(16<<20), "-T2", "--block-size=1MiB")
	half := len(stream) / 2

	t.Run("space", func(t *testing.T) {
		release := make(chan struct{})
		var looks atomic.Int64
		source.SetFreeSpaceFunc(t, func(string) (int64, error) {
			// Plenty at first; then, once the watch has looked again
			// with the first half in, nearly full.
			if looks.Add(1) == 1 {
				return 1 << 40, nil
			}
			select {
			case <-release:
			default:
				close(release)
			}
			return source.SpoolMargin + 1<<20, nil
		})
		source.SetStdin(t, &slowSource{first: stream[:half], rest: stream[half:], release: release})
		tmp := t.TempDir()
		_, err := source.Open(t.Context(), "-", source.Options{TempDir: tmp})
		var se *source.SpaceError
		if !errors.As(err, &se) || se.Dir != tmp || reject.As(err) != nil {
			t.Fatalf("Open: %v, want a SpaceError", err)
		}
		assertEmpty(t, tmp)
	})

	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		release := make(chan struct{})
		firstRead := make(chan struct{})
		source.SetStdin(t, &slowSource{first: stream[:half], rest: stream[half:], release: release, firstRead: firstRead})
		go func() {
			// Cancel once the first half is in, then let the source go on.
			<-firstRead
			cancel()
			close(release)
		}()
		tmp := t.TempDir()
		_, err := source.Open(ctx, "-", source.Options{TempDir: tmp})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Open: %v, want context.Canceled", err)
		}
		assertEmpty(t, tmp)
	})
}

// TestXZProgramReadsALocalFile: the xz program reads a local xz file
// itself while the file is hashed alongside: the image, the digest of the
// file as given, a Checksum that does not match, the progress up to the
// whole file, and on a second open the digest from the cache; and the same
// when the file is read through rather than spooled (imagectl inspect).
func TestXZProgramReadsALocalFile(t *testing.T) {
	source.SetXZProgram(t, needXZ(t))
	isolateCache(t)
	data := imageBytes(5<<20 + 7)
	compressed := xzBytes(t, data)
	path := writeFile(t, t.TempDir(), "disk.raw.xz", compressed)
	var lastDone, lastTotal int64
	img := mustOpen(t, path, source.Options{TempDir: t.TempDir(), Progress: func(done, total int64) { lastDone, lastTotal = done, total }})
	if img.Digest != digestOf(compressed) || img.OriginalSize != int64(len(compressed)) || img.Wrapper != convert.WrapperXZ {
		t.Errorf("digest %s, original size %d, wrapper %s", img.Digest, img.OriginalSize, img.Wrapper)
	}
	if !bytes.Equal(readAll(t, img), data) {
		t.Error("decoded bytes differ")
	}
	if lastDone != int64(len(compressed)) || lastTotal != int64(len(compressed)) {
		t.Errorf("last progress %d/%d, want %d/%d", lastDone, lastTotal, len(compressed), len(compressed))
	}
	hits := source.CacheHits()
	again := mustOpen(t, path, source.Options{TempDir: t.TempDir()})
	if again.Digest != img.Digest || source.CacheHits() != hits+1 {
		t.Errorf("second open: digest %s, cache hits %d -> %d", again.Digest, hits, source.CacheHits())
	}
	tmp := t.TempDir()
	_, err := source.Open(t.Context(), path, source.Options{TempDir: tmp, Checksum: digestOf([]byte("another file"))})
	var ce *source.ChecksumError
	if !errors.As(err, &ce) || ce.Got != img.Digest {
		t.Errorf("a wrong checksum: %v", err)
	}
	assertEmpty(t, tmp)

	// Read through (inspect): the same, from the program's output in
	// memory; with SkipDigest, no digest.
	isolateCache(t)
	lastDone, lastTotal = 0, 0
	streamed := mustOpen(t, path, source.Options{TempDir: tmp, StreamRaw: true, Progress: func(done, total int64) { lastDone, lastTotal = done, total }})
	if !streamed.Streamed || streamed.Size != int64(len(data)) || streamed.Digest != img.Digest {
		t.Errorf("read through: streamed %v, %d bytes, digest %s", streamed.Streamed, streamed.Size, streamed.Digest)
	}
	if lastDone != int64(len(compressed)) || lastTotal != int64(len(compressed)) {
		t.Errorf("read through: last progress %d/%d, want %d/%d", lastDone, lastTotal, len(compressed), len(compressed))
	}
	isolateCache(t) // a cached digest would be given anyway
	skipped := mustOpen(t, path, source.Options{TempDir: tmp, StreamRaw: true, SkipDigest: true})
	if skipped.Digest != "" || skipped.Size != int64(len(data)) {
		t.Errorf("read through with SkipDigest: digest %q, %d bytes", skipped.Digest, skipped.Size)
	}
	assertEmpty(t, tmp)
}

// TestXZProgramUnlimitable: when the xz program's file size limit cannot
// be set (a non-root user whose own hard limit is lower than the cap), the
// stream is decoded for a reader instead (startXZ), which counts the
// cap itself: a file and a stream decode as usual, and a bomb is still
// rejected at the cap, leaving nothing behind.
func TestXZProgramUnlimitable(t *testing.T) {
	source.SetXZProgram(t, needXZ(t))
	isolateCache(t)
	source.FailXZLimit(t, syscall.EPERM)
	data := imageBytes(3<<20 + 5)
	compressed := xzBytes(t, data)
	path := writeFile(t, t.TempDir(), "disk.xz", compressed)
	if got := readAll(t, mustOpen(t, path, source.Options{TempDir: t.TempDir()})); !bytes.Equal(got, data) {
		t.Error("a local file: decoded bytes differ")
	}
	source.SetStdin(t, bytes.NewReader(compressed))
	if got := readAll(t, mustOpen(t, "-", source.Options{TempDir: t.TempDir()})); !bytes.Equal(got, data) {
		t.Error("stdin: decoded bytes differ")
	}
	out, err := openOutcome(t, path, source.Options{MaxSpool: 1 << 20})
	if out.reason != reject.SpoolLimit {
		t.Errorf("over the spool cap: %v, want a %s rejection", err, reject.SpoolLimit)
	}
}
