package guest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

// protofile writes mkfs.xfs's prototype file (xfs_protofile(5)'s
// format, as mkfs.xfs -p reads it) describing the tree at root.
func protofile(t testing.TB, root string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("/dev/null\n0 0\nd--755 0 0\n")
	var walk func(dir string)
	walk = func(dir string) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			switch {
			case e.Type()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, "%s l--777 0 0 %s\n", e.Name(), target)
			case e.IsDir():
				fmt.Fprintf(&b, "%s d--755 0 0\n", e.Name())
				walk(p)
				b.WriteString("$\n")
			default:
				fmt.Fprintf(&b, "%s ---644 0 0 %s\n", e.Name(), p)
			}
		}
	}
	walk(root)
	b.WriteString("$\n")
	p := filepath.Join(t.TempDir(), "proto")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// xfsImage makes a 320 MiB (sparse) XFS filesystem holding the tree
// setup writes, with mkfs.xfs -p, then runs xfs_db -x with each of
// edits (a list of commands) to damage it as a hostile guest would. It
// returns the image's path.
func xfsImage(t testing.TB, setup func(root string), edits ...[]string) string {
	t.Helper()
	return xfsImageWith(t, nil, setup, edits...)
}

// xfsImageWith is xfsImage with more mkfs.xfs options.
func xfsImageWith(t testing.TB, mkfs []string, setup func(root string), edits ...[]string) string {
	t.Helper()
	root := t.TempDir()
	setup(root)
	img := filepath.Join(t.TempDir(), "xfs.img")
	if err := os.Truncate(createFile(t, img), 320*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.xfs", append(append([]string{"-q", "-f"}, mkfs...), "-p", protofile(t, root), img)...)
	for _, e := range edits {
		args := []string{"-x"}
		for _, c := range e {
			args = append(args, "-c", c)
		}
		if out, err := exec.Command(need.Program(t, "xfs_db"), append(args, img)...).CombinedOutput(); err != nil || strings.Contains(string(out), "rror") {
			t.Fatalf("xfs_db %q: %v\n%s", e, err, out)
		}
	}
	return img
}

func openXFSImage(t *testing.T, img string) fs.FS {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fsys, err := OpenFS(f, 0, 320*mib, FsXFS)
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

// TestXFSReadsWhatMkfsWrote: from XFS v5 and v4 filesystems made by
// mkfs.xfs -p, os-release behind Debian's relative link, a 1 MiB file, a
// directory of 3,000 files (leaf form) and a directory listing, read as
// the guest would; on v4, a link whose target is stored outside its
// inode. (mkfs.xfs 6.1 writes a v5 remote link without the header the
// kernel checks, so that the kernel refuses it too;
// TestXFSAsTheKernelWroteIt reads one the kernel wrote.)
func TestXFSReadsWhatMkfsWrote(t *testing.T) {
	for name, mkfs := range map[string][]string{"v5": nil, "v4": {"-m", "crc=0"}} {
		t.Run(name, func(t *testing.T) { testXFSReads(t, mkfs, name == "v4") })
	}
}

func testXFSReads(t *testing.T, mkfs []string, remoteLink bool) {
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	longDir := "/usr/" + strings.Repeat("d", 200) + "/" + strings.Repeat("e", 200)
	img := xfsImageWith(t, mkfs, func(root string) {
		write(t, root+"/usr/lib/os-release", debian)
		symlink(t, "../usr/lib/os-release", root+"/etc/os-release")
		write(t, root+longDir+"/os-release", debian)
		symlink(t, longDir+"/os-release", root+"/etc/far")
		write(t, root+"/var/big", big)
		for i := range 3000 {
			write(t, fmt.Sprintf("%s/many/file-%04d", root, i), "x")
		}
		write(t, root+"/lib/modules/6.1.0-13-cloud-amd64/modules.builtin", "kernel/drivers/block/virtio_blk.ko\n")
		write(t, root+"/lib/modules/6.1.0-9-cloud-amd64/modules.builtin", "")
	})
	fsys := openXFSImage(t, img)
	rel, err := ReadOSRelease(fsys)
	if err != nil || rel.ID != "debian" || rel.VersionID != "12" {
		t.Errorf("os-release %+v, %v", rel, err)
	}
	if b, err := ReadFile(fsys, "/etc/far", 1<<10); remoteLink && (err != nil || string(b) != debian) {
		t.Errorf("through a remote link: %q, %v", b, err)
	}
	if b, err := ReadFile(fsys, "/var/big", 2<<20); err != nil || string(b) != big {
		t.Errorf("a 1 MiB file: %d bytes, %v", len(b), err)
	}
	if _, err := ReadFile(fsys, "/var/big", 1<<19); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a 1 MiB file within 512 KiB: %v; want ErrTooLarge", err)
	}
	if b, err := ReadFile(fsys, "/many/file-2999", 10); err != nil || string(b) != "x" {
		t.Errorf("in a directory of 3,000 files: %q, %v", b, err)
	}
	if names, err := readDirNames(fsys, "/lib/modules"); err != nil || !slices.Equal(names, []string{"6.1.0-13-cloud-amd64", "6.1.0-9-cloud-amd64"}) {
		t.Errorf("kernels %q, %v", names, err)
	}
	if _, err := ReadFile(fsys, "/etc/nothing", 10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v; want fs.ErrNotExist", err)
	}
}

// TestXFSHostileTrees: a link loop, a directory that holds itself, a
// 1 GiB os-release, an extent of two million blocks running past its
// allocation group, and a corrupt superblock are errors (the guest is
// then unknown), each found without reading what they claim.
func TestXFSHostileTrees(t *testing.T) {
	for name, tc := range map[string]struct {
		setup func(root string)
		edits [][]string
		path  string
		want  error
	}{
		"link loop": {
			setup: func(root string) {
				symlink(t, "b", root+"/etc/a")
				symlink(t, "a", root+"/etc/b")
				symlink(t, "a", root+"/etc/os-release")
			},
			path: "/etc/os-release",
		},
		"1 GiB os-release": {
			setup: func(root string) { write(t, root+"/etc/os-release", debian) },
			edits: [][]string{{"path /etc/os-release", "write core.size 1073741824"}},
			path:  "/etc/os-release", want: ErrTooLarge,
		},
		"huge extent": {
			setup: func(root string) { write(t, root+"/etc/os-release", debian) },
			edits: [][]string{{"path /etc/os-release", "write core.size 60000", "write u3.bmx[0].blockcount 2097151"}},
			path:  "/etc/os-release",
		},
		"a directory holding itself": {
			// /etc/l's entry names /etc's own inode: a path through
			// it deeper than 64 components is refused.
			setup: func(root string) {
				write(t, root+"/etc/l/x", "")
				symlink(t, strings.Repeat("l/", 70)+"os-release", root+"/etc/os-release")
			},
			edits: [][]string{{"path /etc", "write u3.sfdir3.list[0].inumber.i4 " + etcIno}},
			path:  "/etc/os-release",
		},
	} {
		t.Run(name, func(t *testing.T) {
			fsys := openXFSImage(t, xfsImage(t, tc.setup, tc.edits...))
			b, err := ReadFile(fsys, tc.path, maxOSRelease)
			t.Log(err)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("read %d bytes, %v; want an error (%v)", len(b), err, tc.want)
			}
		})
	}
}

// etcIno is the inode mkfs.xfs -p gives the root's first directory on a
// 320 MiB filesystem (checked by TestXFSDirectoryCycleIsReal).
const etcIno = "262272"

// TestXFSDirectoryCycleIsReal: the cycle TestXFSHostileTrees makes is
// one (/etc/l is /etc), and a path through it that stays within the
// bounds reads what the guest would read.
func TestXFSDirectoryCycleIsReal(t *testing.T) {
	img := xfsImage(t, func(root string) {
		write(t, root+"/etc/l/x", "")
		write(t, root+"/etc/os-release", debian)
	}, []string{"path /etc", "write u3.sfdir3.list[0].inumber.i4 " + etcIno})
	fsys := openXFSImage(t, img)
	if b, err := ReadFile(fsys, "/etc/l/l/l/os-release", 1<<10); err != nil || string(b) != debian {
		t.Errorf("%q, %v", b, err)
	}
}

// TestXFSCorruptSuperblock: a superblock whose geometry is inconsistent
// is refused when opened, and Inspect notes it.
func TestXFSCorruptSuperblock(t *testing.T) {
	img := xfsImage(t, func(root string) { write(t, root+"/etc/os-release", debian) },
		[]string{"sb 0", "write -d inodesize 300"})
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := OpenFS(f, 0, 320*mib, FsXFS); err == nil {
		t.Error("opened; want an error")
	}
	rep := Inspect(f, 320*mib)
	if rep.OS != nil || !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "inconsistent superblock") }) {
		t.Errorf("os %+v, notes %q", rep.OS, rep.Notes)
	}
}

// TestInspectAnXFSRoot: Inspect reads the OS, dpkg's packages and the
// kernels from an XFS root on a GPT disk, as from ext4.
func TestInspectAnXFSRoot(t *testing.T) {
	status, err := os.ReadFile("/var/lib/dpkg/status")
	if err != nil {
		t.Fatal(err)
	}
	want, err := parseDpkgStatus(status)
	if err != nil {
		t.Fatal(err)
	}
	rootfs := xfsImage(t, func(root string) {
		write(t, root+"/usr/lib/os-release", debian)
		symlink(t, "../usr/lib/os-release", root+"/etc/os-release")
		write(t, root+"/var/lib/dpkg/status", string(status))
		write(t, root+"/usr/lib/modules/6.1.0-13-cloud-amd64/modules.builtin", "kernel/drivers/block/virtio_blk.ko\nkernel/drivers/net/virtio_net.ko\n")
		symlink(t, "usr/lib", root+"/lib")
	})
	disk := blankDisk(t, 330*mib)
	run(t, "sgdisk", "-n=1:0:+320M", "-t=1:8304", disk)
	place(t, disk, rootfs, probeFile(t, disk).Partitions[0].Start)
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep := Inspect(f, 330*mib)
	if rep.OS == nil || rep.OS.ID != "debian" || rep.OS.Partition != 1 {
		t.Errorf("os %+v; want debian on partition 1", rep.OS)
	}
	if rep.Packages == nil || rep.Packages.Count != len(want) {
		t.Errorf("packages %+v; want %d", rep.Packages, len(want))
	}
	if len(rep.Kernels) != 1 || !slices.Equal(rep.Kernels[0].Virtio, []string{"virtio_blk", "virtio_net"}) {
		t.Errorf("kernels %+v", rep.Kernels)
	}
	if len(rep.Notes) != 0 {
		t.Errorf("notes %q", rep.Notes)
	}
}

// TestXFSAsTheKernelWroteIt: what only the kernel writes here: a v5 link
// whose target is stored outside its inode (with the header mkfs.xfs 6.1
// leaves out), a file so fragmented that its extents are in a B+tree
// (two files written in turns, 4 KiB at a time, each write synced) and a
// directory of 6,000 entries, written through a loop mount (the tests run
// as root), read back equal.
func TestXFSAsTheKernelWroteIt(t *testing.T) {
	img := filepath.Join(t.TempDir(), "xfs.img")
	if err := os.Truncate(createFile(t, img), 320*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.xfs", "-q", "-f", img)
	mnt := t.TempDir()
	run(t, "mount", "-o", "loop", img, mnt)
	mounted := true
	unmount := func() {
		if mounted {
			run(t, "umount", mnt)
			mounted = false
		}
	}
	t.Cleanup(unmount)
	longDir := "/usr/" + strings.Repeat("d", 200) + "/" + strings.Repeat("e", 200)
	write(t, mnt+longDir+"/os-release", debian)
	symlink(t, longDir+"/os-release", mnt+"/etc/os-release")
	if err := os.Mkdir(mnt+"/var", 0o755); err != nil {
		t.Fatal(err)
	}
	frag, err := os.Create(mnt + "/var/frag")
	if err != nil {
		t.Fatal(err)
	}
	other, err := os.Create(mnt + "/var/other")
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range 600 {
		chunk := bytes.Repeat([]byte{byte(i % 251)}, 4096)
		want = append(want, chunk...)
		for _, f := range []*os.File{frag, other} {
			if _, err := f.Write(chunk); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	frag.Close()
	other.Close()
	for i := range 6000 {
		write(t, fmt.Sprintf("%s/many/file-%05d-%s", mnt, i, strings.Repeat("y", 40)), "")
	}
	write(t, mnt+"/many/zzz", "last")
	unmount()
	out, err := exec.Command(need.Program(t, "xfs_db"), "-r", "-c", "path /var/frag", "-c", "p core.format", img).Output()
	if err != nil || !strings.Contains(string(out), "(btree)") {
		t.Fatalf("/var/frag is not in B+tree format: %s %v", out, err)
	}

	fsys := openXFSImage(t, img)
	if rel, err := ReadOSRelease(fsys); err != nil || rel.ID != "debian" {
		t.Errorf("os-release through a remote link: %+v, %v", rel, err)
	}
	if b, err := ReadFile(fsys, "/var/frag", 4<<20); err != nil || !bytes.Equal(b, want) {
		t.Errorf("a B+tree file: %d bytes, equal %v, %v", len(b), bytes.Equal(b, want), err)
	}
	if b, err := ReadFile(fsys, "/many/zzz", 10); err != nil || string(b) != "last" {
		t.Errorf("in a directory of 6,000 entries: %q, %v", b, err)
	}
	if names, err := readDirNames(fsys, "/many"); err != nil || len(names) != 6001 {
		t.Errorf("listing it: %d names, %v", len(names), err)
	}
}
