package guest

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// countingReader counts the bytes Probe asks for.
type countingReader struct {
	b    []byte
	size int64 // the size Probe is told, which may exceed len(b)
	read int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.read += int64(len(p))
	if off >= int64(len(c.b)) {
		// Past the bytes given, the disk reads as zeros up to its size.
		n := int(min(int64(len(p)), max(0, c.size-off)))
		clear(p[:n])
		if n < len(p) {
			return n, errShort
		}
		return n, nil
	}
	n := copy(p, c.b[off:])
	if n < len(p) {
		rest := int(min(int64(len(p)-n), max(0, c.size-off-int64(n))))
		clear(p[n : n+rest])
		n += rest
		if n < len(p) {
			return n, errShort
		}
	}
	return n, nil
}

var errShort = bytes.ErrTooLarge // any error: Probe must not care which

// maxProbeRead bounds what Probe reads, whatever the disk declares: the
// MBR, the GPT header and entry array, and one probe per partition.
const maxProbeRead = 2*sectorSize + maxGPTEntries*maxGPTEntrySize + (maxGPTEntries+1)*probeSize

// FuzzProbe: any bytes, declared as a disk of any size, give a layout or
// an error, never a panic, and Probe reads at most maxProbeRead.
func FuzzProbe(f *testing.F) {
	f.Add(gptSeed(), int64(64<<20))
	f.Add(make([]byte, 512), int64(512))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		size = max(0, min(size, 1<<50))
		r := &countingReader{b: b, size: size}
		l, err := Probe(r, size)
		if err == nil && l == nil {
			t.Fatal("no layout and no error")
		}
		if r.read > maxProbeRead {
			t.Fatalf("read %d bytes, over %d", r.read, maxProbeRead)
		}
	})
}

// gptSeed is a protective MBR and a GPT header with valid checksums
// naming 128 entries, one an ESP, so that the fuzzer starts past the
// checks.
func gptSeed() []byte {
	b := make([]byte, 34*sectorSize)
	b[510], b[511] = 0x55, 0xAA
	b[446+4] = 0xEE
	binary.LittleEndian.PutUint32(b[446+8:], 1)
	binary.LittleEndian.PutUint32(b[446+12:], 0xFFFFFFFF)
	entries := b[2*sectorSize : 34*sectorSize]
	esp := []byte{0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9, 0x3B}
	copy(entries, esp)
	binary.LittleEndian.PutUint64(entries[32:], 2048)
	binary.LittleEndian.PutUint64(entries[40:], 4095)
	h := b[sectorSize : 2*sectorSize]
	copy(h, "EFI PART")
	binary.LittleEndian.PutUint32(h[8:], 0x00010000)
	binary.LittleEndian.PutUint32(h[12:], 92)
	binary.LittleEndian.PutUint64(h[72:], 2)
	binary.LittleEndian.PutUint32(h[80:], 128)
	binary.LittleEndian.PutUint32(h[84:], 128)
	binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(entries))
	binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:92]))
	return b
}

// TestTheFuzzSeedIsAValidGPT: the seed reaches the entry array.
func TestTheFuzzSeedIsAValidGPT(t *testing.T) {
	b := gptSeed()
	l, err := Probe(bytes.NewReader(b), 64<<20)
	if err != nil || l.Table != TableGPT || len(l.Partitions) != 1 || l.Partitions[0].Role != RoleESP || len(l.Notes) != 0 {
		t.Fatalf("%+v, %v", l, err)
	}
}

// maxLoadersRead bounds what Loaders reads of one ESP: per loader path,
// three directories of at most maxFATDirEntries entries with their FAT
// entries (4 bytes per cluster, clusters of at least 512 bytes), and the
// head of the file; the boot sector.
const maxLoadersRead = sectorSize + 4*(3*(maxFATDirEntries*32+maxFATDirEntries*32/512*4)+peHead+peHead/512*4)

// FuzzFATLoaders: any bytes as an ESP give loaders or none, never a
// panic, within maxLoadersRead.
func FuzzFATLoaders(f *testing.F) {
	f.Add(espSeed(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &countingReader{b: b, size: int64(len(b))}
		l := &Layout{Table: TableGPT, Partitions: []Partition{{GuestPartition: api.GuestPartition{Number: 1, Start: 0, Size: int64(len(b)), Role: RoleESP, Filesystem: FsFAT}}}}
		Loaders(r, l)
		if r.read > maxLoadersRead {
			t.Fatalf("read %d bytes, over %d", r.read, maxLoadersRead)
		}
	})
}

// espSeed is a small FAT12 ESP made by mkfs.fat and mtools, holding a
// PE header at the removable-media path.
func espSeed(f *testing.F) []byte {
	p := f.TempDir() + "/esp.img"
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.Truncate(p, 64<<10); err != nil {
		f.Fatal(err)
	}
	pe := make([]byte, 512)
	copy(pe, "MZ")
	binary.LittleEndian.PutUint32(pe[0x3C:], 0x80)
	copy(pe[0x80:], "PE\x00\x00\x64\x86")
	loader := f.TempDir() + "/BOOTX64.EFI"
	if err := os.WriteFile(loader, pe, 0o644); err != nil {
		f.Fatal(err)
	}
	for _, c := range [][]string{{"mkfs.fat", "-F", "12", p}, {"mmd", "-i", p, "::/EFI", "::/EFI/BOOT"}, {"mcopy", "-i", p, loader, "::/EFI/BOOT/BOOTX64.EFI"}} {
		if out, err := exec.Command(need.Program(f, c[0]), c[1:]...).CombinedOutput(); err != nil {
			f.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	b, err := os.ReadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzExt4OSRelease: any bytes as an ext4 filesystem give an os-release
// or an error, never a panic that escapes.
func FuzzExt4OSRelease(f *testing.F) {
	f.Add(ext4Seed(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		fsys, err := OpenFS(bytes.NewReader(b), 0, int64(len(b)), FsExt4)
		if err != nil {
			return
		}
		_, _ = ReadOSRelease(fsys)
	})
}

// ext4Seed is a 128 KiB ext4 made by mkfs.ext4 -d, with Debian's
// os-release behind its relative link.
func ext4Seed(f *testing.F) []byte {
	root := f.TempDir()
	for p, s := range map[string]string{"/usr/lib/os-release": debian} {
		if err := os.MkdirAll(root+"/usr/lib", 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(root+p, []byte(s), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.MkdirAll(root+"/etc", 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("../usr/lib/os-release", root+"/etc/os-release"); err != nil {
		f.Fatal(err)
	}
	img := f.TempDir() + "/fs.img"
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.Truncate(img, 128<<10); err != nil {
		f.Fatal(err)
	}
	if out, err := exec.Command(need.Program(f, "mkfs.ext4"), "-q", "-F", "-d", root, img).CombinedOutput(); err != nil {
		f.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	b, err := os.ReadFile(img)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// windowReader is a disk of size bytes that reads as zeros but for two
// windows: head at 0 and tail at off. It lets a fuzzer mutate the few
// KiB of a filesystem that matter without carrying its megabytes.
type windowReader struct {
	head, tail []byte
	off, size  int64
	read       int64
}

func (w *windowReader) ReadAt(p []byte, off int64) (int, error) {
	w.read += int64(len(p))
	if off < 0 || off >= w.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), w.size-off))
	clear(p[:n])
	for _, win := range []struct {
		b   []byte
		off int64
	}{{w.head, 0}, {w.tail, w.off}} {
		s, e := max(off, win.off), min(off+int64(n), win.off+int64(len(win.b)))
		if s < e {
			copy(p[s-off:e-off], win.b[s-win.off:e-win.off])
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// FuzzXFS: any bytes as an XFS filesystem's superblock area and its
// inode and directory blocks give files or errors, never a panic (the
// reader is called without ReadFile's recover), and reads stay within
// maxXFSRead.
func FuzzXFS(f *testing.F) {
	img, tailOff := xfsSeed(f)
	f.Add(img[:xfsSeedHead], img[tailOff:tailOff+xfsSeedTail])
	f.Fuzz(func(t *testing.T, head, tail []byte) {
		r := &windowReader{head: head, tail: tail, off: tailOff, size: xfsSeedSize}
		fsys, err := openXFS(r, 0, xfsSeedSize)
		if err != nil {
			return
		}
		if p, err := resolve(fsys, "/etc/os-release"); err == nil {
			if f, err := fsys.Open(p); err == nil {
				_, _ = io.ReadAll(io.LimitReader(f, maxOSRelease+1))
			}
		}
		_, _ = fsys.ReadDir("usr/lib")
		_, _ = fsys.ReadLink("etc/os-release")
		if r.read > maxXFSRead+1<<20 {
			t.Fatalf("read %d bytes, over %d", r.read, maxXFSRead)
		}
	})
}

// The seed XFS: 16 MiB of 1 KiB blocks in one allocation group, of which
// the first xfsSeedHead bytes (superblock and AG headers) and
// xfsSeedTail bytes from its inode chunk on are given to the fuzzer.
const (
	xfsSeedSize = 16 << 20
	xfsSeedHead = 8 << 10
	xfsSeedTail = 48 << 10
)

// xfsSeed makes the seed XFS with mkfs.xfs -p (allowed under 300 MB
// with the environment xfstests sets), holding Debian's os-release
// behind its relative link, and returns it with the offset of its
// inode chunk.
func xfsSeed(f testing.TB) ([]byte, int64) {
	root := f.TempDir()
	if err := os.MkdirAll(root+"/usr/lib", 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(root+"/usr/lib/os-release", []byte(debian), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.MkdirAll(root+"/etc", 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("../usr/lib/os-release", root+"/etc/os-release"); err != nil {
		f.Fatal(err)
	}
	img := f.TempDir() + "/xfs.img"
	if err := os.Truncate(createFile(f, img), xfsSeedSize); err != nil {
		f.Fatal(err)
	}
	cmd := exec.Command(need.Program(f, "mkfs.xfs"), "-q", "-f", "-b", "size=1024", "-d", "agcount=1", "-p", protofile(f, root), img)
	cmd.Env = append(os.Environ(), "TEST_DIR=1", "TEST_DEV=1", "QA_CHECK_FS=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		f.Fatalf("mkfs.xfs: %v\n%s", err, out)
	}
	b, err := os.ReadFile(img)
	if err != nil {
		f.Fatal(err)
	}
	for o := int64(xfsSeedHead); o+xfsSeedTail <= int64(len(b)); o += 1024 {
		if !allZero(b[o : o+1024]) {
			return b, o
		}
	}
	f.Fatal("the seed XFS is empty past its headers")
	return nil, 0
}

// TestTheXFSFuzzSeedReads: the windows given to FuzzXFS hold the whole
// path to os-release, so the fuzzer starts from a filesystem it reads.
func TestTheXFSFuzzSeedReads(t *testing.T) {
	img, off := xfsSeed(t)
	r := &windowReader{head: img[:xfsSeedHead], tail: img[off : off+xfsSeedTail], off: off, size: xfsSeedSize}
	fsys, err := OpenFS(r, 0, xfsSeedSize, FsXFS)
	if err != nil {
		t.Fatal(err)
	}
	if rel, err := ReadOSRelease(fsys); err != nil || rel.ID != "debian" {
		t.Errorf("%+v, %v", rel, err)
	}
}

// FuzzRPMDB: any bytes as rpm's sqlite, ndb or Berkeley DB database,
// and each blob found as a header, give packages or an error, never a
// panic. Seeds: each backend's layout with a real header in it.
func FuzzRPMDB(f *testing.F) {
	sqlite, blob := rpmSeed(f)
	f.Add(sqlite, uint8(0))
	f.Add(ndbSeed(blob), uint8(1))
	f.Add(blob, uint8(3))
	bdb, err := os.ReadFile(goRPMDBTestdata(f) + "/libuuid/Packages") // 92 KiB, CentOS's rpm
	if err != nil {
		f.Fatal(err)
	}
	f.Add(bdb, uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, kind uint8) {
		each := func(blob []byte) error {
			_, err := parseRPMHeader(blob)
			return err
		}
		switch kind % 4 {
		case 0:
			_ = sqliteRPMBlobs(b, each)
		case 1:
			_ = ndbBlobs(b, each)
		case 2:
			_ = bdbBlobs(b, each)
		default:
			_ = each(b)
		}
	})
}

// rpmSeed is a small rpm sqlite database: rpm 4.18 installs one package
// (rpmbuild made it) with --justdb, then sqlite3 drops rpm's index
// tables and rewrites it in 512-byte pages. It returns the database and
// the package's header blob.
func rpmSeed(f *testing.F) ([]byte, []byte) {
	top, root := f.TempDir(), f.TempDir()
	spec := "Name: seed\nVersion: 1\nRelease: 1\nEpoch: 1\nSummary: s\nLicense: MIT\nBuildArch: noarch\n%description\ns\n%files\n"
	if err := os.WriteFile(top+"/a.spec", []byte(spec), 0o644); err != nil {
		f.Fatal(err)
	}
	db := root + "/var/lib/rpm/rpmdb.sqlite"
	for _, c := range [][]string{
		{"rpmbuild", "--quiet", "-bb", "--define", "_topdir " + top, "--define", "_build_id_links none", top + "/a.spec"},
		{"rpm", "--root", root, "--dbpath", "/var/lib/rpm", "--initdb"},
		{"rpm", "--root", root, "--dbpath", "/var/lib/rpm", "-i", "--nodeps", "--justdb", top + "/RPMS/noarch/seed-1-1.noarch.rpm"},
		{"sqlite3", db, "SELECT 'DROP TABLE \"' || name || '\";' FROM sqlite_master WHERE type = 'table' AND name NOT IN ('Packages', 'sqlite_sequence')"},
	} {
		out, err := exec.Command(need.Program(f, c[0]), c[1:]...).Output()
		if err != nil {
			f.Fatalf("%v: %v", c, err)
		}
		if c[0] == "sqlite3" {
			script := string(out) + "PRAGMA journal_mode = DELETE; PRAGMA page_size = 512; VACUUM;"
			if out, err := exec.Command(need.Program(f, "sqlite3"), db, script).CombinedOutput(); err != nil {
				f.Fatalf("sqlite3: %v\n%s", err, out)
			}
		}
	}
	b, err := os.ReadFile(db)
	if err != nil {
		f.Fatal(err)
	}
	var blobs [][]byte
	err = sqliteRPMBlobs(b, func(blob []byte) error { blobs = append(blobs, blob); return nil })
	if err != nil || len(blobs) != 1 {
		f.Fatalf("the seed database: %d blobs, %v", len(blobs), err)
	}
	return b, blobs[0]
}

// ndbSeed lays blob out as rpm's ndb backend would: its header, one slot
// page naming package 1, and the blob behind its header.
func ndbSeed(blob []byte) []byte {
	b := make([]byte, 4096+16+len(blob))
	le := binary.LittleEndian
	copy(b, "RpmP")
	le.PutUint32(b[12:], 1)
	for o := 32; o < 4096; o += 16 {
		copy(b[o:], "Slot")
	}
	le.PutUint32(b[32+4:], 1)
	le.PutUint32(b[32+8:], 4096/16)
	copy(b[4096:], "BlbS")
	le.PutUint32(b[4096+4:], 1)
	le.PutUint32(b[4096+12:], uint32(len(blob)))
	copy(b[4096+16:], blob)
	return b
}

// FuzzLVM: any bytes as the start of an LVM2 physical volume (label,
// metadata area header and text) give volumes or an error, never a
// panic, and ReadLVM reads at most its label sectors, the area's header
// and maxLVMMetadata of text.
func FuzzLVM(f *testing.F) {
	pv := smallPV(f)
	f.Add(pv[:lvmSeedSize])
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &countingReader{b: b, size: 16 << 20}
		lvs, _, err := ReadLVM(r, 0, r.size)
		if r.read > 4*sectorSize+sectorSize+maxLVMMetadata {
			t.Fatalf("read %d bytes", r.read)
		}
		if err != nil {
			return
		}
		for _, lv := range lvs {
			if lv.Size <= 0 || lv.Size > r.size {
				t.Fatalf("a volume of %d bytes on a disk of %d", lv.Size, r.size)
			}
			var buf [512]byte
			_, _ = lv.ReadAt(buf[:], lv.Size-100)
		}
	})
}

// lvmSeedSize holds a small physical volume's label and its metadata
// (lvm writes the text a few KiB into its 1 MiB area).
const lvmSeedSize = 32 << 10

// FuzzAPK: any bytes as apk's installed database give packages or an
// error, never a panic, and every package has a name and a version.
func FuzzAPK(f *testing.F) {
	f.Add([]byte(alpineInstalled))
	f.Fuzz(func(t *testing.T, b []byte) {
		pkgs, err := parseAPKInstalled(b)
		if err != nil {
			return
		}
		for _, p := range pkgs {
			if p.Name == "" || p.Version == "" || p.Type != "apk" {
				t.Fatalf("%+v", p)
			}
		}
	})
}

// FuzzNTFS: any bytes as an NTFS volume's boot sector and the first 100
// records of its MFT (a small tree's files and its small directories'
// indexes), over the rest of a volume mkntfs and ntfs-3g made, give Windows' facts or an error, never a panic that escapes, and
// reads stay within maxNTFSRead.
func FuzzNTFS(f *testing.F) {
	img, mft := ntfsSeed(f)
	f.Add(img[:sectorSize], img[mft:mft+ntfsSeedTail])
	f.Fuzz(func(t *testing.T, boot, records []byte) {
		r := &overlayReader{base: img, windowReader: windowReader{head: boot, tail: records, off: mft, size: int64(len(img))}}
		_, _ = readWindows(r, 0, r.size)
		if r.read > maxNTFSRead+4096*ntfsPages {
			t.Fatalf("read %d bytes", r.read)
		}
	})
}

// overlayReader reads base but where windowReader's windows lie.
type overlayReader struct {
	base []byte
	windowReader
}

func (o *overlayReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := o.windowReader.ReadAt(p, off)
	for i := range n {
		inHead := off+int64(i) < int64(len(o.head))
		inTail := off+int64(i) >= o.off && off+int64(i) < o.off+int64(len(o.tail))
		if !inHead && !inTail && off+int64(i) < int64(len(o.base)) {
			p[i] = o.base[off+int64(i)]
		}
	}
	return n, err
}

// ntfsSeedTail is what the fuzzer mutates of the MFT: 100 records.
const ntfsSeedTail = 100 << 10

// ntfsSeed is a 16 MiB NTFS made by mkntfs, holding Windows' kernel and
// viostor written by ntfs-3g (a FUSE mount), and the offset of its MFT.
func ntfsSeed(f testing.TB) ([]byte, int64) {
	img := filepath.Join(f.TempDir(), "ntfs.img")
	if err := os.Truncate(createFile(f, img), 16<<20); err != nil {
		f.Fatal(err)
	}
	run(f, "mkntfs", "-q", "-F", "-f", img)
	mnt := f.TempDir()
	run(f, "ntfs-3g", img, mnt)
	for _, p := range []string{"ntoskrnl.exe", "drivers/viostor.sys"} {
		if err := os.MkdirAll(filepath.Dir(mnt+"/Windows/System32/"+p), 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(mnt+"/Windows/System32/"+p, []byte("MZ"), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	run(f, "umount", mnt)
	b, err := os.ReadFile(img)
	if err != nil {
		f.Fatal(err)
	}
	// The boot sector names the MFT's first cluster.
	cluster := int64(binary.LittleEndian.Uint16(b[11:])) * int64(b[13])
	return b, int64(binary.LittleEndian.Uint64(b[0x30:])) * cluster
}

// TestTheNTFSFuzzSeedReads: the windows FuzzNTFS mutates hold the whole
// path to Windows' kernel and viostor.
func TestTheNTFSFuzzSeedReads(t *testing.T) {
	img, mft := ntfsSeed(t)
	r := &overlayReader{base: img, windowReader: windowReader{head: img[:sectorSize], tail: img[mft : mft+ntfsSeedTail], off: mft, size: int64(len(img))}}
	if w, err := readWindows(r, 0, r.size); err != nil || !w.kernel || !slices.Equal(w.virtio, []string{"viostor"}) {
		t.Errorf("%+v, %v", w, err)
	}
}

// FuzzRegistry: any bytes as Windows' SOFTWARE hive's first 64 KiB and
// the last 64 KiB of its bins (the base block and root key, and the bin
// hivexsh appended with the keys read) give a version or none, never a panic that
// escapes readWindows' recover, nor a hang.
func FuzzRegistry(f *testing.F) {
	hive, err := os.ReadFile(softwareHive(f))
	if err != nil {
		f.Fatal(err)
	}
	size, tail := int64(len(hive)), hiveTail(hive)
	f.Add(hive[:registrySeedWindow], hive[tail:tail+registrySeedWindow])
	f.Fuzz(func(t *testing.T, head, last []byte) {
		var err error
		defer recoverAsError(&err)
		_, _ = windowsVersion(&windowReader{head: head, tail: last, off: tail, size: size})
	})
}

// registrySeedWindow is what FuzzRegistry mutates at each end of the
// hive (TestTheRegistryFuzzSeedReads: enough to read the version).
const registrySeedWindow = 64 << 10

// hiveTail is where the last registrySeedWindow bytes of a hive's bins
// start (its base block gives their length).
func hiveTail(hive []byte) int64 {
	return 4096 + int64(binary.LittleEndian.Uint32(hive[0x28:])) - registrySeedWindow
}

// TestTheRegistryFuzzSeedReads: the windows FuzzRegistry mutates hold
// Windows' version.
func TestTheRegistryFuzzSeedReads(t *testing.T) {
	hive, err := os.ReadFile(softwareHive(t))
	if err != nil {
		t.Fatal(err)
	}
	size, tail := int64(len(hive)), hiveTail(hive)
	r := &windowReader{head: hive[:registrySeedWindow], tail: hive[tail : tail+registrySeedWindow], off: tail, size: size}
	if v, n := windowsVersion(r); v != "10.0.22631" || n != "Windows 11 Pro 23H2" {
		t.Errorf("%q %q", v, n)
	}
}
