package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExtReadsWhatMkfsWrote: files, links and directories that mke2fs
// (as mkfs.ext4 -t)
// wrote from a tree (-d) read back byte for byte, on each layout the
// reader follows: ext2's block maps with single and double indirect
// blocks (1 KiB blocks), ext3, ext4's extents at 1 KiB and 4 KiB blocks,
// a hashed directory of 3000 entries, a file with a hole, and links
// stored in the inode and in a block.
func TestExtReadsWhatMkfsWrote(t *testing.T) {
	root := t.TempDir()
	files := map[string][]byte{
		"etc/os-release":   []byte(debian),
		"usr/share/big":    bytes.Repeat([]byte("imagepipe reads ext "), 40<<10), // 800 KiB
		"var/lib/dpkg/log": []byte("x"),
	}
	for i := range 3000 {
		files[fmt.Sprintf("many/entry-%04d", i)] = []byte(fmt.Sprint(i))
	}
	for p, b := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sparse := filepath.Join(root, "sparse")
	if err := os.WriteFile(sparse, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(sparse, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("end"), 300<<10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	files["sparse"] = append(make([]byte, 300<<10), "end"...)
	long := "/" + strings.Repeat("long/", 20) + "target"
	symlink(t, "../usr/share/big", filepath.Join(root, "etc/short"))
	symlink(t, long, filepath.Join(root, "etc/long"))

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"ext2, 1 KiB blocks", []string{"-t", "ext2", "-b", "1024"}},
		{"ext3", []string{"-t", "ext3"}},
		{"ext4, 1 KiB blocks", []string{"-t", "ext4", "-b", "1024"}},
		{"ext4", []string{"-t", "ext4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "fs.img")
			if err := os.Truncate(createFile(t, img), 32*mib); err != nil {
				t.Fatal(err)
			}
			run(t, "mkfs.ext4", append(append([]string{"-q", "-F"}, tc.args...), "-d", root, img)...)
			disk, err := os.Open(img)
			if err != nil {
				t.Fatal(err)
			}
			defer disk.Close()
			fsys, err := OpenFS(disk, 0, 32*mib, FsExt4)
			if err != nil {
				t.Fatal(err)
			}
			for p, want := range files {
				got, err := ReadFile(fsys, "/"+p, 1<<20)
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("%s: %d bytes, %v; want the %d bytes written", p, len(got), err, len(want))
				}
			}
			if got, err := ReadFile(fsys, "/etc/short", 1<<20); err != nil || !bytes.Equal(got, files["usr/share/big"]) {
				t.Errorf("through a link stored in the inode: %d bytes, %v", len(got), err)
			}
			if target, err := fsys.(linkFS).ReadLink("etc/long"); err != nil || target != long {
				t.Errorf("a link stored in a block: %q, %v", target, err)
			}
			ents, err := fs.ReadDir(fsys, "many")
			if err != nil || len(ents) != 3000 {
				t.Errorf("the hashed directory lists %d entries, %v", len(ents), err)
			}
		})
	}
}

// TestExtHostileStructures: structures built to loop or to amplify end at
// the reader's bounds with an error, never a hang, a panic or an
// allocation the bytes declare.
func TestExtHostileStructures(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "etc/os-release"), debian)
	img := filepath.Join(t.TempDir(), "fs.img")
	if err := os.Truncate(createFile(t, img), 8*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", "-b", "4096", "-d", root, img)
	clean, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	// inodeAt is the byte offset of inode num in b.
	inodeAt := func(b []byte, num uint32) int64 {
		f, err := openExt(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		desc := make([]byte, f.descSize)
		g, i := (num-1)/f.inodesPerGroup, (num-1)%f.inodesPerGroup
		if err := f.read(desc, f.descTable+int64(g)*f.descSize); err != nil {
			t.Fatal(err)
		}
		return int64(binary.LittleEndian.Uint32(desc[8:]))*f.blockSize + int64(i)*f.inodeSize
	}
	osRelease := func(b []byte) uint32 {
		f, _ := openExt(bytes.NewReader(b), int64(len(b)))
		etc, err := f.walk("lstat", "etc")
		if err != nil {
			t.Fatal(err)
		}
		ents, _ := f.dir(etc)
		for _, e := range ents {
			if e.name == "os-release" {
				return e.inode
			}
		}
		t.Fatal("no os-release")
		return 0
	}
	le := binary.LittleEndian
	for _, tc := range []struct {
		name   string
		break_ func(b []byte)
		want   string
	}{
		{"an extent index naming its own block", func(b []byte) {
			// The root directory's tree: one index entry, depth 1, whose
			// node at block 100 names block 100 again.
			at := inodeAt(b, extRootInode) + 40
			node := func(n []byte) {
				le.PutUint16(n[0:], extExtentMagic)
				le.PutUint16(n[2:], 1)
				le.PutUint16(n[4:], 4)
				le.PutUint16(n[6:], 1)
				le.PutUint32(n[12:], 0)
				le.PutUint32(n[16:], 100)
				le.PutUint16(n[20:], 0)
			}
			node(b[at:])
			node(b[100*4096:])
		}, "deeper than"},
		{"an os-release of 2^40 bytes", func(b []byte) {
			at := inodeAt(b, osRelease(b))
			le.PutUint32(b[at+4:], 0)
			le.PutUint32(b[at+108:], 1<<8)
		}, "larger than its bound"},
		{"an extent tree whose index entries all name one node", func(b []byte) {
			// os-release's tree, 4 KiB long: depth 2, 4 index entries
			// naming block 100, whose 340 entries name block 101, a leaf
			// of 340 extents, all of the file's first block: a tree of 3
			// blocks that maps 462,400 extents unless bounded.
			at := inodeAt(b, osRelease(b))
			le.PutUint32(b[at+4:], 4096)
			le.PutUint32(b[at+32:], extFlagExtents)
			node := func(n []byte, entries, depth int, next uint32) {
				le.PutUint16(n[0:], extExtentMagic)
				le.PutUint16(n[2:], uint16(entries))
				le.PutUint16(n[4:], uint16(entries))
				le.PutUint16(n[6:], uint16(depth))
				for i := range entries {
					e := n[12+i*12:]
					le.PutUint32(e[0:], 0)
					if depth == 0 {
						le.PutUint16(e[4:], 1)
						le.PutUint16(e[6:], 0)
						le.PutUint32(e[8:], next)
					} else {
						le.PutUint32(e[4:], next)
						le.PutUint16(e[8:], 0)
					}
				}
			}
			node(b[at+40:], 4, 2, 100)
			node(b[100*4096:], 340, 1, 101)
			node(b[101*4096:], 340, 0, 200)
		}, "more than 4096 extents"},
		{"a block size of 1024<<30", func(b []byte) { le.PutUint32(b[1024+24:], 30) }, "block size"},
		{"more group descriptors than the filesystem holds", func(b []byte) { le.PutUint32(b[1024:], 0xFFFFFFFF) }, "past the end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bytes.Clone(clean)
			tc.break_(b)
			fsys, err := OpenFS(bytes.NewReader(b), 0, int64(len(b)), FsExt4)
			if err == nil {
				_, err = ReadOSRelease(fsys)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}

	// Read whole through Open, a file over the reader's bound is refused
	// before anything is allocated for it.
	b := bytes.Clone(clean)
	at := inodeAt(b, osRelease(b))
	le.PutUint32(b[at+108:], 1<<8)
	fsys, err := OpenFS(bytes.NewReader(b), 0, int64(len(b)), FsExt4)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fsys.Open("etc/os-release")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(f); err == nil || !strings.Contains(err.Error(), "over the reader's bound") {
		t.Errorf("reading a file of 2^40 bytes: %v", err)
	}
	var pe *fs.PathError
	if _, err := fsys.Open("etc/missing"); !errors.As(err, &pe) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}
