package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"
)

// Limits of the XFS reader; docs/security.md lists them.
const (
	// maxXFSExtents bounds the extents of one file or directory: a
	// 16 MiB file in 4 KiB blocks, each its own extent, has 4,096.
	maxXFSExtents = 1 << 16
	// maxXFSBtreeBlocks bounds the extent B+tree blocks read for one
	// file, and maxXFSBtreeLevels its height (XFS's own maximum is 9).
	maxXFSBtreeBlocks = 4096
	maxXFSBtreeLevels = 9
	// maxXFSRead bounds the bytes one opened XFS filesystem reads in all:
	// however its directories and links are laid out, the work of the
	// lookups Inspect makes stays under it.
	maxXFSRead = 512 << 20
	// maxXFSSymlink is XFS's own bound on a link's target.
	maxXFSSymlink = 1024
)

// xfsFS reads files of an XFS filesystem (v4 or v5) by path: directory
// lookup (short-form, block, leaf and node directories), regular files
// and link targets, each read only as far as asked, through extent maps
// of bounded size. It implements linkFS and fs.ReadDirFS.
type xfsFS struct {
	r         io.ReaderAt
	off, size int64
	read      int64 // bytes read so far, within maxXFSRead

	blockSize, dirBlockSize int64
	inodeSize               int64
	agBlocks                uint64
	agCount                 uint64
	agBlkLog, inoPBLog      uint
	rootIno                 uint64
	v5, ftype               bool
}

var errNotXFS = errors.New("not an XFS filesystem")

var _ linkFS = (*xfsFS)(nil)
var _ fs.ReadDirFS = (*xfsFS)(nil)

// openXFS reads the primary superblock of the XFS filesystem at
// [off, off+size) and checks that its geometry is self-consistent.
func openXFS(r io.ReaderAt, off, size int64) (*xfsFS, error) {
	sb := make([]byte, 512)
	if err := readFull(r, sb, off); err != nil {
		return nil, err
	}
	if string(sb[:4]) != "XFSB" {
		return nil, errNotXFS
	}
	be16 := func(o int) uint64 { return uint64(binary.BigEndian.Uint16(sb[o:])) }
	be32 := func(o int) uint64 { return uint64(binary.BigEndian.Uint32(sb[o:])) }
	f := &xfsFS{r: r, off: off, size: size}
	bs := be32(4)
	f.rootIno = binary.BigEndian.Uint64(sb[56:])
	f.agBlocks, f.agCount = be32(84), be32(88)
	version := be16(100)
	inodeSize, inopb := be16(104), be16(106)
	blockLog, inodeLog, inopbLog, agBlkLog := uint(sb[120]), uint(sb[122]), uint(sb[123]), uint(sb[124])
	dirBlkLog := uint(sb[192])
	features2, incompat := be32(200), be32(216)
	f.v5 = version&0xF == 5
	if !f.v5 && version&0xF != 4 {
		return nil, fmt.Errorf("%w: superblock version %d", errNotXFS, version&0xF)
	}
	switch {
	case bs < 512 || bs > 65536 || bs != 1<<blockLog,
		inodeSize < 256 || inodeSize > 2048 || inodeSize != 1<<inodeLog || inodeSize > bs,
		inopb != bs/inodeSize || inopb != 1<<inopbLog,
		f.agBlocks == 0 || f.agCount == 0 || agBlkLog > 31 || f.agBlocks > 1<<agBlkLog,
		dirBlkLog > 16-blockLog:
		return nil, fmt.Errorf("%w: inconsistent superblock geometry", errNotXFS)
	}
	f.blockSize, f.inodeSize, f.dirBlockSize = int64(bs), int64(inodeSize), int64(bs)<<dirBlkLog
	f.agBlkLog, f.inoPBLog = agBlkLog, inopbLog
	if f.v5 {
		f.ftype = incompat&0x1 != 0
	} else {
		f.ftype = version&0x8000 != 0 && features2&0x200 != 0
	}
	return f, nil
}

// readAt reads len(b) bytes at off in the filesystem, within its region
// and the read budget.
func (f *xfsFS) readAt(b []byte, off int64) error {
	if off < 0 || off > f.size || int64(len(b)) > f.size-off {
		return fmt.Errorf("xfs: a read at %d past the filesystem's %d bytes", off, f.size)
	}
	if f.read += int64(len(b)); f.read > maxXFSRead {
		return fmt.Errorf("xfs: more than %d bytes read: %w", maxXFSRead, ErrTooLarge)
	}
	return readFull(f.r, b, f.off+off)
}

// blockOffset is the byte offset of filesystem block fsb (an AG number
// above the AG block bits).
func (f *xfsFS) blockOffset(fsb uint64) (int64, error) {
	ag, agb := fsb>>f.agBlkLog, fsb&(1<<f.agBlkLog-1)
	if ag >= f.agCount || agb >= f.agBlocks {
		return 0, fmt.Errorf("xfs: block %d outside the filesystem", fsb)
	}
	return int64(ag*f.agBlocks+agb) * f.blockSize, nil
}

// xfsInode is what the reader needs of an inode: its mode, size and
// data fork.
type xfsInode struct {
	ino      uint64
	mode     uint16
	format   byte
	size     int64
	nextents uint32
	mtime    time.Time
	fork     []byte // the data fork's bytes in the inode
}

// inode reads inode ino.
func (f *xfsFS) inode(ino uint64) (*xfsInode, error) {
	agIno := ino & (1<<(f.agBlkLog+f.inoPBLog) - 1)
	ag := ino >> (f.agBlkLog + f.inoPBLog)
	if ag >= f.agCount || ino == 0 {
		return nil, fmt.Errorf("xfs: inode %d outside the filesystem", ino)
	}
	boff, err := f.blockOffset(ag<<f.agBlkLog | agIno>>f.inoPBLog)
	if err != nil {
		return nil, fmt.Errorf("xfs: inode %d: %w", ino, err)
	}
	b := make([]byte, f.inodeSize)
	if err := f.readAt(b, boff+int64(agIno&(1<<f.inoPBLog-1))*f.inodeSize); err != nil {
		return nil, err
	}
	if string(b[:2]) != "IN" || b[4] < 1 || b[4] > 3 {
		return nil, fmt.Errorf("xfs: inode %d: no inode magic", ino)
	}
	core := int64(100)
	if b[4] == 3 {
		core = 176
		if binary.BigEndian.Uint64(b[152:]) != ino {
			return nil, fmt.Errorf("xfs: inode %d: it says it is inode %d", ino, binary.BigEndian.Uint64(b[152:]))
		}
	}
	end := f.inodeSize
	if forkoff := int64(b[82]) * 8; forkoff != 0 {
		end = min(end, core+forkoff)
	}
	size := binary.BigEndian.Uint64(b[56:])
	if size > 1<<62 {
		return nil, fmt.Errorf("xfs: inode %d: size %d", ino, size)
	}
	return &xfsInode{
		ino: ino, mode: binary.BigEndian.Uint16(b[2:]), format: b[5], size: int64(size),
		nextents: binary.BigEndian.Uint32(b[76:]),
		mtime:    time.Unix(int64(int32(binary.BigEndian.Uint32(b[40:]))), 0),
		fork:     b[core:end],
	}, nil
}

func (i *xfsInode) isDir() bool     { return i.mode&0xF000 == 0x4000 }
func (i *xfsInode) isLink() bool    { return i.mode&0xF000 == 0xA000 }
func (i *xfsInode) isRegular() bool { return i.mode&0xF000 == 0x8000 }

// Data fork formats.
const (
	xfsLocal   = 1
	xfsExtents = 2
	xfsBtree   = 3
)

// xfsExtent maps blocks [off, off+count) of a file to filesystem block
// start; unwritten extents read as zeros.
type xfsExtent struct {
	off, start, count uint64
	unwritten         bool
}

func unpackExtent(b []byte) xfsExtent {
	l0, l1 := binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
	return xfsExtent{
		unwritten: l0>>63 != 0,
		off:       l0 >> 9 & (1<<54 - 1),
		start:     (l0&0x1FF)<<43 | l1>>21,
		count:     l1 & (1<<21 - 1),
	}
}

// extents returns the extent map of an inode in extents or B+tree
// format, sorted by file offset, refusing overlapping extents.
func (f *xfsFS) extents(in *xfsInode) ([]xfsExtent, error) {
	var out []xfsExtent
	switch in.format {
	case xfsExtents:
		if int64(in.nextents) > int64(len(in.fork)/16) {
			return nil, fmt.Errorf("xfs: inode %d: %d extents in its inode", in.ino, in.nextents)
		}
		for i := range int(in.nextents) {
			out = append(out, unpackExtent(in.fork[16*i:]))
		}
	case xfsBtree:
		if len(in.fork) < 4 {
			return nil, errors.New("xfs: a B+tree root too small")
		}
		level, numrecs := binary.BigEndian.Uint16(in.fork), int(binary.BigEndian.Uint16(in.fork[2:]))
		maxrecs := (len(in.fork) - 4) / 16
		if level == 0 || level > maxXFSBtreeLevels || numrecs > maxrecs {
			return nil, fmt.Errorf("xfs: inode %d: a B+tree root of level %d with %d records", in.ino, level, numrecs)
		}
		visited := 0
		for i := range numrecs {
			ptr := binary.BigEndian.Uint64(in.fork[4+maxrecs*8+8*i:])
			if err := f.btree(ptr, int(level)-1, &visited, &out); err != nil {
				return nil, fmt.Errorf("xfs: inode %d: %w", in.ino, err)
			}
		}
	default:
		return nil, fmt.Errorf("xfs: inode %d: data fork format %d has no extents", in.ino, in.format)
	}
	for _, e := range out {
		if e.count == 0 || e.off+e.count > (1<<62)/uint64(f.blockSize) {
			return nil, fmt.Errorf("xfs: inode %d: an extent of %d blocks at block %d", in.ino, e.count, e.off)
		}
	}
	slices.SortFunc(out, func(a, b xfsExtent) int { return compareU64(a.off, b.off) })
	for i := 1; i < len(out); i++ {
		if out[i].off < out[i-1].off+out[i-1].count {
			return nil, fmt.Errorf("xfs: inode %d: overlapping extents", in.ino)
		}
	}
	return out, nil
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// btree appends the extent records under the bmap B+tree block fsb,
// expected at level, to out.
func (f *xfsFS) btree(fsb uint64, level int, visited *int, out *[]xfsExtent) error {
	if *visited++; *visited > maxXFSBtreeBlocks {
		return fmt.Errorf("more than %d extent tree blocks", maxXFSBtreeBlocks)
	}
	boff, err := f.blockOffset(fsb)
	if err != nil {
		return err
	}
	b := make([]byte, f.blockSize)
	if err := f.readAt(b, boff); err != nil {
		return err
	}
	hdr, magic := 24, "BMAP"
	if f.v5 {
		hdr, magic = 72, "BMA3"
	}
	if string(b[:4]) != magic || int(binary.BigEndian.Uint16(b[4:])) != level {
		return fmt.Errorf("block %d is not an extent tree block of level %d", fsb, level)
	}
	numrecs := int(binary.BigEndian.Uint16(b[6:]))
	maxrecs := (len(b) - hdr) / 16
	if numrecs > maxrecs {
		return fmt.Errorf("block %d: %d records", fsb, numrecs)
	}
	if level == 0 {
		for i := range numrecs {
			if len(*out) == maxXFSExtents {
				return fmt.Errorf("more than %d extents", maxXFSExtents)
			}
			*out = append(*out, unpackExtent(b[hdr+16*i:]))
		}
		return nil
	}
	for i := range numrecs {
		if err := f.btree(binary.BigEndian.Uint64(b[hdr+maxrecs*8+8*i:]), level-1, visited, out); err != nil {
			return err
		}
	}
	return nil
}

// readData reads [off, off+len(b)) of a file mapped by ext: holes and
// unwritten extents read as zeros.
func (f *xfsFS) readData(ext []xfsExtent, b []byte, off int64) error {
	clear(b)
	end := off + int64(len(b))
	i, _ := slices.BinarySearchFunc(ext, uint64(off/f.blockSize), func(e xfsExtent, blk uint64) int {
		if e.off+e.count <= blk {
			return -1
		}
		if e.off > blk {
			return 1
		}
		return 0
	})
	for ; i < len(ext); i++ {
		e := ext[i]
		es, ee := int64(e.off)*f.blockSize, int64(e.off+e.count)*f.blockSize
		if es >= end {
			break
		}
		if e.unwritten || ee <= off {
			continue
		}
		s, t := max(es, off), min(ee, end)
		// The extent's blocks are contiguous in one AG: check its last
		// block too.
		first, err := f.blockOffset(e.start)
		if err != nil {
			return err
		}
		if _, err := f.blockOffset(e.start + e.count - 1); err != nil {
			return err
		}
		if err := f.readAt(b[s-off:t-off], first+(s-es)); err != nil {
			return err
		}
	}
	return nil
}

// xfsLeafOffset is where a directory's data blocks end (32 GiB): its
// leaf and free-index blocks come after.
const xfsLeafOffset = 32 << 30

// dirEntries calls fn with each entry (but "." and "..") of directory in
// until fn returns true, reading at most maxDirSize bytes of it.
func (f *xfsFS) dirEntries(in *xfsInode, fn func(name string, ino uint64) bool) error {
	if in.format == xfsLocal {
		return f.shortDir(in, fn)
	}
	ext, err := f.extents(in)
	if err != nil {
		return err
	}
	budget := int64(maxDirSize)
	blk := make([]byte, f.dirBlockSize)
	for _, e := range ext {
		// each directory block whose start lies in this extent
		es, ee := int64(e.off)*f.blockSize, int64(e.off+e.count)*f.blockSize
		for o := (es + f.dirBlockSize - 1) / f.dirBlockSize * f.dirBlockSize; o < ee && o < xfsLeafOffset; o += f.dirBlockSize {
			if budget -= f.dirBlockSize; budget < 0 {
				return fmt.Errorf("xfs: directory %d: %w (%d bytes)", in.ino, ErrTooLarge, maxDirSize)
			}
			if err := f.readData(ext, blk, o); err != nil {
				return err
			}
			if done, err := f.dataBlock(in.ino, blk, fn); err != nil || done {
				return err
			}
		}
	}
	return nil
}

// dataBlock walks the entries of one directory data block (of a block
// directory, with its leaf at the end, or of a leaf or node directory).
func (f *xfsFS) dataBlock(dir uint64, b []byte, fn func(string, uint64) bool) (bool, error) {
	start, end := 16, len(b)
	if f.v5 {
		start = 64
	}
	switch string(b[:4]) {
	case "XD2B", "XDB3":
		count := int64(binary.BigEndian.Uint32(b[len(b)-8:]))
		if count > int64(len(b))/8 {
			return false, fmt.Errorf("xfs: directory %d: a block with %d leaf entries", dir, count)
		}
		end = len(b) - 8 - int(count)*8
	case "XD2D", "XDD3":
	default:
		return false, fmt.Errorf("xfs: directory %d: not a directory data block", dir)
	}
	for o := start; o+8 <= end; {
		if binary.BigEndian.Uint16(b[o:]) == 0xFFFF { // unused space
			n := int(binary.BigEndian.Uint16(b[o+2:]))
			if n < 8 || n%8 != 0 {
				return false, fmt.Errorf("xfs: directory %d: free space of %d bytes", dir, n)
			}
			o += n
			continue
		}
		ino := binary.BigEndian.Uint64(b[o:])
		n := int(b[o+8])
		size := 8 + 1 + n + 2
		if f.ftype {
			size++
		}
		size = (size + 7) &^ 7
		if n == 0 || o+size > end {
			return false, fmt.Errorf("xfs: directory %d: an entry past its block", dir)
		}
		name := string(b[o+9 : o+9+n])
		o += size
		if name == "." || name == ".." {
			continue
		}
		if fn(name, ino) {
			return true, nil
		}
	}
	return false, nil
}

// shortDir walks a short-form directory, held in its inode.
func (f *xfsFS) shortDir(in *xfsInode, fn func(string, uint64) bool) error {
	b := in.fork
	if len(b) < 6 {
		return fmt.Errorf("xfs: directory %d: short", in.ino)
	}
	count, wide := int(b[0]), b[1] != 0
	inoLen := 4
	if wide {
		inoLen, count = 8, int(b[1])
	}
	o := 2 + inoLen
	for range count {
		if o+3 > len(b) {
			return fmt.Errorf("xfs: directory %d: an entry past its inode", in.ino)
		}
		n := int(b[o])
		e := o + 3 + n
		if f.ftype {
			e++
		}
		if n == 0 || e+inoLen > len(b) {
			return fmt.Errorf("xfs: directory %d: an entry past its inode", in.ino)
		}
		name := string(b[o+3 : o+3+n])
		var ino uint64
		if wide {
			ino = binary.BigEndian.Uint64(b[e:])
		} else {
			ino = uint64(binary.BigEndian.Uint32(b[e:]))
		}
		o = e + inoLen
		if fn(name, ino) {
			return nil
		}
	}
	return nil
}

// walk finds the inode at name (fs.FS form) without following links.
func (f *xfsFS) walk(op, name string) (*xfsInode, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	in, err := f.inode(f.rootIno)
	if err != nil {
		return nil, err
	}
	if name == "." {
		return in, nil
	}
	parts := splitPath(name)
	if len(parts) > maxPathDepth {
		return nil, fmt.Errorf("%s: more than %d components", name, maxPathDepth)
	}
	for _, c := range parts {
		if !in.isDir() {
			return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
		}
		var found uint64
		if err := f.dirEntries(in, func(n string, ino uint64) bool {
			if n == c {
				found = ino
				return true
			}
			return false
		}); err != nil {
			return nil, err
		}
		if found == 0 {
			return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
		}
		if in, err = f.inode(found); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// Lstat describes the file at name, a link itself rather than its target.
func (f *xfsFS) Lstat(name string) (fs.FileInfo, error) {
	in, err := f.walk("lstat", name)
	if err != nil {
		return nil, err
	}
	return &xfsInfo{name: path.Base(name), in: in}, nil
}

// ReadLink returns the target of the link at name.
func (f *xfsFS) ReadLink(name string) (string, error) {
	in, err := f.walk("readlink", name)
	if err != nil {
		return "", err
	}
	if !in.isLink() {
		return "", fmt.Errorf("%s is not a symbolic link", name)
	}
	if in.size == 0 || in.size > maxXFSSymlink {
		return "", fmt.Errorf("xfs: link %s of %d bytes", name, in.size)
	}
	switch in.format {
	case xfsLocal:
		if in.size > int64(len(in.fork)) {
			return "", fmt.Errorf("xfs: link %s longer than its inode", name)
		}
		return string(in.fork[:in.size]), nil
	case xfsExtents:
		ext, err := f.extents(in)
		if err != nil {
			return "", err
		}
		// A v5 remote link's blocks each start with a 56-byte header.
		hdr := int64(0)
		if f.v5 {
			hdr = 56
		}
		var target []byte
		blk := make([]byte, f.blockSize)
		for o := int64(0); int64(len(target)) < in.size; o += f.blockSize {
			if err := f.readData(ext, blk, o); err != nil {
				return "", err
			}
			if hdr > 0 && string(blk[:4]) != "XSLM" {
				return "", fmt.Errorf("xfs: link %s: no remote link header", name)
			}
			target = append(target, blk[hdr:min(f.blockSize, hdr+in.size-int64(len(target)))]...)
		}
		return string(target), nil
	}
	return "", fmt.Errorf("xfs: link %s in data fork format %d", name, in.format)
}

// Open opens the regular file or directory at name, without following
// links.
func (f *xfsFS) Open(name string) (fs.File, error) {
	in, err := f.walk("open", name)
	if err != nil {
		return nil, err
	}
	fi := &xfsInfo{name: path.Base(name), in: in}
	switch {
	case in.isRegular():
		var ext []xfsExtent
		if in.size > 0 {
			if ext, err = f.extents(in); err != nil {
				return nil, err
			}
		}
		return &xfsFile{f: f, info: fi, ext: ext}, nil
	case in.isDir():
		return &xfsFile{f: f, info: fi}, nil
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("not a regular file or directory (%s)", fi.Mode().Type())}
}

// ReadDir lists the directory at name, sorted by name, within maxDirSize
// bytes of directory blocks.
func (f *xfsFS) ReadDir(name string) ([]fs.DirEntry, error) {
	in, err := f.walk("readdir", name)
	if err != nil {
		return nil, err
	}
	if !in.isDir() {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errors.New("not a directory")}
	}
	var out []fs.DirEntry
	err = f.dirEntries(in, func(n string, ino uint64) bool {
		out = append(out, &xfsDirEntry{f: f, name: n, ino: ino})
		return false
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return out, nil
}

// xfsFile reads a regular file sequentially, as far as it is read.
type xfsFile struct {
	f    *xfsFS
	info *xfsInfo
	ext  []xfsExtent
	pos  int64
}

func (x *xfsFile) Stat() (fs.FileInfo, error) { return x.info, nil }
func (x *xfsFile) Close() error               { return nil }

func (x *xfsFile) Read(p []byte) (int, error) {
	if !x.info.in.isRegular() {
		return 0, errors.New("xfs: a directory is not read as a file")
	}
	size := x.info.in.size
	if x.pos >= size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), size-x.pos, 1<<20))
	if err := x.f.readData(x.ext, p[:n], x.pos); err != nil {
		return 0, err
	}
	x.pos += int64(n)
	return n, nil
}

// xfsInfo is an inode as fs.FileInfo.
type xfsInfo struct {
	name string
	in   *xfsInode
}

func (i *xfsInfo) Name() string       { return i.name }
func (i *xfsInfo) Size() int64        { return i.in.size }
func (i *xfsInfo) ModTime() time.Time { return i.in.mtime }
func (i *xfsInfo) IsDir() bool        { return i.in.isDir() }
func (i *xfsInfo) Sys() any           { return nil }
func (i *xfsInfo) Mode() fs.FileMode {
	m := fs.FileMode(i.in.mode & 0o777)
	switch i.in.mode & 0xF000 {
	case 0x8000:
	case 0x4000:
		m |= fs.ModeDir
	case 0xA000:
		m |= fs.ModeSymlink
	case 0xC000:
		m |= fs.ModeSocket
	case 0x6000:
		m |= fs.ModeDevice
	case 0x2000:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case 0x1000:
		m |= fs.ModeNamedPipe
	default:
		m |= fs.ModeIrregular
	}
	return m
}

// xfsDirEntry is a directory entry; its inode is read when asked.
type xfsDirEntry struct {
	f    *xfsFS
	name string
	ino  uint64
}

func (d *xfsDirEntry) Name() string { return d.name }
func (d *xfsDirEntry) IsDir() bool  { return d.Type().IsDir() }
func (d *xfsDirEntry) Type() fs.FileMode {
	fi, err := d.Info()
	if err != nil {
		return fs.ModeIrregular
	}
	return fi.Mode().Type()
}
func (d *xfsDirEntry) Info() (fs.FileInfo, error) {
	in, err := d.f.inode(d.ino)
	if err != nil {
		return nil, err
	}
	return &xfsInfo{name: d.name, in: in}, nil
}
