package guest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

// lvmTools runs lvm2's tools on loop devices of files, as an installer
// does on a disk: they see only those devices, keep no backups in /etc,
// and create volumes without activating them (this machine has no
// device-mapper, so nothing is written through a volume; the test
// writes filesystems where lvm's own report puts each volume).
type lvmTools struct {
	t      testing.TB
	config string
}

// attach attaches files to loop devices for the test's duration.
func attachLoops(t testing.TB, files ...string) (*lvmTools, []string) {
	t.Helper()
	var devs []string
	for _, f := range files {
		out, err := exec.Command(need.Program(t, "losetup"), "-f", "--show", f).Output()
		if err != nil {
			t.Fatalf("losetup %s: %v (the tests run as root)", f, err)
		}
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() { detach(dev) })
		devs = append(devs, dev)
	}
	var accept []string
	for _, d := range devs {
		accept = append(accept, fmt.Sprintf(`"a|^%s$|"`, d))
	}
	config := fmt.Sprintf(`devices{filter=[%s,"r|.*|"] obtain_device_list_from_udev=0} backup{backup=0 archive=0} activation{udev_sync=0 udev_rules=0}`, strings.Join(accept, ","))
	return &lvmTools{t, config}, devs
}

// detach detaches a loop device attachLoops attached, if still
// attached.
func detach(dev string) { _ = exec.Command("losetup", "-d", dev).Run() }

// run runs an lvm command (pvcreate, vgcreate, lvcreate, lvextend, lvs)
// and returns its output.
func (l *lvmTools) run(cmd string, args ...string) string {
	l.t.Helper()
	c := exec.Command(need.Program(l.t, "lvm"), append([]string{cmd, "--config", l.config}, args...)...)
	c.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1")
	out, err := c.CombinedOutput()
	if err != nil {
		l.t.Fatalf("lvm %s %q: %v\n%s", cmd, args, err, out)
	}
	return string(out)
}

// segments is where lvm says the volume vg/lv lies on its physical
// volume: the byte offset on it of each segment's first extent, in order,
// and the extent size.
func (l *lvmTools) segments(vglv string) ([]int64, int64) {
	l.t.Helper()
	var extents []int64
	for line := range strings.Lines(l.run("lvs", "--noheadings", "--segments", "-o", "seg_start_pe,seg_pe_ranges", vglv)) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		_, rng, _ := strings.Cut(f[1], ":")
		first, _, _ := strings.Cut(rng, "-")
		pe, err := strconv.ParseInt(first, 10, 64)
		if err != nil {
			l.t.Fatalf("lvs: %q", line)
		}
		extents = append(extents, pe)
	}
	vg, _, _ := strings.Cut(vglv, "/")
	size := l.run("vgs", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_extent_size", vg)
	ext, err := strconv.ParseInt(strings.TrimSpace(size), 10, 64)
	if err != nil {
		l.t.Fatalf("vgs: %q", size)
	}
	start := strings.TrimSpace(l.run("pvs", "--noheadings", "--units", "b", "--nosuffix", "-o", "pe_start", "-S", "vg_name="+vg))
	pe0, err := strconv.ParseInt(strings.Fields(start)[0], 10, 64)
	if err != nil {
		l.t.Fatalf("pvs: %q", start)
	}
	for i := range extents {
		extents[i] = pe0 + extents[i]*ext
	}
	return extents, ext
}

// TestInspectAGuestOnLVM: a GPT disk whose LVM partition is a physical
// volume pvcreate made, in a volume group vgcreate made with a second
// physical volume, holding a root volume in two segments (lvcreate, then
// lvextend past another volume), that other volume, and a volume striped
// over both physical volumes. Inspect reads Debian from the root volume
// through both segments, and notes the striped volume as not read.
func TestInspectAGuestOnLVM(t *testing.T) {
	dir := t.TempDir()
	pv1, pv2 := filepath.Join(dir, "pv1"), filepath.Join(dir, "pv2")
	for _, p := range []string{pv1, pv2} {
		if err := os.Truncate(createFile(t, p), 160*mib); err != nil {
			t.Fatal(err)
		}
	}
	lvm, devs := attachLoops(t, pv1, pv2)
	vg := fmt.Sprintf("vgguest%d", os.Getpid())
	lvm.run("pvcreate", devs[0], devs[1])
	lvm.run("vgcreate", "-s", "4m", vg, devs[0], devs[1])
	off := []string{"-an", "-Zn", "--driverloaded", "n"}
	lvm.run("lvcreate", append(off, "-L", "32m", "-n", "root", vg, devs[0])...)
	lvm.run("lvcreate", append(off, "-L", "8m", "-n", "other", vg, devs[0])...)
	lvm.run("lvextend", "--driverloaded", "n", "-L", "64m", vg+"/root", devs[0])
	lvm.run("lvcreate", append(off, "-i", "2", "-I", "64k", "-L", "16m", "-n", "striped", vg)...)
	starts, extent := lvm.segments(vg + "/root")
	if len(starts) != 2 {
		t.Fatalf("lvm put root in %d segments; the test wants 2", len(starts))
	}

	root := t.TempDir()
	write(t, root+"/usr/lib/os-release", debian)
	symlink(t, "../usr/lib/os-release", root+"/etc/os-release")
	write(t, root+"/var/lib/dpkg/status", "Package: a\nStatus: install ok installed\nVersion: 1\n")
	rootfs := filepath.Join(dir, "root.img")
	if err := os.Truncate(createFile(t, rootfs), 64*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", "-d", root, rootfs)
	b, err := os.ReadFile(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	seg := 32 * mib / extent * extent
	for i, at := range starts {
		part := filepath.Join(dir, fmt.Sprintf("seg%d", i))
		if err := os.WriteFile(part, b[int64(i)*seg:min(int64(len(b)), int64(i+1)*seg)], 0o644); err != nil {
			t.Fatal(err)
		}
		place(t, pv1, part, at)
	}

	disk := blankDisk(t, 200*mib)
	run(t, "sgdisk", "-n=1:0:+160M", "-t=1:8E00", disk)
	place(t, disk, pv1, probeFile(t, disk).Partitions[0].Start)
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The root volume reads back, byte for byte, the filesystem placed
	// where lvm says its two segments are.
	p := probeFile(t, disk).Partitions[0]
	lvs, notes, err := ReadLVM(f, p.Start, p.Size)
	if err != nil || len(lvs) != 2 || lvs[0].Name != vg+"/root" || lvs[0].Size != 64*mib || len(notes) != 1 {
		t.Fatalf("%+v, %q, %v", lvs, notes, err)
	}
	got := make([]byte, 64*mib)
	if n, err := lvs[0].ReadAt(got, 0); n != len(got) || err != nil || !bytes.Equal(got, b) {
		t.Errorf("the root volume reads %d bytes, %v, equal to its filesystem: %v", n, err, bytes.Equal(got, b))
	}
	rep := Inspect(f, 200*mib)
	if rep.Partitions[0].Role != RoleLVM || rep.Partitions[0].Filesystem != FsLVMPV {
		t.Errorf("partition %+v", rep.Partitions[0])
	}
	if rep.OS == nil || rep.OS.ID != "debian" || rep.OS.Partition != 1 || rep.OS.LogicalVolume != vg+"/root" {
		t.Errorf("os %+v; want debian in %s/root on partition 1", rep.OS, vg)
	}
	if rep.Packages == nil || rep.Packages.Count != 1 {
		t.Errorf("packages %+v", rep.Packages)
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, vg+"/striped not read") }) || len(rep.Notes) != 1 {
		t.Errorf("notes %q; want one, on the striped volume", rep.Notes)
	}
}

// smallPV is a 16 MiB physical volume made by pvcreate, in a volume
// group vgcreate made, holding two linear volumes lvcreate made.
func smallPV(t testing.TB) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pv")
	if err := os.Truncate(createFile(t, p), 16*mib); err != nil {
		t.Fatal(err)
	}
	lvm, devs := attachLoops(t, p)
	vg := fmt.Sprintf("vgseed%d", os.Getpid())
	lvm.run("pvcreate", devs[0])
	lvm.run("vgcreate", "-s", "1m", vg, devs[0])
	lvm.run("lvcreate", "-an", "-Zn", "--driverloaded", "n", "-L", "4m", "-n", "root", vg)
	lvm.run("lvcreate", "-an", "-Zn", "--driverloaded", "n", "-L", "2m", "-n", "swap", vg)
	detach(devs[0]) // now: a fuzzing worker may be killed before its cleanups run
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLVMMetadataAsLVMWroteIt: the current metadata of a physical
// volume lvm made names both volumes at the extents lvs reports; moved
// so that it wraps around the end of its ring buffer, as lvm leaves it
// after many updates, it reads the same; hostile metadata is an error.
func TestLVMMetadataAsLVMWroteIt(t *testing.T) {
	pv := smallPV(t)
	lvs, notes, err := ReadLVM(bytesReaderAt(pv), 0, int64(len(pv)))
	if err != nil || len(notes) != 0 || len(lvs) != 2 || lvs[0].Size != 4*mib || lvs[1].Size != 2*mib ||
		lvs[0].segs[0].diskOff != mib || lvs[1].segs[0].diskOff != 5*mib {
		t.Fatalf("%+v, %q, %v", lvs, notes, err)
	}
	// Wrap: the text moved to the last 100 bytes of the area and on
	// after its header.
	const at = 4096
	h := pv[at : at+512]
	size := int64(binary.LittleEndian.Uint64(h[32:]))
	tOff, tSize := int64(binary.LittleEndian.Uint64(h[40:])), int64(binary.LittleEndian.Uint64(h[48:]))
	text := slices.Clone(pv[at+tOff : at+tOff+tSize])
	wrapped := slices.Clone(pv)
	clear(wrapped[at+512 : at+size])
	copy(wrapped[at+size-100:], text[:100])
	copy(wrapped[at+512:], text[100:])
	binary.LittleEndian.PutUint64(wrapped[at+40:], uint64(size-100))
	if w, _, err := ReadLVM(bytesReaderAt(wrapped), 0, int64(len(wrapped))); err != nil || len(w) != 2 || w[1].segs[0] != lvs[1].segs[0] {
		t.Errorf("wrapped: %+v, %v", w, err)
	}
	for name, text := range map[string]string{
		"unterminated string":  `vg { id = "abc`,
		"unterminated section": `vg { a = 1 `,
		"too deep":             "vg " + strings.Repeat("{ a ", 20) + strings.Repeat("}", 20),
		"two groups":           `a { } b { }`,
		"a stray brace":        `}`,
		"too many values":      "vg { l = [" + strings.Repeat("1,", maxLVMValues+1) + "] }",
	} {
		if vg, err := parseLVMText([]byte(text)); err == nil {
			t.Errorf("%s: %+v", name, vg)
		}
	}
}

type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// TestInspectReadsAtMostFourPhysicalVolumes: a disk of five LVM
// partitions, each the same physical volume lvm made, has the fifth
// noted as not read.
func TestInspectReadsAtMostFourPhysicalVolumes(t *testing.T) {
	pv := filepath.Join(t.TempDir(), "pv")
	if err := os.WriteFile(pv, smallPV(t), 0o644); err != nil {
		t.Fatal(err)
	}
	disk := blankDisk(t, 100*mib)
	var args []string
	for i := 1; i <= 5; i++ {
		args = append(args, fmt.Sprintf("-n=%d:0:+16M", i), fmt.Sprintf("-t=%d:8E00", i))
	}
	run(t, "sgdisk", append(args, disk)...)
	for _, p := range probeFile(t, disk).Partitions {
		place(t, disk, pv, p.Start)
	}
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep := Inspect(f, 100*mib)
	want := fmt.Sprintf("partition 5: an LVM2 physical volume not read (at most %d are)", maxPhysicalVolumes)
	if !slices.Contains(rep.Notes, want) || slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.HasPrefix(n, "partition 4: an LVM2") }) {
		t.Errorf("notes %q; want %q", rep.Notes, want)
	}
}
