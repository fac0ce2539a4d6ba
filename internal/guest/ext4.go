package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"
)

// extFS reads an ext2, ext3 or ext4 filesystem as inspection needs it:
// directories, regular files and symbolic links, found by path. It is
// written for hostile bytes: every offset it reads is checked against the
// filesystem's size, every length against a bound below, and a structure
// that loops (an extent tree or an indirect block naming itself) ends at
// those bounds. It reads no journal, checksum or extended attribute, so a
// file stored inline in its inode (the inline_data feature) is not read.
type extFS struct {
	r              io.ReaderAt // the filesystem, from its first byte
	size           int64
	blockSize      int64
	inodeSize      int64
	inodesPerGroup uint32
	inodes         uint32
	groups         uint32
	descSize       int64
	descTable      int64 // byte offset of the group descriptor table
	wide           bool  // 64bit: block numbers have high halves

	dirs      map[uint32][]extEntry // directories read so far
	dirsBytes int                   // their names' bytes
}

const (
	extMagic        = 0xEF53
	extRootInode    = 2
	extIncompat64   = 0x80
	extFlagExtents  = 0x80000
	extFlagInline   = 0x10000000
	extExtentMagic  = 0xF30A
	extMaxDepth     = 5        // the kernel's own bound on extent tree depth
	extMaxNodes     = 4096     // extent tree nodes or indirect blocks read for one file
	extMaxDir       = 8 << 20  // bytes of one directory
	extMaxDirsBytes = 16 << 20 // names of the directories kept read in one filesystem
	extMaxFile      = 64 << 20 // bytes of a regular file read whole
)

var errExtInline = errors.New("the file is stored inline in its inode, which imagepipe does not read")

// openExt reads the superblock and checks every field the reader uses.
func openExt(r io.ReaderAt, size int64) (*extFS, error) {
	var sb [1024]byte
	if size < 2048 {
		return nil, errors.New("ext: smaller than a superblock")
	}
	if _, err := r.ReadAt(sb[:], 1024); err != nil {
		return nil, fmt.Errorf("ext: reading the superblock: %w", err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[56:]) != extMagic {
		return nil, errors.New("ext: no superblock magic")
	}
	logBlock := le.Uint32(sb[24:])
	if logBlock > 6 {
		return nil, fmt.Errorf("ext: block size 1024<<%d", logBlock)
	}
	f := &extFS{r: r, size: size, blockSize: 1024 << logBlock, dirs: map[uint32][]extEntry{}}
	f.inodes = le.Uint32(sb[0:])
	f.inodesPerGroup = le.Uint32(sb[40:])
	f.inodeSize = 128
	if le.Uint32(sb[76:]) >= 1 { // dynamic revision
		f.inodeSize = int64(le.Uint16(sb[88:]))
	}
	if f.inodeSize < 128 || f.inodeSize > f.blockSize || f.inodeSize&(f.inodeSize-1) != 0 {
		return nil, fmt.Errorf("ext: inode size %d", f.inodeSize)
	}
	if f.inodesPerGroup == 0 || f.inodes == 0 {
		return nil, errors.New("ext: no inodes")
	}
	f.groups = (f.inodes-1)/f.inodesPerGroup + 1
	f.descSize = 32
	if le.Uint32(sb[96:])&extIncompat64 != 0 {
		f.wide = true
		f.descSize = int64(le.Uint16(sb[254:]))
		if f.descSize < 64 || f.descSize > 1024 || f.descSize&(f.descSize-1) != 0 {
			return nil, fmt.Errorf("ext: group descriptor size %d", f.descSize)
		}
	}
	f.descTable = (int64(le.Uint32(sb[20:])) + 1) * f.blockSize
	if f.descTable+int64(f.groups)*f.descSize > size {
		return nil, fmt.Errorf("ext: %d group descriptors past the end", f.groups)
	}
	return f, nil
}

// read reads len(p) bytes at off, all inside the filesystem.
func (f *extFS) read(p []byte, off int64) error {
	if off < 0 || off > f.size-int64(len(p)) {
		return fmt.Errorf("ext: a read at %d past the filesystem's %d bytes", off, f.size)
	}
	_, err := f.r.ReadAt(p, off)
	return err
}

func (f *extFS) readBlock(p []byte, block uint64) error {
	if block == 0 || block > uint64(f.size/f.blockSize) {
		return fmt.Errorf("ext: block %d outside the filesystem", block)
	}
	return f.read(p[:f.blockSize], int64(block)*f.blockSize)
}

// extInode is what the reader uses of an inode.
type extInode struct {
	num   uint32
	mode  uint16
	size  int64
	flags uint32
	block [60]byte
	mtime int64
}

func (f *extFS) inode(num uint32) (*extInode, error) {
	if num == 0 || num > f.inodes {
		return nil, fmt.Errorf("ext: inode %d of %d", num, f.inodes)
	}
	group, index := (num-1)/f.inodesPerGroup, (num-1)%f.inodesPerGroup
	desc := make([]byte, f.descSize)
	if err := f.read(desc, f.descTable+int64(group)*f.descSize); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	table := uint64(le.Uint32(desc[8:]))
	if f.wide {
		table |= uint64(le.Uint32(desc[0x28:])) << 32
	}
	if table == 0 || table > uint64(f.size/f.blockSize) {
		return nil, fmt.Errorf("ext: inode table of group %d at block %d", group, table)
	}
	raw := make([]byte, 128)
	if err := f.read(raw, int64(table)*f.blockSize+int64(index)*f.inodeSize); err != nil {
		return nil, err
	}
	ino := &extInode{num: num, mode: le.Uint16(raw[0:]), flags: le.Uint32(raw[32:]), mtime: int64(le.Uint32(raw[16:]))}
	size := uint64(le.Uint32(raw[4:])) | uint64(le.Uint32(raw[108:]))<<32
	if size > 1<<62 {
		return nil, fmt.Errorf("ext: inode %d declares %d bytes", num, size)
	}
	ino.size = int64(size)
	copy(ino.block[:], raw[40:100])
	return ino, nil
}

// extRun maps count blocks from the file's logical block logical onto
// the filesystem's block physical (0: a hole, read as zeros).
type extRun struct {
	logical, physical, count uint64
}

// runs maps the file's blocks below want (a block count) onto the disk,
// in logical order, reading at most extMaxNodes tree nodes or indirect
// blocks.
func (f *extFS) runs(ino *extInode, want uint64) ([]extRun, error) {
	if ino.flags&extFlagInline != 0 {
		return nil, errExtInline
	}
	budget := extMaxNodes
	var out []extRun
	if ino.flags&extFlagExtents != 0 {
		err := f.extentNode(ino.block[:], want, extMaxDepth, &budget, &out)
		return out, err
	}
	return out, f.blockMap(ino, want, &budget, &out)
}

// extentNode reads one node of an extent tree (the header and its
// entries, in node), descending at most depth more levels.
func (f *extFS) extentNode(node []byte, want uint64, depth int, budget *int, out *[]extRun) error {
	le := binary.LittleEndian
	if len(node) < 12 || le.Uint16(node[0:]) != extExtentMagic {
		return errors.New("ext: an extent node without its magic")
	}
	entries, level := int(le.Uint16(node[2:])), int(le.Uint16(node[6:]))
	if 12+entries*12 > len(node) {
		return fmt.Errorf("ext: %d extents in a node of %d bytes", entries, len(node))
	}
	if level > depth {
		return fmt.Errorf("ext: an extent tree deeper than %d", extMaxDepth)
	}
	for i := range entries {
		e := node[12+i*12:]
		first := uint64(le.Uint32(e[0:]))
		if first >= want {
			break
		}
		if level == 0 {
			n := uint64(le.Uint16(e[4:]))
			start := uint64(le.Uint16(e[6:]))<<32 | uint64(le.Uint32(e[8:]))
			if n > 32768 { // not yet written: reads as zeros
				n, start = n-32768, 0
			}
			*out = append(*out, extRun{logical: first, physical: start, count: n})
			if len(*out) > extMaxNodes {
				return fmt.Errorf("ext: more than %d extents", extMaxNodes)
			}
			continue
		}
		if *budget--; *budget < 0 {
			return fmt.Errorf("ext: more than %d extent tree nodes", extMaxNodes)
		}
		child := make([]byte, f.blockSize)
		if err := f.readBlock(child, uint64(le.Uint16(e[8:]))<<32|uint64(le.Uint32(e[4:]))); err != nil {
			return err
		}
		if err := f.extentNode(child, want, level-1, budget, out); err != nil {
			return err
		}
	}
	return nil
}

// blockMap reads ext2/3's block map: 12 direct blocks, then single,
// double and triple indirect blocks.
func (f *extFS) blockMap(ino *extInode, want uint64, budget *int, out *[]extRun) error {
	le := binary.LittleEndian
	var logical uint64
	add := func(phys uint64) {
		if n := len(*out); n > 0 {
			last := &(*out)[n-1]
			if last.logical+last.count == logical && (phys == 0 && last.physical == 0 || phys != 0 && last.physical != 0 && last.physical+last.count == phys) {
				last.count++
				logical++
				return
			}
		}
		*out = append(*out, extRun{logical: logical, physical: phys, count: 1})
		logical++
	}
	var walk func(block uint64, level int) error
	perBlock := uint64(f.blockSize / 4)
	span := func(level int) uint64 {
		s := uint64(1)
		for range level {
			s *= perBlock
		}
		return s
	}
	walk = func(block uint64, level int) error {
		if block == 0 {
			logical += span(level) // a hole
			if n := len(*out); n == 0 || (*out)[n-1].physical != 0 {
				*out = append(*out, extRun{logical: logical - span(level), count: span(level)})
			} else {
				(*out)[n-1].count += span(level)
			}
			return nil
		}
		if level == 0 {
			add(block)
			return nil
		}
		if *budget--; *budget < 0 {
			return fmt.Errorf("ext: more than %d indirect blocks", extMaxNodes)
		}
		b := make([]byte, f.blockSize)
		if err := f.readBlock(b, block); err != nil {
			return err
		}
		for i := uint64(0); i < perBlock && logical < want; i++ {
			if err := walk(uint64(le.Uint32(b[i*4:])), level-1); err != nil {
				return err
			}
		}
		return nil
	}
	for i := 0; i < 15 && logical < want; i++ {
		level := max(i-11, 0)
		if err := walk(uint64(le.Uint32(ino.block[i*4:])), level); err != nil {
			return err
		}
	}
	return nil
}

// content reads the first n bytes of the file (n at most its size).
func (f *extFS) content(ino *extInode, n int64) ([]byte, error) {
	if n > ino.size {
		n = ino.size
	}
	blocks := uint64((n + f.blockSize - 1) / f.blockSize)
	runs, err := f.runs(ino, blocks)
	if err != nil {
		return nil, err
	}
	out := make([]byte, n)
	for _, r := range runs {
		if r.physical == 0 || r.logical >= blocks {
			continue // a hole
		}
		count := min(r.count, blocks-r.logical)
		if r.physical+count > uint64(f.size/f.blockSize) {
			return nil, fmt.Errorf("ext: blocks %d+%d outside the filesystem", r.physical, count)
		}
		from := int64(r.logical) * f.blockSize
		to := min(from+int64(count)*f.blockSize, n)
		if err := f.read(out[from:to], int64(r.physical)*f.blockSize); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// extEntry is one directory entry.
type extEntry struct {
	name  string
	inode uint32
}

// dir lists the directory ino, at most extMaxDir bytes of it.
func (f *extFS) dir(ino *extInode) ([]extEntry, error) {
	if ents, ok := f.dirs[ino.num]; ok {
		return ents, nil
	}
	if ino.size > extMaxDir {
		return nil, fmt.Errorf("ext: a directory of %d bytes, over the bound of %d", ino.size, extMaxDir)
	}
	b, err := f.content(ino, ino.size)
	if err != nil {
		return nil, err
	}
	var ents []extEntry
	le := binary.LittleEndian
	for blk := int64(0); blk < int64(len(b)); blk += f.blockSize {
		block := b[blk:min(blk+f.blockSize, int64(len(b)))]
		for off := 0; off+8 <= len(block); {
			recLen := int(le.Uint16(block[off+4:]))
			nameLen := int(block[off+6])
			if recLen < 8 || off+recLen > len(block) || 8+nameLen > recLen {
				break // the rest of this block is not entries
			}
			if n := le.Uint32(block[off:]); n != 0 && nameLen > 0 {
				ents = append(ents, extEntry{name: string(block[off+8 : off+8+nameLen]), inode: n})
			}
			off += recLen
		}
	}
	size := 0
	for _, e := range ents {
		size += len(e.name) + 16
	}
	if f.dirsBytes+size <= extMaxDirsBytes {
		f.dirs[ino.num], f.dirsBytes = ents, f.dirsBytes+size
	}
	return ents, nil
}

// walk finds the inode of name (fs.FS form), following no link.
func (f *extFS) walk(op, name string) (*extInode, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	ino, err := f.inode(extRootInode)
	if err != nil {
		return nil, err
	}
	if name == "." {
		return ino, nil
	}
	for c := range strings.SplitSeq(name, "/") {
		if ino.mode&0xF000 != 0x4000 {
			return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
		}
		ents, err := f.dir(ino)
		if err != nil {
			return nil, &fs.PathError{Op: op, Path: name, Err: err}
		}
		next := uint32(0)
		for _, e := range ents {
			if e.name == c {
				next = e.inode
				break
			}
		}
		if next == 0 {
			return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
		}
		if ino, err = f.inode(next); err != nil {
			return nil, &fs.PathError{Op: op, Path: name, Err: err}
		}
	}
	return ino, nil
}

// Lstat describes name without following a last link.
func (f *extFS) Lstat(name string) (fs.FileInfo, error) {
	ino, err := f.walk("lstat", name)
	if err != nil {
		return nil, err
	}
	return extInfo{name: path.Base(name), ino: ino}, nil
}

// ReadLink reads the target of the symbolic link name.
func (f *extFS) ReadLink(name string) (string, error) {
	ino, err := f.walk("readlink", name)
	if err != nil {
		return "", err
	}
	if ino.mode&0xF000 != 0xA000 {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrInvalid}
	}
	if ino.size > maxLinkTarget {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fmt.Errorf("a link target of %d bytes", ino.size)}
	}
	if ino.size < 60 && ino.flags&(extFlagExtents|extFlagInline) == 0 {
		return string(ino.block[:ino.size]), nil // stored in the inode
	}
	b, err := f.content(ino, ino.size)
	return string(b), err
}

// maxLinkTarget bounds a symbolic link's target (PATH_MAX).
const maxLinkTarget = 4096

// Open opens name, following no link; a regular file is read whole when
// opened, so callers bound its size first (ReadFile does).
func (f *extFS) Open(name string) (fs.File, error) {
	ino, err := f.walk("open", name)
	if err != nil {
		return nil, err
	}
	file := &extFile{fs: f, info: extInfo{name: path.Base(name), ino: ino}}
	return file, nil
}

// ReadDir lists the directory name.
func (f *extFS) ReadDir(name string) ([]fs.DirEntry, error) {
	ino, err := f.walk("readdir", name)
	if err != nil {
		return nil, err
	}
	if ino.mode&0xF000 != 0x4000 {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
	}
	ents, err := f.dir(ino)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
	}
	var out []fs.DirEntry
	for _, e := range ents {
		if e.name == "." || e.name == ".." || strings.Contains(e.name, "/") {
			continue
		}
		child, err := f.inode(e.inode)
		if err != nil {
			continue // an entry naming no inode is not listed
		}
		out = append(out, fs.FileInfoToDirEntry(extInfo{name: e.name, ino: child}))
	}
	return out, nil
}

// extFile is an open file: a regular file's bytes are read on the first
// Read.
type extFile struct {
	fs   *extFS
	info extInfo
	data []byte
	read bool
	off  int
}

func (e *extFile) Stat() (fs.FileInfo, error) { return e.info, nil }
func (e *extFile) Close() error               { return nil }

func (e *extFile) Read(p []byte) (int, error) {
	if !e.info.Mode().IsRegular() {
		return 0, &fs.PathError{Op: "read", Path: e.info.name, Err: errors.New("not a regular file")}
	}
	if !e.read {
		e.read = true
		if e.info.ino.size > extMaxFile {
			return 0, &fs.PathError{Op: "read", Path: e.info.name, Err: fmt.Errorf("%d bytes, over the reader's bound of %d", e.info.ino.size, extMaxFile)}
		}
		var err error
		if e.data, err = e.fs.content(e.info.ino, e.info.ino.size); err != nil {
			return 0, err
		}
	}
	if e.off >= len(e.data) {
		return 0, io.EOF
	}
	n := copy(p, e.data[e.off:])
	e.off += n
	return n, nil
}

// extInfo describes an inode as fs.FileInfo.
type extInfo struct {
	name string
	ino  *extInode
}

func (i extInfo) Name() string       { return i.name }
func (i extInfo) Size() int64        { return i.ino.size }
func (i extInfo) ModTime() time.Time { return time.Unix(i.ino.mtime, 0) }
func (i extInfo) IsDir() bool        { return i.Mode().IsDir() }
func (i extInfo) Sys() any           { return nil }

func (i extInfo) Mode() fs.FileMode {
	perm := fs.FileMode(i.ino.mode & 0o777)
	switch i.ino.mode & 0xF000 {
	case 0x4000:
		return perm | fs.ModeDir
	case 0xA000:
		return perm | fs.ModeSymlink
	case 0x8000:
		return perm
	case 0x2000:
		return perm | fs.ModeDevice | fs.ModeCharDevice
	case 0x6000:
		return perm | fs.ModeDevice
	case 0x1000:
		return perm | fs.ModeNamedPipe
	case 0xC000:
		return perm | fs.ModeSocket
	}
	return perm | fs.ModeIrregular
}
