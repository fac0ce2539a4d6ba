package hostile

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

var (
	buildOnce  sync.Once
	builtPath  string
	buildError error
)

// imagectlPath is the binary under test: the one testenv.Main set, else
// $IMAGECTL, else one built from this tree for the test run.
func imagectlPath(t *testing.T) string {
	t.Helper()
	if testenv.Imagectl != "" {
		return testenv.Imagectl
	}
	if p := os.Getenv("IMAGECTL"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "imagectl-build-")
		if err != nil {
			buildError = err
			return
		}
		builtPath = filepath.Join(dir, "imagectl")
		out, err := exec.Command("go", "build", "-o", builtPath, "github.com/imagepipe/imagepipe/cmd/imagectl").CombinedOutput()
		if err != nil {
			buildError = errors.New(string(out))
		}
	})
	if buildError != nil {
		t.Fatalf("building imagectl: %v", buildError)
	}
	return builtPath
}

// pattern is 1 MiB of a repeating non-zero pattern: nothing in it is a hole.
func pattern() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i%251) + 1
	}
	return b
}

// writeBomb writes a compressed stream that expands to total bytes of the
// non-zero pattern, without ever holding or writing the expansion: one
// compressed frame (member, stream) of chunk bytes, repeated. Concatenated
// zstd frames, gzip members and xz streams are each one valid stream.
func writeBomb(t *testing.T, path, wrapper string, total, chunk int64) {
	t.Helper()
	var frame bytes.Buffer
	var w io.WriteCloser
	var err error
	switch wrapper {
	case "zstd":
		w, err = zstd.NewWriter(&frame, zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithWindowSize(8<<20))
	case "gzip":
		w, err = gzip.NewWriterLevel(&frame, gzip.BestCompression)
	case "xz":
		w, err = xz.NewWriter(&frame)
	}
	if err != nil {
		t.Fatal(err)
	}
	p := pattern()
	for n := int64(0); n < chunk; n += int64(len(p)) {
		if _, err := w.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for n := int64(0); n < total; n += chunk {
		if _, err := f.Write(frame.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
}

// smallTmpfs mounts a tmpfs of size bytes for the test.
func smallTmpfs(t *testing.T, size int64) string {
	t.Helper()
	need.Root(t, "the test mounts a small tmpfs")
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, 0) })
	return dir
}

// usedBytes is what the file system of dir holds.
func usedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// watchCreates reports every file created in dir (the spool is unlinked at
// once, so only its creation can be seen) until stop is called.
func watchCreates(t *testing.T, dir string) (stop func() []string) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MODIFY); err != nil {
		t.Fatalf("inotify watch: %v", err)
	}
	return func() []string {
		defer unix.Close(fd)
		var names []string
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if n <= 0 || err != nil {
				return names
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				nameLen := int(uint32(buf[off+12]) | uint32(buf[off+13])<<8 | uint32(buf[off+14])<<16 | uint32(buf[off+15])<<24)
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nameLen]), "\x00")
				names = append(names, name)
				off += unix.SizeofInotifyEvent + nameLen
			}
		}
	}
}

// TestInspectBombWritesNothing: inspect of a decompression bomb (8 GiB of
// real data from 256 KiB of zstd; gzip and xz variants) reads it through
// without writing a byte of temporary data: no file is even created in the
// temporary directory, which is a 16 MiB tmpfs when the test may mount one.
func TestInspectBombWritesNothing(t *testing.T) {
	bin := imagectlPath(t)
	cases := []struct {
		wrapper      string
		total, chunk int64
	}{
		{"zstd", 8 << 30, 64 << 20},
		{"gzip", 1 << 30, 64 << 20},
		{"xz", 256 << 20, 8 << 20},
	}
	for _, c := range cases {
		t.Run(c.wrapper, func(t *testing.T) {
			bomb := filepath.Join(t.TempDir(), "bomb."+c.wrapper)
			writeBomb(t, bomb, c.wrapper, c.total, c.chunk)
			st, _ := os.Stat(bomb)
			t.Logf("%s bomb: %d bytes expanding to %d", c.wrapper, st.Size(), c.total)
			tmp := smallTmpfs(t, 16<<20)
			stop := watchCreates(t, tmp)
			r := testenv.RunCommand(t, testenv.Command{
				Name: bin,
				Args: []string{"inspect", "-o", "json", "--temp-dir", tmp, bomb},
				Env:  []string{"TMPDIR=" + tmp},
			})
			created := stop()
			if r.Code != 0 {
				t.Fatalf("inspect: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			var rep api.ImageReport
			if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
				t.Fatalf("inspect output: %v\n%s", err, r.Stdout)
			}
			if rep.Format != "raw" || rep.FileSize != c.total || rep.AllocatedSize != c.total || rep.Wrapper != c.wrapper {
				t.Errorf("report: %+v", rep)
			}
			if len(created) != 0 {
				t.Errorf("inspect created %q in the temporary directory", created)
			}
			if u := usedBytes(t, tmp); u != 0 {
				t.Errorf("the tmpfs holds %d bytes after inspect", u)
			}
		})
	}
}

// TestInspectKilledLeavesNoXZ: imagectl killed (SIGKILL, which it cannot
// catch) while the xz program decodes for inspect takes the program with
// it. The program writes into a memory file, not into a pipe whose reader
// going away would end it, and it may be stopped waiting for imagectl to
// read on: left alone it would decode the whole bomb, or wait forever.
func TestInspectKilledLeavesNoXZ(t *testing.T) {
	need.Program(t, "xz")
	bin := imagectlPath(t)
	bomb := filepath.Join(t.TempDir(), "bomb.xz")
	writeBomb(t, bomb, "xz", 16<<30, 8<<20) // minutes of decoding
	cmd := exec.Command(bin, "inspect", "--temp-dir", t.TempDir(), bomb)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	xzPID := waitForChild(t, cmd.Process.Pid, "xz")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(time.Minute) // only keeps a broken build from hanging
	for state := processState(xzPID); state != 0 && state != 'Z'; state = processState(xzPID) {
		if time.Now().After(deadline) {
			syscall.Kill(xzPID, syscall.SIGKILL)
			t.Fatalf("xz (pid %d, state %q) outlived the imagectl that started it", xzPID, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitForChild waits until process pid has a child whose command is name
// and returns its pid.
func waitForChild(t *testing.T, pid int, name string) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
		for _, task := range tasks {
			b, _ := os.ReadFile(task)
			for _, f := range strings.Fields(string(b)) {
				comm, _ := os.ReadFile(filepath.Join("/proc", f, "comm"))
				args, _ := os.ReadFile(filepath.Join("/proc", f, "cmdline"))
				if strings.TrimSpace(string(comm)) == name && bytes.Contains(args, []byte("--decompress")) {
					child, _ := strconv.Atoi(f)
					return child
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d started no %s", pid, name)
	return 0
}

// processState is the state letter of process pid ('R', 'S', 'T', 'Z',
// ...), or 0 when there is no such process.
func processState(pid int) byte {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	_, after, ok := strings.Cut(string(b), ") ")
	if !ok || after == "" {
		return 0
	}
	return after[0]
}

// TestSpoolCapRejects: a compressed qcow2 or a bomb that convert and import
// would have to spool past --max-spool is rejected with exit 3, the reason
// spool-limit (in import's and inspect's -o json), and a sentence naming
// the flag; nothing is pushed.
func TestSpoolCapRejects(t *testing.T) {
	bin := imagectlPath(t)
	dir := t.TempDir()
	bomb := filepath.Join(dir, "bomb.zst")
	writeBomb(t, bomb, "zstd", 1<<30, 64<<20)
	tmp := t.TempDir()

	r := testenv.RunCommand(t, testenv.Command{Name: bin, Args: []string{"convert", "--max-spool", "16MiB", "--temp-dir", tmp, bomb, filepath.Join(dir, "out.qcow2")}})
	if r.Code != 3 || !strings.Contains(r.Stderr, "spool-limit") || !strings.Contains(r.Stderr, "--max-spool") {
		t.Errorf("convert: exit %d, stderr %q; want 3 naming spool-limit and --max-spool", r.Code, r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "out.qcow2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("convert left its output: %v", err)
	}

	var pushes atomic.Int64
	reg := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodPut || req.Method == http.MethodPatch {
			pushes.Add(1)
		}
		reg.ServeHTTP(w, req)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	r = testenv.RunCommand(t, testenv.Command{Name: bin, Args: []string{"import", "-o", "json", "--max-spool", "16MiB", "--temp-dir", tmp, bomb, host + "/acme/bomb:1"}})
	var rep api.ImageReport
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("import -o json: exit %d, %v\nstdout %q\nstderr %q", r.Code, err, r.Stdout, r.Stderr)
	}
	if r.Code != 3 || rep.Verdict != api.VerdictRejected || len(rep.Reasons) != 1 || rep.Reasons[0].Code != "spool-limit" ||
		!strings.Contains(rep.Reasons[0].Message, "--max-spool") || !strings.Contains(r.Stderr, "--max-spool") {
		t.Errorf("import: exit %d, report %+v, stderr %q", r.Code, rep, r.Stderr)
	}
	if n := pushes.Load(); n != 0 {
		t.Errorf("import sent %d upload requests for a rejected source", n)
	}

	// inspect streams a raw bomb, but a qcow2 needs random access: it is
	// spooled, within the cap.
	qcow := filepath.Join(dir, "big.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", qcow, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	if out, err := exec.Command("qemu-io", "-c", "write -P 0x5a 0 24M", qcow).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v %s", err, out)
	}
	zq := qcow + ".zst"
	zw, _ := zstd.NewWriter(nil)
	raw, err := os.ReadFile(qcow)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(zq, zw.EncodeAll(raw, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	r = testenv.RunCommand(t, testenv.Command{Name: bin, Args: []string{"inspect", "-o", "json", "--max-spool", "8MiB", "--temp-dir", tmp, zq}})
	rep = api.ImageReport{}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || r.Code != 3 || len(rep.Reasons) != 1 || rep.Reasons[0].Code != "spool-limit" {
		t.Errorf("inspect of a qcow2 over the spool cap: exit %d, %v, %q", r.Code, err, r.Stdout)
	}
	r = testenv.RunCommand(t, testenv.Command{Name: bin, Args: []string{"inspect", "-o", "json", "--max-spool", "64MiB", "--temp-dir", tmp, zq}})
	if r.Code != 0 || !strings.Contains(r.Stdout, `"format": "qcow2"`) {
		t.Errorf("inspect of a qcow2 within the spool cap: exit %d, %q %q", r.Code, r.Stdout, r.Stderr)
	}
}

// TestSpoolFreeSpace: with a 4 MiB tmpfs as --temp-dir, convert of a
// 256 MiB download of announced size is refused before the body is read (a
// counting server sent only what the socket buffers take), and a bomb of
// unknown final size stops once the tmpfs nears its margin; the errors name
// the directory, the figures and --temp-dir, and nothing stays behind.
func TestSpoolFreeSpace(t *testing.T) {
	bin := imagectlPath(t)
	tmp := smallTmpfs(t, 96<<20)
	const size = 256 << 20
	p := pattern()
	var sent atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for off := 0; off < size; off += len(p) {
			n, err := w.Write(p)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "out.qcow2")
	r := testenv.RunCommand(t, testenv.Command{Name: bin, Args: []string{"convert", "--temp-dir", tmp, srv.URL + "/disk.img", out}})
	if r.Code != 1 || !strings.Contains(r.Stderr, tmp) || !strings.Contains(r.Stderr, strconv.Itoa(size)) || !strings.Contains(r.Stderr, "--temp-dir") {
		t.Errorf("convert of a download larger than the temp dir: exit %d, stderr %q", r.Code, r.Stderr)
	}
	srv.Close() // waits for the handler, so sent is final
	if s := sent.Load(); s > 32<<20 {
		t.Errorf("the server sent %d of %d bytes before the refusal", s, size)
	}
	if u := usedBytes(t, tmp); u != 0 {
		t.Errorf("the tmpfs holds %d bytes", u)
	}

	bomb := filepath.Join(t.TempDir(), "bomb.zst")
	writeBomb(t, bomb, "zstd", 1<<30, 64<<20)
	r = testenv.RunCommand(t, testenv.Command{Name: bin, Args: []string{"convert", "--temp-dir", tmp, bomb, out}})
	if r.Code != 1 || !strings.Contains(r.Stderr, "nearly full") || !strings.Contains(r.Stderr, tmp) || !strings.Contains(r.Stderr, "--temp-dir") {
		t.Errorf("convert of a bomb larger than the temp dir: exit %d, stderr %q", r.Code, r.Stderr)
	}
	if u := usedBytes(t, tmp); u != 0 {
		t.Errorf("the tmpfs holds %d bytes", u)
	}
}

// TestInspectStreamAgreesWithConvert: inspect judges a compressed raw
// stream from its head and tail only, and must reach the verdict convert
// reaches on the spooled copy: a VHD footer in the last sector, an ISO
// volume descriptor at 32 KiB, a plain raw disk, and a stream past the
// spool cap.
func TestInspectStreamAgreesWithConvert(t *testing.T) {
	bin := imagectlPath(t)
	dir := t.TempDir()
	disk := func(edit func(b []byte)) []byte {
		b := make([]byte, 4<<20)
		copy(b[1<<20:], pattern())
		edit(b)
		return b
	}
	cases := []struct {
		name   string
		data   []byte
		args   []string
		reason string // "" for accepted
	}{
		{"raw", disk(func([]byte) {}), nil, ""},
		{"vhd-footer", disk(func(b []byte) { copy(b[len(b)-512:], "conectix") }), nil, "unsupported-format"},
		{"iso", disk(func(b []byte) { copy(b[0x8001:], "CD001") }), nil, "unsupported-format"},
		{"over-spool-cap", disk(func([]byte) {}), []string{"--max-spool", "2MiB"}, "spool-limit"},
	}
	zw, _ := zstd.NewWriter(nil)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := filepath.Join(dir, c.name+".zst")
			if err := os.WriteFile(in, zw.EncodeAll(c.data, nil), 0o644); err != nil {
				t.Fatal(err)
			}
			r := testenv.RunCommand(t, testenv.Command{Name: bin, Args: append([]string{"inspect", "-o", "json", in}, c.args...)})
			var rep api.ImageReport
			if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
				t.Fatalf("inspect: exit %d, %v, %q", r.Code, err, r.Stderr)
			}
			out := filepath.Join(dir, c.name+".qcow2")
			cr := testenv.RunCommand(t, testenv.Command{Name: bin, Args: append([]string{"convert", in, out}, c.args...)})
			if c.reason == "" {
				if r.Code != 0 || cr.Code != 0 || rep.FileSize != int64(len(c.data)) {
					t.Fatalf("inspect exit %d (%+v), convert exit %d %q; want both accepted", r.Code, rep, cr.Code, cr.Stderr)
				}
				return
			}
			if r.Code != 3 || len(rep.Reasons) != 1 || rep.Reasons[0].Code != c.reason {
				t.Errorf("inspect: exit %d, %+v; want 3 (%s)", r.Code, rep.Reasons, c.reason)
			}
			if cr.Code != 3 || !strings.Contains(cr.Stderr, "("+c.reason+")") {
				t.Errorf("convert: exit %d, %q; want 3 (%s)", cr.Code, cr.Stderr, c.reason)
			}
		})
	}
}
