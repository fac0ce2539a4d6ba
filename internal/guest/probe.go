package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Limits of what Probe reads; docs/security.md lists them.
const (
	sectorSize = 512
	// maxGPTEntries bounds the partition entries read from a GPT: the
	// specification's minimum array holds 128, and no installer writes
	// more.
	maxGPTEntries = 256
	// maxGPTEntrySize bounds one entry (128 bytes in every GPT seen).
	maxGPTEntrySize = 1024
	// probeSize is what is read at the start of a partition to find its
	// filesystem: Btrfs keeps its superblock at 64 KiB.
	probeSize = 64<<10 + 4096
)

// Table kinds.
const (
	TableNone = "none" // no partition table: a filesystem on the whole disk, or nothing known
	TableMBR  = "mbr"
	TableGPT  = "gpt"
)

// Layout is what the start of a disk says about it.
type Layout struct {
	// Table is TableNone, TableMBR or TableGPT.
	Table string `json:"table"`
	// HybridMBR reports a GPT whose MBR lists partitions besides the
	// protective one (a hybrid MBR, as Boot Camp and some ISOs write).
	HybridMBR bool `json:"hybridMBR,omitempty"`
	// BootCode reports boot code in the MBR (its first 440 bytes are not
	// all zero): what a BIOS runs.
	BootCode bool `json:"bootCode,omitempty"`
	// Partitions are the table's, in table order.
	Partitions []Partition `json:"partitions,omitempty"`
	// Filesystem is the filesystem on the whole disk when there is no
	// table ("" when none is recognised).
	Filesystem string `json:"filesystem,omitempty"`
	// Notes say what was found wrong and skipped, for the reader.
	Notes []string `json:"notes,omitempty"`
}

// Partition is one entry of the table: what the report says of it (its
// Role, what Type means to a boot, is one of the Role constants; its
// Filesystem, what its first bytes show, one of the Fs constants), and
// its Type, the GPT type GUID (upper case) or the MBR type ("0x83").
type Partition struct {
	api.GuestPartition
	Type string
}

// Partition roles.
const (
	RoleESP      = "esp"
	RoleBIOSBoot = "bios-boot"
	RoleLVM      = "lvm"
	RoleLinux    = "linux"
	RoleSwap     = "swap"
	RoleWindows  = "windows"
	RoleExtended = "extended"
)

// Filesystems Probe recognises by their superblocks.
const (
	FsExt2  = "ext2"
	FsExt3  = "ext3"
	FsExt4  = "ext4"
	FsXFS   = "xfs"
	FsBtrfs = "btrfs"
	FsFAT   = "vfat"
	FsNTFS  = "ntfs"
	FsLVMPV = "lvm2-pv"
	FsSwap  = "swap"
)

// gptRoles are the GPT partition type GUIDs a boot cares about.
var gptRoles = map[string]string{
	"C12A7328-F81F-11D2-BA4B-00A0C93EC93B": RoleESP,
	"21686148-6449-6E6F-744E-656564454649": RoleBIOSBoot,
	"E6D6D379-F507-44C2-A23C-238F2A3DF928": RoleLVM,
	"0FC63DAF-8483-4772-8E79-3D69D8477DE4": RoleLinux,
	"4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709": RoleLinux, // root, x86-64
	"B921B045-1DF0-41C3-AF44-4C6F280D3FAE": RoleLinux, // root, arm64
	"BC13C2FF-59E6-4262-A352-B275FD6F7172": RoleLinux, // /boot (XBOOTLDR)
	"0657FD6D-A4AB-43C4-84E5-0933C84B4F4F": RoleSwap,
	"EBD0A0A2-B9E5-4433-87C0-68B6B72699C7": RoleWindows, // basic data
	"E3C9E316-0B5C-4DB8-817D-F92DF00215AE": RoleWindows, // reserved
	"DE94BBA4-06D1-4D40-A16A-BFD50179D6AC": RoleWindows, // recovery
}

// mbrRoles are the MBR partition types a boot cares about.
var mbrRoles = map[byte]string{
	0xEF: RoleESP, 0x8E: RoleLVM, 0x83: RoleLinux, 0x82: RoleSwap,
	0x07: RoleWindows, 0x0B: RoleWindows, 0x0C: RoleWindows,
	0x05: RoleExtended, 0x0F: RoleExtended, 0x85: RoleExtended,
}

// Probe reads the partition table of the disk r (size bytes) and the
// filesystem signature of each partition, or of the whole disk. It reads
// at most a few hundred KiB whatever the disk says, and a table it cannot
// make sense of is a note, not an error: an error is a failed read.
func Probe(r io.ReaderAt, size int64) (*Layout, error) {
	l := &Layout{Table: TableNone}
	if size < sectorSize {
		return l, nil
	}
	mbr := make([]byte, sectorSize)
	if err := readFull(r, mbr, 0); err != nil {
		return nil, err
	}
	l.BootCode = mbr[510] == 0x55 && mbr[511] == 0xAA && !allZero(mbr[:440])
	entries, protective := mbrEntries(mbr)
	if protective {
		if ok, err := l.readGPT(r, size); err != nil {
			return nil, err
		} else if ok {
			l.HybridMBR = len(entries) > 1
			return l, l.probePartitions(r, size)
		}
	}
	if len(entries) > 0 && !looksLikeBootSector(mbr) {
		l.Table = TableMBR
		for i, e := range entries {
			start, length := int64(e.lba)*sectorSize, int64(e.sectors)*sectorSize
			p := Partition{GuestPartition: api.GuestPartition{Number: i + 1, Start: start, Size: length, Role: mbrRoles[e.kind]}, Type: fmt.Sprintf("0x%02x", e.kind)}
			l.Partitions = append(l.Partitions, p)
		}
		return l, l.probePartitions(r, size)
	}
	fs, err := probeFilesystem(r, 0, size)
	if err != nil {
		return nil, err
	}
	l.Filesystem = fs
	return l, nil
}

// mbrEntry is one used entry of an MBR's table.
type mbrEntry struct {
	kind         byte
	lba, sectors uint32
}

// mbrEntries returns the used entries of the MBR's table (none without
// its signature) and whether one is a GPT's protective entry (0xEE).
func mbrEntries(mbr []byte) (entries []mbrEntry, protective bool) {
	if mbr[510] != 0x55 || mbr[511] != 0xAA {
		return nil, false
	}
	for i := range 4 {
		e := mbr[446+16*i : 446+16*(i+1)]
		kind := e[4]
		lba, sectors := binary.LittleEndian.Uint32(e[8:]), binary.LittleEndian.Uint32(e[12:])
		if kind == 0 || sectors == 0 {
			continue
		}
		if kind == 0xEE {
			protective = true
		}
		entries = append(entries, mbrEntry{kind, lba, sectors})
	}
	return entries, protective
}

// looksLikeBootSector reports a FAT or NTFS boot sector at sector 0 (a
// filesystem on the whole disk also ends with 0x55AA, and its BPB bytes
// can look like table entries).
func looksLikeBootSector(b []byte) bool {
	return bytes.Equal(b[3:11], []byte("NTFS    ")) || bytes.HasPrefix(b[54:], []byte("FAT1")) || bytes.HasPrefix(b[82:], []byte("FAT32   "))
}

// readGPT reads the GPT header at LBA 1 and its entries, checking both
// CRCs; ok is false (with a note) when there is no valid GPT.
func (l *Layout) readGPT(r io.ReaderAt, size int64) (ok bool, err error) {
	hdr := make([]byte, sectorSize)
	if err := readFull(r, hdr, sectorSize); err != nil {
		return false, err
	}
	if !bytes.Equal(hdr[:8], []byte("EFI PART")) {
		l.Notes = append(l.Notes, "a protective MBR without a GPT header")
		return false, nil
	}
	hdrSize := binary.LittleEndian.Uint32(hdr[12:])
	if hdrSize < 92 || hdrSize > sectorSize {
		l.Notes = append(l.Notes, fmt.Sprintf("GPT header size %d", hdrSize))
		return false, nil
	}
	want := binary.LittleEndian.Uint32(hdr[16:])
	check := bytes.Clone(hdr[:hdrSize])
	binary.LittleEndian.PutUint32(check[16:], 0)
	if crc32.ChecksumIEEE(check) != want {
		l.Notes = append(l.Notes, "GPT header checksum mismatch")
		return false, nil
	}
	entriesLBA := binary.LittleEndian.Uint64(hdr[72:])
	count := binary.LittleEndian.Uint32(hdr[80:])
	entrySize := binary.LittleEndian.Uint32(hdr[84:])
	if count > maxGPTEntries || entrySize < 128 || entrySize > maxGPTEntrySize || entrySize%8 != 0 ||
		entriesLBA > uint64(size/sectorSize) {
		l.Notes = append(l.Notes, fmt.Sprintf("GPT entry array out of bounds (%d entries of %d bytes at LBA %d)", count, entrySize, entriesLBA))
		return false, nil
	}
	array := make([]byte, int(count)*int(entrySize))
	if err := readFull(r, array, int64(entriesLBA)*sectorSize); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			l.Notes = append(l.Notes, "GPT entry array past the end of the disk")
			return false, nil
		}
		return false, err
	}
	if crc32.ChecksumIEEE(array) != binary.LittleEndian.Uint32(hdr[88:]) {
		l.Notes = append(l.Notes, "GPT entry array checksum mismatch")
		return false, nil
	}
	l.Table = TableGPT
	for i := range int(count) {
		e := array[i*int(entrySize) : (i+1)*int(entrySize)]
		if allZero(e[:16]) {
			continue
		}
		first, last := binary.LittleEndian.Uint64(e[32:]), binary.LittleEndian.Uint64(e[40:])
		if last < first || last >= uint64(size/sectorSize) {
			l.Notes = append(l.Notes, fmt.Sprintf("GPT entry %d outside the disk", i+1))
			continue
		}
		guid := guidString(e[:16])
		l.Partitions = append(l.Partitions, Partition{
			GuestPartition: api.GuestPartition{Number: i + 1, Start: int64(first) * sectorSize, Size: int64(last-first+1) * sectorSize, Role: gptRoles[guid]},
			Type:           guid,
		})
	}
	return true, nil
}

// probePartitions finds each partition's filesystem; partitions past the
// disk's end are noted and left unprobed.
func (l *Layout) probePartitions(r io.ReaderAt, size int64) error {
	for i := range l.Partitions {
		p := &l.Partitions[i]
		if p.Role == RoleExtended {
			continue
		}
		if p.Start < 0 || p.Size <= 0 || p.Start >= size || p.Size > size-p.Start {
			l.Notes = append(l.Notes, fmt.Sprintf("partition %d outside the disk", p.Number))
			continue
		}
		fs, err := probeFilesystem(r, p.Start, p.Size)
		if err != nil {
			return err
		}
		p.Filesystem = fs
	}
	return nil
}

// probeFilesystem names the filesystem whose signature is at off (in a
// region of size bytes), or "".
func probeFilesystem(r io.ReaderAt, off, size int64) (string, error) {
	b := make([]byte, min(probeSize, size))
	if err := readFull(r, b, off); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "", err
	}
	at := func(o int, magic string) bool { return len(b) >= o+len(magic) && string(b[o:o+len(magic)]) == magic }
	switch {
	case at(0, "XFSB"):
		return FsXFS, nil
	case at(3, "NTFS    "):
		return FsNTFS, nil
	case at(0x10040, "_BHRfS_M"):
		return FsBtrfs, nil
	case len(b) >= 1024+0x68 && binary.LittleEndian.Uint16(b[1024+56:]) == 0xEF53:
		return extKind(b[1024:]), nil
	case at(4096-10, "SWAPSPACE2") || at(4096-10, "SWAP-SPACE"):
		return FsSwap, nil
	case isFAT(b):
		return FsFAT, nil
	}
	for s := range 4 { // the LVM2 label may be in any of the first 4 sectors
		if at(s*sectorSize, "LABELONE") && at(s*sectorSize+24, "LVM2 001") {
			return FsLVMPV, nil
		}
	}
	return "", nil
}

// extKind tells ext4 (extents, 64-bit or flex_bg), ext3 (a journal) and
// ext2 apart from the superblock's feature flags.
func extKind(sb []byte) string {
	compat := binary.LittleEndian.Uint32(sb[0x5C:])
	incompat := binary.LittleEndian.Uint32(sb[0x60:])
	switch {
	case incompat&(0x40|0x80|0x200) != 0:
		return FsExt4
	case compat&0x4 != 0:
		return FsExt3
	}
	return FsExt2
}

// isFAT reports a FAT boot sector: the signature, a jump, a power-of-two
// sector size and the type string mkfs.fat and Windows write.
func isFAT(b []byte) bool {
	if len(b) < sectorSize || b[510] != 0x55 || b[511] != 0xAA || (b[0] != 0xEB && b[0] != 0xE9) {
		return false
	}
	bps := binary.LittleEndian.Uint16(b[11:])
	if bps < 512 || bps > 4096 || bps&(bps-1) != 0 {
		return false
	}
	return strings.HasPrefix(string(b[54:62]), "FAT") || string(b[82:90]) == "FAT32   "
}

// guidString is a GPT GUID in its usual upper-case form (the first three
// fields are little-endian on disk).
func guidString(g []byte) string {
	return fmt.Sprintf("%08X-%04X-%04X-%X-%X", binary.LittleEndian.Uint32(g[0:]), binary.LittleEndian.Uint16(g[4:]),
		binary.LittleEndian.Uint16(g[6:]), g[8:10], g[10:16])
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// readFull reads len(b) bytes at off; a short read is io.ErrUnexpectedEOF.
func readFull(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
