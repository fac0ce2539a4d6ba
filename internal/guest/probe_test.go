package guest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

const mib = 1 << 20

// run runs a program the test needs, failing with its output.
func run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(need.Program(t, name), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// filesystem makes a filesystem of size bytes with its own mkfs, in a
// file of its own, and returns the file.
func filesystem(t *testing.T, fs string, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), fs+".img")
	if err := os.Truncate(createFile(t, p), size); err != nil {
		t.Fatal(err)
	}
	switch fs {
	case FsExt2, FsExt3, FsExt4:
		run(t, "mkfs.ext4", "-q", "-F", "-t", fs, p)
	case FsXFS:
		run(t, "mkfs.xfs", "-q", "-f", p)
	case FsBtrfs:
		run(t, "mkfs.btrfs", "-q", "-f", p)
	case FsFAT:
		run(t, "mkfs.fat", "-F", "32", p)
	case FsNTFS:
		run(t, "mkntfs", "-q", "-F", "-f", p)
	case FsSwap:
		run(t, "mkswap", p)
	default:
		t.Fatalf("no mkfs for %s", fs)
	}
	return p
}

func createFile(t testing.TB, p string) string {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

// place copies the file src into disk at off, a MiB at a time, leaving
// holes where src is zeros (the disks stay sparse).
func place(t *testing.T, disk, src string, off int64) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	buf := make([]byte, mib)
	for pos := int64(0); ; pos += int64(len(buf)) {
		n, err := io.ReadFull(in, buf)
		if n > 0 && !allZero(buf[:n]) {
			if _, err := out.WriteAt(buf[:n], off+pos); err != nil {
				t.Fatal(err)
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func probeFile(t *testing.T, p string) *Layout {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	l, err := Probe(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestProbeReadsWhatTheToolsWrote: a GPT written by sgdisk with an ESP, a
// BIOS boot partition and partitions holding each filesystem its own
// mkfs made, an MBR written by sfdisk, and filesystems on whole disks.
func TestProbeReadsWhatTheToolsWrote(t *testing.T) {
	disk := filepath.Join(t.TempDir(), "gpt.raw")
	if err := os.Truncate(createFile(t, disk), 1200*mib); err != nil {
		t.Fatal(err)
	}
	parts := []struct {
		code, fs string
		size     int64
		role     string
	}{
		{"EF02", "", 1 * mib, RoleBIOSBoot},
		{"EF00", FsFAT, 64 * mib, RoleESP},
		{"8300", FsExt4, 64 * mib, RoleLinux},
		{"8300", FsXFS, 320 * mib, RoleLinux},
		{"8300", FsBtrfs, 128 * mib, RoleLinux},
		{"0700", FsNTFS, 64 * mib, RoleWindows},
		{"8200", FsSwap, 32 * mib, RoleSwap},
		{"8300", FsExt3, 32 * mib, RoleLinux},
	}
	args := []string{}
	for i, p := range parts {
		args = append(args, fmt.Sprintf("-n=%d:0:+%dM", i+1, p.size/mib), fmt.Sprintf("-t=%d:%s", i+1, p.code))
	}
	run(t, "sgdisk", append(args, disk)...)
	l := probeFile(t, disk)
	if l.Table != TableGPT || len(l.Partitions) != len(parts) || l.HybridMBR {
		t.Fatalf("layout %+v", l)
	}
	for i, p := range parts {
		if p.fs != "" {
			place(t, disk, filesystem(t, p.fs, p.size), l.Partitions[i].Start)
		}
	}
	l = probeFile(t, disk)
	for i, p := range parts {
		got := l.Partitions[i]
		if got.Role != p.role || got.Filesystem != p.fs || got.Size != p.size {
			t.Errorf("partition %d: %+v; want role %q, filesystem %q, %d bytes", i+1, got, p.role, p.fs, p.size)
		}
	}
	if len(l.Notes) != 0 {
		t.Errorf("notes on a valid disk: %v", l.Notes)
	}

	mbr := filepath.Join(t.TempDir(), "mbr.raw")
	if err := os.Truncate(createFile(t, mbr), 200*mib); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(need.Program(t, "sfdisk"), "-q", mbr)
	cmd.Stdin = stringsReader("label: dos\n,64M,ef\n,,83\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v\n%s", err, out)
	}
	l = probeFile(t, mbr)
	if l.Table != TableMBR || len(l.Partitions) != 2 || l.Partitions[0].Role != RoleESP || l.Partitions[1].Role != RoleLinux {
		t.Fatalf("MBR layout %+v", l)
	}
	place(t, mbr, filesystem(t, FsExt2, 32*mib), l.Partitions[1].Start)
	if l = probeFile(t, mbr); l.Partitions[1].Filesystem != FsExt2 {
		t.Errorf("ext2 in an MBR partition: %+v", l.Partitions[1])
	}

	for _, fs := range []string{FsExt4, FsXFS, FsFAT, FsNTFS, FsBtrfs} {
		l := probeFile(t, filesystem(t, fs, 320*mib))
		if l.Table != TableNone || l.Filesystem != fs || len(l.Partitions) != 0 {
			t.Errorf("%s on a whole disk: %+v", fs, l)
		}
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
