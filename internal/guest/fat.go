package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"unicode/utf16"
)

// Limits of the FAT reader; docs/security.md lists them.
const (
	// maxFATDirEntries bounds the entries read of one directory.
	maxFATDirEntries = 16384
	// maxFATPathDepth bounds the directories a path may pass.
	maxFATPathDepth = 16
)

// fatFS reads files of a FAT12, FAT16 or FAT32 filesystem (an ESP) by
// path, following cluster chains no longer than the file needs: a loop
// in the FAT ends there.
type fatFS struct {
	r           io.ReaderAt
	off, size   int64
	bytesPerSec int64
	clusterSize int64
	fatOff      int64 // the first FAT
	rootOff     int64 // FAT12/16's fixed root directory
	rootEntries int64
	dataOff     int64
	clusters    uint32 // data clusters: numbers 2 .. clusters+1
	bits        int    // 12, 16 or 32
	rootCluster uint32 // FAT32's root directory
}

var errNotFAT = errors.New("not a FAT filesystem")

// openFAT reads the boot sector of the FAT filesystem at [off, off+size).
func openFAT(r io.ReaderAt, off, size int64) (*fatFS, error) {
	b := make([]byte, sectorSize)
	if err := readFull(r, b, off); err != nil {
		return nil, err
	}
	if !isFAT(b) {
		return nil, errNotFAT
	}
	le16 := func(o int) int64 { return int64(binary.LittleEndian.Uint16(b[o:])) }
	le32 := func(o int) int64 { return int64(binary.LittleEndian.Uint32(b[o:])) }
	f := &fatFS{r: r, off: off, size: size, bytesPerSec: le16(11)}
	secPerCluster := int64(b[13])
	reserved, fats, rootEntries := le16(14), int64(b[16]), le16(17)
	total := le16(19)
	if total == 0 {
		total = le32(32)
	}
	fatSize := le16(22)
	if fatSize == 0 {
		fatSize = le32(36)
	}
	if secPerCluster == 0 || secPerCluster&(secPerCluster-1) != 0 || reserved == 0 || fats == 0 || fats > 4 || fatSize == 0 || total == 0 {
		return nil, fmt.Errorf("%w: inconsistent boot sector", errNotFAT)
	}
	f.clusterSize = secPerCluster * f.bytesPerSec
	f.fatOff = reserved * f.bytesPerSec
	f.rootOff = f.fatOff + fats*fatSize*f.bytesPerSec
	f.rootEntries = rootEntries
	f.dataOff = f.rootOff + (rootEntries*32+f.bytesPerSec-1)/f.bytesPerSec*f.bytesPerSec
	if total*f.bytesPerSec > size || f.dataOff >= total*f.bytesPerSec {
		return nil, fmt.Errorf("%w: %d sectors do not fit its %d bytes", errNotFAT, total, size)
	}
	n := (total*f.bytesPerSec - f.dataOff) / f.clusterSize
	f.clusters = uint32(min(n, 0x0FFFFFF5))
	switch {
	case f.clusters < 4085:
		f.bits = 12
	case f.clusters < 65525:
		f.bits = 16
	default:
		f.bits = 32
		f.rootCluster = uint32(le32(44))
	}
	return f, nil
}

// next returns the cluster after c in its chain; ok is false at the
// chain's end or on a value that names no data cluster.
func (f *fatFS) next(c uint32) (uint32, bool, error) {
	var v uint32
	switch f.bits {
	case 12:
		var b [2]byte
		if err := readFull(f.r, b[:], f.off+f.fatOff+int64(c)*3/2); err != nil {
			return 0, false, err
		}
		v = uint32(binary.LittleEndian.Uint16(b[:]))
		if c&1 == 1 {
			v >>= 4
		}
		v &= 0xFFF
	case 16:
		var b [2]byte
		if err := readFull(f.r, b[:], f.off+f.fatOff+int64(c)*2); err != nil {
			return 0, false, err
		}
		v = uint32(binary.LittleEndian.Uint16(b[:]))
	default:
		var b [4]byte
		if err := readFull(f.r, b[:], f.off+f.fatOff+int64(c)*4); err != nil {
			return 0, false, err
		}
		v = binary.LittleEndian.Uint32(b[:]) & 0x0FFFFFFF
	}
	return v, v >= 2 && v < f.clusters+2, nil
}

// readChain reads at most limit bytes of the chain starting at cluster
// first, following at most the clusters limit needs.
func (f *fatFS) readChain(first uint32, limit int64) ([]byte, error) {
	var out []byte
	c, ok := first, first >= 2 && first < f.clusters+2
	for ok && int64(len(out)) < limit {
		buf := make([]byte, min(f.clusterSize, limit-int64(len(out))))
		if err := readFull(f.r, buf, f.off+f.dataOff+int64(c-2)*f.clusterSize); err != nil {
			return nil, err
		}
		out = append(out, buf...)
		var err error
		if c, ok, err = f.next(c); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fatEntry is one directory entry, with its long name when it has one.
type fatEntry struct {
	name    string // the long name, else the 8.3 name as "NAME.EXT"
	dir     bool
	cluster uint32
	size    int64
}

// readDir reads the entries of the directory starting at cluster (0:
// FAT12/16's fixed root).
func (f *fatFS) readDir(cluster uint32) ([]fatEntry, error) {
	var raw []byte
	var err error
	if cluster == 0 && f.bits != 32 {
		raw = make([]byte, min(f.rootEntries, maxFATDirEntries)*32)
		err = readFull(f.r, raw, f.off+f.rootOff)
	} else {
		if cluster == 0 {
			cluster = f.rootCluster
		}
		raw, err = f.readChain(cluster, maxFATDirEntries*32)
	}
	if err != nil {
		return nil, err
	}
	var out []fatEntry
	var long []uint16
	for i := 0; i+32 <= len(raw); i += 32 {
		e := raw[i : i+32]
		switch {
		case e[0] == 0:
			return out, nil
		case e[0] == 0xE5:
			long = nil
		case e[11] == 0x0F: // a long-name part; parts come last first
			var part []uint16
			for _, o := range []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30} {
				part = append(part, binary.LittleEndian.Uint16(e[o:]))
			}
			long = append(part, long...)
		case e[11]&0x08 != 0: // the volume label
			long = nil
		default:
			name := strings.TrimRight(string(e[0:8]), " ")
			if ext := strings.TrimRight(string(e[8:11]), " "); ext != "" {
				name += "." + ext
			}
			if long != nil {
				if n := utf16Name(long); n != "" {
					name = n
				}
			}
			cl := uint32(binary.LittleEndian.Uint16(e[26:]))
			if f.bits == 32 {
				cl |= uint32(binary.LittleEndian.Uint16(e[20:])) << 16
			}
			out = append(out, fatEntry{name: name, dir: e[11]&0x10 != 0, cluster: cl, size: int64(binary.LittleEndian.Uint32(e[28:]))})
			long = nil
		}
	}
	return out, nil
}

// utf16Name decodes a long name up to its terminator.
func utf16Name(u []uint16) string {
	for i, c := range u {
		if c == 0 || c == 0xFFFF {
			u = u[:i]
			break
		}
	}
	return string(utf16.Decode(u))
}

// lookup finds the file at name ("/EFI/BOOT/BOOTX64.EFI", matched
// without regard to case, as firmware does).
func (f *fatFS) lookup(name string) (*fatEntry, error) {
	parts := splitPath(name)
	if len(parts) == 0 || len(parts) > maxFATPathDepth {
		return nil, fmt.Errorf("%s: not a file path", name)
	}
	var cluster uint32 // the root
	for i, part := range parts {
		entries, err := f.readDir(cluster)
		if err != nil {
			return nil, err
		}
		var found *fatEntry
		for j := range entries {
			if strings.EqualFold(entries[j].name, part) {
				found = &entries[j]
				break
			}
		}
		if found == nil {
			return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
		}
		if i == len(parts)-1 {
			if found.dir {
				return nil, fmt.Errorf("%s is a directory", name)
			}
			return found, nil
		}
		if !found.dir || found.cluster == 0 {
			return nil, fmt.Errorf("%s: %s is not a directory", name, part)
		}
		cluster = found.cluster
	}
	return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
}

// readHead reads the first n bytes of the file at name, or all of it
// when it is shorter.
func (f *fatFS) readHead(name string, n int64) ([]byte, error) {
	e, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	want := min(n, e.size)
	b, err := f.readChain(e.cluster, want)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) < want {
		return nil, fmt.Errorf("%s: its cluster chain ends before its %d bytes", name, e.size)
	}
	return b, nil
}
