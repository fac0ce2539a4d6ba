package bootcheck

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strings"
)

// The NoCloud seed is an ISO 9660 volume labelled cidata holding the files
// meta-data and user-data, as KubeVirt's cloudInitNoCloud disk is. It is
// written here, not by genisoimage, so the gate needs no other program:
// one directory, no Rock Ridge or Joliet. Linux shows "META-DATA.;1" as
// meta-data (lower case, the version and the empty extension dropped).

const isoSector = 2048

// SeedFile is one file of a NoCloud seed.
type SeedFile struct {
	Name string // meta-data, user-data, network-config
	Data []byte
}

// WriteSeed writes a NoCloud seed holding files, at most 16 of at most
// 1 MiB each, with names of at most 30 characters of a-z, 0-9 and "-".
func WriteSeed(w io.Writer, files []SeedFile) error {
	if len(files) > 16 {
		return fmt.Errorf("a seed of %d files: at most 16", len(files))
	}
	// Layout: system area (16 sectors), the primary volume descriptor,
	// the terminator, the L and M path tables, the root directory, then
	// each file from a sector of its own.
	const pvd, term, lTable, mTable, root, first = 16, 17, 18, 19, 20, 21
	recs := [][]byte{dirRecord([]byte{0}, root, isoSector, true), dirRecord([]byte{1}, root, isoSector, true)}
	next := uint32(first)
	for _, f := range files {
		if len(f.Name) == 0 || len(f.Name) > 30 || strings.Trim(f.Name, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return fmt.Errorf("seed file name %q: want 1 to 30 of a-z, 0-9 and -", f.Name)
		}
		if len(f.Data) > 1<<20 {
			return fmt.Errorf("seed file %s is %d bytes: at most 1 MiB", f.Name, len(f.Data))
		}
		recs = append(recs, dirRecord([]byte(strings.ToUpper(f.Name)+".;1"), next, uint32(len(f.Data)), false))
		next += sectors(len(f.Data))
	}
	dir := slices.Concat(recs...)
	if len(dir) > isoSector {
		return fmt.Errorf("the seed's directory needs %d bytes: at most one sector", len(dir))
	}

	img := make([]byte, int(next)*isoSector)
	copy(img[root*isoSector:], dir)
	at := first * isoSector
	for _, f := range files {
		copy(img[at:], f.Data)
		at += int(sectors(len(f.Data))) * isoSector
	}
	// The path tables: the root alone (identifier 0, parent 1).
	le, be := img[lTable*isoSector:], img[mTable*isoSector:]
	le[0], be[0] = 1, 1
	binary.LittleEndian.PutUint32(le[2:], root)
	binary.BigEndian.PutUint32(be[2:], root)
	binary.LittleEndian.PutUint16(le[6:], 1)
	binary.BigEndian.PutUint16(be[6:], 1)
	const pathTableSize = 10

	d := img[pvd*isoSector : (pvd+1)*isoSector]
	d[0] = 1
	copy(d[1:], "CD001")
	d[6] = 1
	copy(d[8:40], pad("", 32))        // system identifier
	copy(d[40:72], pad("cidata", 32)) // volume identifier: the label NoCloud looks for
	both32(d[80:], next)              // volume space size
	both16(d[120:], 1)                // volume set size
	both16(d[124:], 1)                // volume sequence number
	both16(d[128:], isoSector)        // logical block size
	both32(d[132:], pathTableSize)
	binary.LittleEndian.PutUint32(d[140:], lTable)
	binary.BigEndian.PutUint32(d[148:], mTable)
	copy(d[156:190], dirRecord([]byte{0}, root, isoSector, true))
	copy(d[190:813], pad("", 623)) // volume set, publisher, preparer, application, file identifiers
	for _, off := range []int{813, 830, 847, 864} {
		copy(d[off:], "0000000000000000") // dates unset, so the seed's bytes depend on its files only
	}
	d[881] = 1 // file structure version

	t := img[term*isoSector:]
	t[0] = 255
	copy(t[1:], "CD001")
	t[6] = 1

	_, err := w.Write(img)
	return err
}

func sectors(n int) uint32 { return uint32(max(1, (n+isoSector-1)/isoSector)) }

// dirRecord is a directory record for name at sector extent, size bytes.
func dirRecord(name []byte, extent, size uint32, dir bool) []byte {
	n := 33 + len(name)
	n += n % 2
	r := make([]byte, n)
	r[0] = byte(n)
	both32(r[2:], extent)
	both32(r[10:], size)
	r[18] = 70 // 1970, the recording date's year since 1900: dates are not kept
	r[19], r[20] = 1, 1
	if dir {
		r[25] = 2
	}
	both16(r[28:], 1)
	r[32] = byte(len(name))
	copy(r[33:], name)
	return r
}

func pad(s string, n int) string { return s + strings.Repeat(" ", n-len(s)) }

// both32 and both16 write v in both byte orders, as ISO 9660 does.
func both32(b []byte, v uint32) {
	binary.LittleEndian.PutUint32(b, v)
	binary.BigEndian.PutUint32(b[4:], v)
}

func both16(b []byte, v uint16) {
	binary.LittleEndian.PutUint16(b, v)
	binary.BigEndian.PutUint16(b[2:], v)
}
