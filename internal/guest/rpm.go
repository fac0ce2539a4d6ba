package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
)

// Limits of the rpm database reader; docs/security.md lists them.
const (
	// maxRPMDB bounds the database file, read whole: rpm's sqlite
	// database takes about 47 KiB a package (Fedora's and CBL-Mariner's
	// container images), so 32 MiB holds about 700 packages, more than a
	// cloud image installs, and keeps the file, one header and the
	// package list within the gate's verification child (128 MiB).
	maxRPMDB = 32 << 20
	// maxRPMHeader bounds one package's header blob (rpm's own bound on
	// the data is 256 MiB; the largest headers, with long file lists,
	// are a few MiB).
	maxRPMHeader = 16 << 20
	// maxSQLiteDepth bounds the height of a B-tree (a table of a million
	// rows is 4 high).
	maxSQLiteDepth = 32
	// maxRPMTags bounds the index entries of one header (rpm: 65,535).
	maxRPMTags = 0xFFFF
)

// rpmDatabases are where rpm keeps its database, newest layout first,
// with the backend each file is: sqlite (rpm 4.16 and later: Fedora 33+,
// RHEL 9), ndb (SUSE), Berkeley DB's hash (RHEL 8 and older).
var rpmDatabases = []struct{ path, backend string }{
	{"/usr/lib/sysimage/rpm/rpmdb.sqlite", "sqlite"},
	{"/usr/lib/sysimage/rpm/Packages.db", "ndb"},
	{"/usr/lib/sysimage/rpm/Packages", "bdb"},
	{"/var/lib/rpm/rpmdb.sqlite", "sqlite"},
	{"/var/lib/rpm/Packages.db", "ndb"},
	{"/var/lib/rpm/Packages", "bdb"},
}

// ReadRPM lists the packages in rpm's database, whichever of its three
// backends holds it (the first found of rpmDatabases). gpg-pubkey
// entries, rpm's imported keys, are not packages and are left out.
func ReadRPM(fsys fs.FS) ([]Package, error) {
	for _, db := range rpmDatabases {
		b, err := ReadFile(fsys, db.path, maxRPMDB)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var out []Package
		n := 0
		each := func(blob []byte) error {
			if n++; n > maxPackages {
				return fmt.Errorf("more than %d packages", maxPackages)
			}
			p, err := parseRPMHeader(blob)
			if err != nil {
				return fmt.Errorf("package %d: %w", n, err)
			}
			if p.Name != "gpg-pubkey" {
				out = append(out, p)
			}
			return nil
		}
		switch db.backend {
		case "sqlite":
			err = sqliteRPMBlobs(b, each)
		case "ndb":
			err = ndbBlobs(b, each)
		default:
			err = bdbBlobs(b, each)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", db.path, err)
		}
		return out, nil
	}
	return nil, ErrNoDatabase
}

// RPM header tags read.
const (
	rpmTagName    = 1000
	rpmTagVersion = 1001
	rpmTagRelease = 1002
	rpmTagEpoch   = 1003
	rpmTagArch    = 1022
)

// parseRPMHeader reads name, version-release, epoch and arch from a
// header blob as rpm stores it in its database: an index count and data
// length (big-endian), the index entries (tag, type, offset, count) and
// the data they point into.
func parseRPMHeader(b []byte) (Package, error) {
	p := Package{Type: "rpm"}
	if len(b) < 8 {
		return p, errors.New("a header shorter than its counts")
	}
	il, dl := int64(binary.BigEndian.Uint32(b)), int64(binary.BigEndian.Uint32(b[4:]))
	if il == 0 || il > maxRPMTags || 8+il*16+dl > int64(len(b)) {
		return p, fmt.Errorf("a header of %d tags and %d data bytes in %d bytes", il, dl, len(b))
	}
	data := b[8+il*16 : 8+il*16+dl]
	for i := range il {
		e := b[8+16*i:]
		tag, typ := binary.BigEndian.Uint32(e), binary.BigEndian.Uint32(e[4:])
		off, count := int64(binary.BigEndian.Uint32(e[8:])), int64(binary.BigEndian.Uint32(e[12:]))
		switch tag {
		case rpmTagName, rpmTagVersion, rpmTagRelease, rpmTagArch:
			if typ != 6 || off >= dl { // RPM_STRING_TYPE
				return p, fmt.Errorf("tag %d: type %d at %d", tag, typ, off)
			}
			n := bytes.IndexByte(data[off:], 0)
			if n < 0 || n > 1024 {
				return p, fmt.Errorf("tag %d: not a string", tag)
			}
			s := string(data[off : off+int64(n)])
			switch tag {
			case rpmTagName:
				p.Name = s
			case rpmTagVersion:
				p.Version = s + p.Version
			case rpmTagRelease:
				p.Version += "-" + s
			case rpmTagArch:
				p.Arch = s
			}
		case rpmTagEpoch:
			if typ != 4 || count < 1 || off%4 != 0 || off+4 > dl { // RPM_INT32_TYPE
				return p, fmt.Errorf("tag %d: type %d at %d", tag, typ, off)
			}
			p.Epoch = strconv.FormatUint(uint64(binary.BigEndian.Uint32(data[off:])), 10)
		}
	}
	if p.Name == "" || p.Version == "" || p.Version[0] == '-' {
		return p, errors.New("a header without a name, version or release")
	}
	return p, nil
}

// sqliteRPMBlobs calls each with the blob column of every row of the Packages
// table of rpm's sqlite database b (CREATE TABLE Packages (hnum INTEGER
// PRIMARY KEY AUTOINCREMENT, blob BLOB NOT NULL)), reading SQLite's file
// format: the schema table's B-tree on page 1 names the table's root
// page; its B-tree's leaves hold the rows, whose blobs continue on
// overflow pages. Each page is visited once at most, so a cycle ends.
func sqliteRPMBlobs(b []byte, each func([]byte) error) error {
	db, err := openSQLite(b)
	if err != nil {
		return err
	}
	root := uint32(0)
	err = db.walk(1, 0, func(rec [][]byte, types []uint64) error {
		if len(rec) >= 4 && string(rec[0]) == "table" && string(rec[1]) == "Packages" {
			root = uint32(sqliteInt(rec[3], types[3]))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqlite schema: %w", err)
	}
	if root == 0 {
		return errors.New("sqlite: no Packages table")
	}
	return db.walk(root, 0, func(rec [][]byte, types []uint64) error {
		if len(rec) < 2 || types[1] < 12 || types[1]%2 != 0 {
			return errors.New("sqlite: a Packages row without a blob")
		}
		return each(rec[1])
	})
}

// sqliteDB is a SQLite database file held in memory.
type sqliteDB struct {
	b              []byte
	pageSize, used int64 // used: the page size less its reserved bytes
	pages          int64
	seen           map[uint32]bool
}

func openSQLite(b []byte) (*sqliteDB, error) {
	if len(b) < 100 || string(b[:16]) != "SQLite format 3\x00" {
		return nil, errors.New("not a SQLite database")
	}
	ps := int64(binary.BigEndian.Uint16(b[16:]))
	if ps == 1 {
		ps = 65536
	}
	if ps < 512 || ps&(ps-1) != 0 || int64(b[20]) > ps-480 {
		return nil, fmt.Errorf("sqlite: page size %d", ps)
	}
	return &sqliteDB{b: b, pageSize: ps, used: ps - int64(b[20]), pages: int64(len(b)) / ps, seen: map[uint32]bool{}}, nil
}

// page returns page n (from 1), once: a page seen before is an error.
func (db *sqliteDB) page(n uint32) ([]byte, error) {
	if n == 0 || int64(n) > db.pages {
		return nil, fmt.Errorf("sqlite: page %d outside the file's %d", n, db.pages)
	}
	if db.seen[n] {
		return nil, fmt.Errorf("sqlite: page %d reached twice", n)
	}
	db.seen[n] = true
	return db.b[int64(n-1)*db.pageSize : int64(n)*db.pageSize], nil
}

// walk calls fn with the columns (and their serial types) of every row of
// the table B-tree rooted at page root.
func (db *sqliteDB) walk(root uint32, depth int, fn func(rec [][]byte, types []uint64) error) error {
	if depth > maxSQLiteDepth {
		return fmt.Errorf("sqlite: a B-tree deeper than %d", maxSQLiteDepth)
	}
	pg, err := db.page(root)
	if err != nil {
		return err
	}
	h := int64(0)
	if root == 1 {
		h = 100
	}
	if int64(len(pg)) < h+12 {
		return errors.New("sqlite: a short page")
	}
	kind, cells := pg[h], int64(binary.BigEndian.Uint16(pg[h+3:]))
	hdr := int64(8)
	if kind == 0x05 {
		hdr = 12
	} else if kind != 0x0D {
		return fmt.Errorf("sqlite: page %d is not a table B-tree page (%#x)", root, kind)
	}
	if h+hdr+2*cells > db.used {
		return fmt.Errorf("sqlite: page %d: %d cells", root, cells)
	}
	for i := range cells {
		c := int64(binary.BigEndian.Uint16(pg[h+hdr+2*i:]))
		if c >= db.used {
			return fmt.Errorf("sqlite: page %d: a cell at %d", root, c)
		}
		if kind == 0x05 {
			if c+4 > db.used {
				return fmt.Errorf("sqlite: page %d: a cell at %d", root, c)
			}
			if err := db.walk(binary.BigEndian.Uint32(pg[c:]), depth+1, fn); err != nil {
				return err
			}
			continue
		}
		payload, err := db.payload(pg[:db.used], c)
		if err != nil {
			return fmt.Errorf("sqlite: page %d: %w", root, err)
		}
		rec, types, err := sqliteRecord(payload)
		if err != nil {
			return fmt.Errorf("sqlite: page %d: %w", root, err)
		}
		if err := fn(rec, types); err != nil {
			return err
		}
	}
	if kind == 0x05 {
		return db.walk(binary.BigEndian.Uint32(pg[h+8:]), depth+1, fn)
	}
	return nil
}

// payload returns the whole payload of the table leaf cell at c of pg,
// following its overflow pages.
func (db *sqliteDB) payload(pg []byte, c int64) ([]byte, error) {
	size, n := sqliteVarint(pg[c:])
	if n == 0 {
		return nil, errors.New("a cell's size")
	}
	c += int64(n)
	if _, n = sqliteVarint(pg[c:]); n == 0 { // the rowid
		return nil, errors.New("a cell's rowid")
	}
	c += int64(n)
	if size > maxRPMHeader+1024 {
		return nil, fmt.Errorf("a row of %d bytes: %w", size, ErrTooLarge)
	}
	p, u := int64(size), db.used
	x, m := u-35, (u-12)*32/255-23
	local := p
	if p > x {
		local = m + (p-m)%(u-4)
		if local > x {
			local = m
		}
	}
	if c+local > int64(len(pg)) {
		return nil, errors.New("a cell past its page")
	}
	out := make([]byte, 0, p)
	out = append(out, pg[c:c+local]...)
	if local == p {
		return out, nil
	}
	if c+local+4 > int64(len(pg)) {
		return nil, errors.New("a cell past its page")
	}
	next := binary.BigEndian.Uint32(pg[c+local:])
	for int64(len(out)) < p {
		ov, err := db.page(next)
		if err != nil {
			return nil, err
		}
		next = binary.BigEndian.Uint32(ov)
		out = append(out, ov[4:min(u, 4+p-int64(len(out)))]...)
	}
	return out, nil
}

// sqliteVarint decodes SQLite's big-endian varint; n is 0 when b ends
// first.
func sqliteVarint(b []byte) (v uint64, n int) {
	for i := 0; i < 9 && i < len(b); i++ {
		if i == 8 {
			return v<<8 | uint64(b[i]), 9
		}
		v = v<<7 | uint64(b[i]&0x7F)
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// sqliteRecord splits a record into its columns' bytes and serial types.
func sqliteRecord(b []byte) ([][]byte, []uint64, error) {
	hs, n := sqliteVarint(b)
	if n == 0 || hs > uint64(len(b)) || hs < uint64(n) {
		return nil, nil, errors.New("a record header")
	}
	var cols [][]byte
	var types []uint64
	body := int64(hs)
	for o := int64(n); o < int64(hs); {
		t, k := sqliteVarint(b[o:hs])
		if k == 0 {
			return nil, nil, errors.New("a record header")
		}
		o += int64(k)
		var size int64
		switch {
		case t >= 12:
			size = int64((t - 12) / 2)
		case t >= 1 && t <= 4:
			size = int64(t)
		case t == 5:
			size = 6
		case t == 6 || t == 7:
			size = 8
		}
		if size > int64(len(b))-body {
			return nil, nil, errors.New("a column past its record")
		}
		cols, types = append(cols, b[body:body+size]), append(types, t)
		body += size
	}
	return cols, types, nil
}

// sqliteInt is an integer column's value.
func sqliteInt(b []byte, t uint64) int64 {
	switch t {
	case 8:
		return 0
	case 9:
		return 1
	}
	if t < 1 || t > 6 {
		return 0
	}
	var v int64
	for _, c := range b {
		v = v<<8 | int64(c)
	}
	return v
}

// ndbBlobs calls each with the header blobs of rpm's ndb database b
// (Packages.db: a 32-byte header, slot pages naming each package's
// block, and a blob behind each), as rpm's lib/backend/ndb/rpmpkg.c
// writes it.
func ndbBlobs(b []byte, each func([]byte) error) error {
	le := binary.LittleEndian
	if len(b) < 32 || string(b[:4]) != "RpmP" || le.Uint32(b[4:]) != 0 {
		return errors.New("not an rpm ndb database")
	}
	slotPages := int64(le.Uint32(b[12:]))
	if slotPages == 0 || slotPages*4096 > int64(len(b)) {
		return fmt.Errorf("ndb: %d slot pages", slotPages)
	}
	for o := int64(32); o+16 <= slotPages*4096; o += 16 {
		s := b[o:]
		if string(s[:4]) != "Slot" {
			return fmt.Errorf("ndb: a slot without its magic at %d", o)
		}
		idx, blk := le.Uint32(s[4:]), int64(le.Uint32(s[8:]))
		if idx == 0 {
			continue
		}
		at := blk * 16
		if at < slotPages*4096 || at+16 > int64(len(b)) {
			return fmt.Errorf("ndb: package %d's blob at %d", idx, at)
		}
		h := b[at:]
		n := int64(le.Uint32(h[12:]))
		if string(h[:4]) != "BlbS" || le.Uint32(h[4:]) != idx || n > maxRPMHeader || at+16+n > int64(len(b)) {
			return fmt.Errorf("ndb: package %d's blob header", idx)
		}
		if err := each(h[16 : 16+n]); err != nil {
			return err
		}
	}
	return nil
}

// bdbBlobs calls each with the header blobs of rpm's Berkeley DB hash database b
// (Packages, either byte order): the data items of every hash page,
// inline or on a chain of overflow pages; items too short to be a
// header (the record holding rpm's next header number) are skipped.
func bdbBlobs(b []byte, each func([]byte) error) error {
	if len(b) < 512 {
		return errors.New("not a Berkeley DB hash database")
	}
	var bo binary.ByteOrder = binary.LittleEndian
	if bo.Uint32(b[12:]) != 0x061561 {
		bo = binary.BigEndian
		if bo.Uint32(b[12:]) != 0x061561 {
			return errors.New("not a Berkeley DB hash database")
		}
	}
	ps := int64(bo.Uint32(b[20:]))
	if ps < 512 || ps > 65536 || ps&(ps-1) != 0 {
		return fmt.Errorf("bdb: page size %d", ps)
	}
	last := int64(bo.Uint32(b[32:]))
	pages := int64(len(b)) / ps
	if last >= pages {
		return fmt.Errorf("bdb: %d pages in a file of %d", last+1, pages)
	}
	const pageHeader = 26
	used := map[int64]bool{} // overflow pages read, each once
	for n := int64(1); n <= last; n++ {
		pg := b[n*ps : (n+1)*ps]
		if t := pg[25]; t != 13 && t != 2 { // P_HASH, P_HASH_UNSORTED
			continue
		}
		entries := int64(bo.Uint16(pg[20:]))
		if pageHeader+2*entries > ps {
			return fmt.Errorf("bdb: page %d: %d entries", n, entries)
		}
		for i := int64(1); i < entries; i += 2 { // data items follow their keys
			off := int64(bo.Uint16(pg[pageHeader+2*i:]))
			end := int64(bo.Uint16(pg[pageHeader+2*(i-1):])) // items grow down from the page's end
			if off < pageHeader+2*entries || off >= end || end > ps {
				return fmt.Errorf("bdb: page %d: item %d at %d", n, i, off)
			}
			var blob []byte
			switch pg[off] {
			case 1: // H_KEYDATA
				blob = pg[off+1 : end]
			case 3: // H_OFFPAGE: 4 unused bytes, first page, length
				if off+12 > end {
					return fmt.Errorf("bdb: page %d: item %d", n, i)
				}
				var err error
				if blob, err = bdbOverflow(b, bo, ps, int64(bo.Uint32(pg[off+4:])), int64(bo.Uint32(pg[off+8:])), used); err != nil {
					return fmt.Errorf("bdb: page %d: %w", n, err)
				}
			default:
				return fmt.Errorf("bdb: page %d: an item of type %d", n, pg[off])
			}
			if len(blob) < 16 {
				continue
			}
			if err := each(blob); err != nil {
				return err
			}
		}
	}
	return nil
}

// bdbOverflow reads length bytes from the overflow chain starting at page
// first.
func bdbOverflow(b []byte, bo binary.ByteOrder, ps, first, length int64, used map[int64]bool) ([]byte, error) {
	if length > maxRPMHeader {
		return nil, fmt.Errorf("an item of %d bytes: %w", length, ErrTooLarge)
	}
	out := make([]byte, 0, length)
	for n := first; int64(len(out)) < length; {
		if n <= 0 || n >= int64(len(b))/ps || used[n] {
			return nil, fmt.Errorf("overflow page %d", n)
		}
		used[n] = true
		pg := b[n*ps : (n+1)*ps]
		if pg[25] != 7 { // P_OVERFLOW
			return nil, fmt.Errorf("page %d is not an overflow page", n)
		}
		k := int64(bo.Uint16(pg[22:])) // bytes on this page
		if k == 0 || 26+k > ps || int64(len(out))+k > length {
			return nil, fmt.Errorf("overflow page %d holds %d bytes", n, k)
		}
		out = append(out, pg[26:26+k]...)
		n = int64(bo.Uint32(pg[16:]))
	}
	return out, nil
}
