package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// validQCOW2 makes a 4 MiB qcow2 with data, compressed when asked.
func validQCOW2(t *testing.T, dir string, compressed bool) string {
	t.Helper()
	raw := filepath.Join(dir, "src.raw")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "raw", raw, "4M")
	testenv.Run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x61 0 1M", "-c", "write -P 0x62 3M 512k", raw)
	p := filepath.Join(dir, "disk.qcow2")
	args := []string{"convert", "-O", "qcow2"}
	if compressed {
		args = append(args, "-c")
	}
	testenv.Run(t, "qemu-img", append(args, raw, p)...)
	return p
}

// patch overwrites bytes of a file at off.
func patch(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestInspectExitCodesAndJSON(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	good := validQCOW2(t, dir, false)

	code, out, _ := testenv.Exit(t, testenv.Imagectl, "inspect", "-o", "json", good)
	if code != 0 {
		t.Fatalf("inspect of a valid image exited %d", code)
	}
	var r api.ImageReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Verdict != api.VerdictAccepted || r.Format != "qcow2" || r.VirtualSize != 4<<20 {
		t.Errorf("report = %+v", r)
	}

	backing := filepath.Join(dir, "overlay.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", backing)
	code, out, _ = testenv.Exit(t, testenv.Imagectl, "inspect", "-o", "json", backing)
	if code != 3 {
		t.Fatalf("inspect of a backing-file image exited %d, want 3", code)
	}
	r = api.ImageReport{}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Verdict != api.VerdictRejected || len(r.Reasons) != 1 || r.Reasons[0].Code != "backing-file" {
		t.Errorf("report = %+v", r)
	}

	code, out, _ = testenv.Exit(t, testenv.Imagectl, "inspect", backing)
	if code != 3 || !strings.Contains(out, "verdict:") || !strings.Contains(out, "backing-file") {
		t.Errorf("table output (exit %d):\n%s", code, out)
	}

	code, _, stderr := testenv.Exit(t, testenv.Imagectl, "inspect", filepath.Join(dir, "missing"))
	if code != 1 || !strings.Contains(stderr, "no such file") {
		t.Errorf("missing file: exit %d, stderr %q", code, stderr)
	}
}

func TestConvertRejectedLeavesNothing(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	src := validQCOW2(t, dir, false)
	patch(t, src, 72+7, []byte{0x02}) // corrupt bit
	out := filepath.Join(dir, "out.qcow2")
	code, _, stderr := testenv.Exit(t, testenv.Imagectl, "convert", src, out)
	if code != 3 || !strings.Contains(stderr, "corrupt") {
		t.Fatalf("exit %d, stderr %q; want 3 and the reason", code, stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("output exists after a rejection: %v", err)
	}
}

// TestConvertFailingMidwayLeavesNothing corrupts a compressed cluster far
// into the image: the rejection comes after output has started.
func TestConvertFailingMidwayLeavesNothing(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	src := validQCOW2(t, dir, true)
	testenv.CorruptLastCompressedCluster(t, src)

	out := filepath.Join(dir, "out.raw")
	code, _, stderr := testenv.Exit(t, testenv.Imagectl, "convert", "--to", "raw", src, out)
	if code != 3 || !strings.Contains(stderr, "invalid-compressed-cluster") {
		t.Fatalf("exit %d, stderr %q; want 3 and invalid-compressed-cluster", code, stderr)
	}
	for _, name := range testenv.Entries(t, dir) {
		if strings.HasPrefix(name, "out") || strings.Contains(name, "partial") {
			t.Errorf("left behind %s", name)
		}
	}
}

func TestConvertToStdout(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	src := validQCOW2(t, dir, false)
	code, out, stderr := testenv.Exit(t, testenv.Imagectl, "convert", "--to", "raw", src, "-")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if len(out) != 4<<20 || out[0] != 0x61 || out[3<<20] != 0x62 || out[2<<20] != 0 {
		t.Errorf("stdout is %d bytes with unexpected contents", len(out))
	}
}

func TestDeclaredFormatMismatch(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	src := validQCOW2(t, dir, false)
	code, _, stderr := testenv.Exit(t, testenv.Imagectl, "convert", "--format", "raw", src, filepath.Join(dir, "o"))
	if code != 3 || !strings.Contains(stderr, "format-mismatch") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// TestPeakMemory64GiBSparse measures imagectl's peak RSS, with GNU time,
// converting a 64 GiB-virtual sparse disk both ways: it must stay under
// 64 MiB however large the disk is.
func TestPeakMemory64GiBSparse(t *testing.T) {
	testenv.RequireQEMU(t)
	need.Program(t, "/usr/bin/time")
	dir := t.TempDir()
	raw := filepath.Join(dir, "big.raw")
	f, err := os.Create(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 30); err != nil {
		t.Fatal(err)
	}
	chunk := []byte(strings.Repeat("imagepipe", 100000))
	for _, off := range []int64{0, 1 << 30, 17<<30 + 12345, 40 << 30, 64<<30 - int64(len(chunk))} {
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	qcow := filepath.Join(dir, "big.qcow2")
	steps := [][]string{
		{"convert", raw, qcow},
		{"convert", "--to", "raw", qcow, filepath.Join(dir, "back.raw")},
		{"convert", qcow, "-"}, // the streaming path
	}
	for _, args := range steps {
		rssFile := filepath.Join(dir, "rss")
		cmd := append([]string{"-f", "%M", "-o", rssFile, testenv.Imagectl}, args...)
		code, _, stderr := testenv.Exit(t, "/usr/bin/time", cmd...)
		if code != 0 {
			t.Fatalf("imagectl %v: exit %d: %s", args, code, stderr)
		}
		b, err := os.ReadFile(rssFile)
		if err != nil {
			t.Fatal(err)
		}
		var kib int64
		if _, err := fmt.Sscan(string(b), &kib); err != nil {
			t.Fatalf("reading GNU time output %q: %v", b, err)
		}
		t.Logf("imagectl %s: peak RSS %d KiB", strings.Join(args[:len(args)-2], " "), kib)
		if kib > 64<<10 {
			t.Errorf("imagectl %v: peak RSS %d KiB, over 64 MiB", args, kib)
		}
	}
	testenv.Run(t, "qemu-img", "compare", "-q", raw, qcow)
}
