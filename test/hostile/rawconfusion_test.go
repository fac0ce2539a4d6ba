package hostile

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/reject"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// Format confusion around raw (the CVE-2008-2004 class): a file that QEMU
// would open as another format must never be accepted as raw, and a raw
// disk imagepipe writes must never be one that QEMU would open as another
// format. qemu-img info, which probes like every QEMU consumer, is the
// oracle for what "another format" means.

// confusionCases are files QEMU recognises by content, built at test time:
// by qemu-img where it can create the format, by hand where QEMU only reads it.
var confusionCases = []struct {
	format string
	build  func(t *testing.T, path string)
	want   reject.Reason
}{
	{"parallels", qemuCreate("parallels"), reject.UnsupportedFormat},
	{"vpc", qemuCreate("vpc"), reject.UnsupportedFormat},
	{"vhdx", qemuCreate("vhdx"), reject.UnsupportedFormat},
	{"vdi", qemuCreate("vdi"), reject.UnsupportedFormat},
	{"qed", qemuCreate("qed"), reject.UnsupportedFormat},
	{"qcow", qemuCreate("qcow"), reject.UnsupportedFormat},
	{"vmdk", qemuCreate("vmdk"), reject.UnsupportedFormat},
	{"luks", createLUKS, reject.Encrypted},
	{"bochs", writeBochs, reject.UnsupportedFormat},
	{"cloop", writeCloop, reject.UnsupportedFormat},
}

func qemuCreate(format string, extra ...string) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		args := append([]string{"create", "-q", "-f", format}, extra...)
		testenv.Run(t, "qemu-img", append(args, path, "1M")...)
	}
}

// createLUKS makes a LUKS container with qemu-img (hostile_test.go's
// builder, which retries qemu-img's flaky key-derivation benchmark).
func createLUKS(t *testing.T, path string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Rename(luksContainer(t, dir), path); err != nil {
		t.Fatal(err)
	}
}

// writeBochs writes a growing Bochs redolog header, which QEMU's bochs
// driver probes (it has no way to create one).
func writeBochs(t *testing.T, path string) {
	h := make([]byte, 512+8192)
	copy(h, "Bochs Virtual HD Image")
	copy(h[32:], "Redolog")
	copy(h[48:], "Growing")
	le := binary.LittleEndian
	le.PutUint32(h[64:], 0x00020000) // version
	le.PutUint32(h[68:], 512)        // header size
	le.PutUint32(h[72:], 512)        // catalog entries
	le.PutUint32(h[76:], 1)          // bitmap size
	le.PutUint32(h[80:], 4096)       // extent size
	le.PutUint64(h[88:], 1<<20)      // disk size
	writeFile(t, path, h)
}

// writeCloop writes a cloop header (the shell preamble and one block).
func writeCloop(t *testing.T, path string) {
	h := make([]byte, 4096)
	copy(h, "#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n")
	binary.BigEndian.PutUint32(h[128:], 4096)
	binary.BigEndian.PutUint32(h[132:], 1)
	writeFile(t, path, h)
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// qemuFormat is the format qemu-img's probing finds in path.
func qemuFormat(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "--output=json", path).Output()
	if err != nil {
		return "" // opened by no driver, raw included
	}
	var info struct{ Format string }
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	return info.Format
}

func TestFilesQEMUProbesAsAnotherFormatAreNotRaw(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	for i, tc := range confusionCases {
		t.Run(tc.format, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "disk.img")
			tc.build(t, path)
			if got := qemuFormat(t, path); got != tc.format {
				t.Fatalf("qemu-img probes the test file as %q, want %q: the test builds the wrong file", got, tc.format)
			}
			for _, declared := range []string{"", "raw"} {
				args := []string{"inspect", "-o", "json", path}
				if declared != "" {
					args = append(args, "--format", declared)
				}
				exit, out, stderr := testenv.Exit(t, testenv.Imagectl, args...)
				var r api.ImageReport
				if err := json.Unmarshal([]byte(out), &r); err != nil {
					t.Fatalf("inspect exit %d, output %q: %v\n%s", exit, out, err, stderr)
				}
				want := tc.want
				if declared == "raw" {
					want = reject.FormatMismatch
				}
				if exit != 3 || len(r.Reasons) != 1 || r.Reasons[0].Code != string(want) {
					t.Errorf("inspect --format %q: exit %d, report %+v; want exit 3 and %s", declared, exit, r, want)
				}
			}
			repo := fmt.Sprintf("acme/confusion-%d", i)
			res := testenv.RunCommand(t, testenv.Command{
				Name: testenv.Imagectl,
				Args: []string{"import", "--quiet", "--disk-format", "raw", path, reg.Host + "/" + repo + ":1"},
				Env:  []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
			})
			if res.Code != 3 || !strings.Contains(res.Stderr, "("+string(tc.want)+")") {
				t.Errorf("import: exit %d, stderr %q; want 3 and %s", res.Code, res.Stderr, tc.want)
			}
			assertNothingSent(t, reg, repo)
		})
	}

	// Apple disk images: QEMU picks its dmg driver by file name, so the
	// same bytes are raw or dmg depending on what the file is called.
	// imagepipe refuses them whatever the name.
	t.Run("dmg", func(t *testing.T) {
		dir := t.TempDir()
		b := make([]byte, 8192)
		copy(b[len(b)-512:], "koly")
		path := filepath.Join(dir, "disk.dmg")
		writeFile(t, path, b)
		if got := qemuFormat(t, path); got == "raw" {
			t.Fatalf("qemu-img opens a .dmg file with a koly trailer as raw")
		}
		exit, out, _ := testenv.Exit(t, testenv.Imagectl, "inspect", "-o", "json", path)
		if exit != 3 || !strings.Contains(out, string(reject.UnsupportedFormat)) {
			t.Errorf("inspect: exit %d, output %s; want 3 and %s", exit, out, reject.UnsupportedFormat)
		}
	})
}

// TestRawOutputThatProbesAsAnotherFormat: a valid qcow2 image whose guest
// disk begins with a qcow2 header. Written as a raw disk, QEMU would read
// it as a qcow2 image of the tenant's making (backing file included), so
// convert --to raw and import --disk-format raw refuse it before writing or
// sending anything; qcow2 output is fine.
func TestRawOutputThatProbesAsAnotherFormat(t *testing.T) {
	testenv.RequireQEMU(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	dir := t.TempDir()
	// The guest's first sector is itself an overlay of /etc/shadow.
	inner := filepath.Join(dir, "inner.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", "/etc/shadow", "-F", "raw", inner, "1M")
	path := filepath.Join(dir, "disk.qcow2")
	testenv.Run(t, "qemu-img", "create", "-q", "-f", "qcow2", path, "4M")
	st, err := os.Stat(inner)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, "qemu-io", "-f", "qcow2", "-c", fmt.Sprintf("write -s %s 0 %d", inner, st.Size()), path)
	rawCopy := filepath.Join(dir, "qemu.raw")
	testenv.Run(t, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", path, rawCopy)
	if got := qemuFormat(t, rawCopy); got != "qcow2" {
		t.Fatalf("qemu-img probes the raw copy as %q; the test wanted a guest that looks like qcow2", got)
	}

	exit, _, stderr := testenv.Exit(t, testenv.Imagectl, "convert", "--to", "raw", path, filepath.Join(dir, "out.raw"))
	if exit != 3 || !strings.Contains(stderr, "("+string(reject.AmbiguousRaw)+")") {
		t.Errorf("convert --to raw: exit %d, stderr %q; want 3 and %s", exit, stderr, reject.AmbiguousRaw)
	}
	if _, err := os.Stat(filepath.Join(dir, "out.raw")); !os.IsNotExist(err) {
		t.Errorf("convert --to raw left its output behind")
	}
	res := testenv.RunCommand(t, testenv.Command{
		Name: testenv.Imagectl,
		Args: []string{"import", "--quiet", "--disk-format", "raw", path, reg.Host + "/acme/looks-like-qcow2:1"},
		Env:  []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
	})
	if res.Code != 3 || !strings.Contains(res.Stderr, "("+string(reject.AmbiguousRaw)+")") {
		t.Errorf("import --disk-format raw: exit %d, stderr %q; want 3 and %s", res.Code, res.Stderr, reject.AmbiguousRaw)
	}
	assertNothingSent(t, reg, "acme/looks-like-qcow2")

	// As qcow2 the same disk is published, and reads back as the guest.
	res = testenv.RunCommand(t, testenv.Command{
		Name: testenv.Imagectl,
		Args: []string{"import", "--quiet", path, reg.Host + "/acme/looks-like-qcow2:2"},
		Env:  []string{"IMAGEPIPE_CACHE=" + t.TempDir()},
	})
	if res.Code != 0 {
		t.Errorf("import as qcow2: exit %d: %s", res.Code, res.Stderr)
	}
}
