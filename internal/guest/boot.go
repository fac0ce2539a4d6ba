package guest

import (
	"encoding/binary"
	"io"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// BootOf reads l for the firmware that can boot it, as far as its layout
// shows: BIOS when the MBR holds boot code, which a BIOS runs; UEFI when
// an EFI system partition holds a FAT filesystem, where UEFI firmware
// looks for a loader. The loader files themselves (\EFI\BOOT\BOOTX64.EFI,
// grub's i386-pc files) are not read here (Loaders finds them): an ESP
// without a loader still counts as UEFI.
func BootOf(l *Layout) api.GuestFirmware {
	var b api.GuestFirmware
	if l.BootCode && l.Table != TableNone {
		b.BIOS = true
		b.Reasons = append(b.Reasons, "boot code in the MBR")
	}
	for _, p := range l.Partitions {
		switch {
		case p.Role == RoleESP && p.Filesystem == FsFAT:
			if !b.UEFI {
				b.Reasons = append(b.Reasons, "an EFI system partition with a FAT filesystem")
			}
			b.UEFI = true
		case p.Role == RoleBIOSBoot && b.BIOS:
			b.Reasons = append(b.Reasons, "a BIOS boot partition")
		}
	}
	return b
}

// Loader is an EFI boot loader on an ESP, at the path UEFI firmware
// boots without a boot entry (the removable-media path).
type Loader struct {
	Partition int    `json:"partition"`
	Path      string `json:"path"`
	// Arch is the CPU architecture its PE header names, as Go names it
	// (amd64, arm64, 386, riscv64), or "" when the header says another.
	Arch string `json:"arch,omitempty"`
	// Signed: its PE header names an Authenticode signature (a signed
	// shim, or Windows' boot manager), which Secure Boot requires. Whose
	// key signed it is not read.
	Signed bool `json:"signed,omitempty"`
}

// removableLoaders are the removable-media paths UEFI firmware tries.
var removableLoaders = []string{"/EFI/BOOT/BOOTX64.EFI", "/EFI/BOOT/BOOTAA64.EFI", "/EFI/BOOT/BOOTIA32.EFI", "/EFI/BOOT/BOOTRISCV64.EFI"}

// peHead bounds what is read of a loader to find its PE header.
const peHead = 4096

// Loaders finds the removable-media loaders on the disk's FAT ESPs and
// reads the machine of each from its PE header. An ESP it cannot read is
// skipped: no loader is then known there.
func Loaders(r io.ReaderAt, l *Layout) []Loader {
	var out []Loader
	for _, p := range l.Partitions {
		if p.Role != RoleESP || p.Filesystem != FsFAT {
			continue
		}
		fat, err := openFAT(r, p.Start, p.Size)
		if err != nil {
			continue
		}
		for _, path := range removableLoaders {
			head, err := fat.readHead(path, peHead)
			if err != nil {
				continue
			}
			out = append(out, Loader{Partition: p.Number, Path: path, Arch: peMachine(head), Signed: peSigned(head)})
		}
	}
	return out
}

// peSigned reports whether the PE image whose first bytes are b has a
// certificate table (the security data directory, PE/COFF 4.7): where
// Authenticode signatures are.
func peSigned(b []byte) bool {
	if len(b) < 0x40 || b[0] != 'M' || b[1] != 'Z' {
		return false
	}
	le := binary.LittleEndian
	pe := int(le.Uint32(b[0x3C:]))
	if pe < 0x40 || pe > len(b)-24 || string(b[pe:pe+4]) != "PE\x00\x00" {
		return false
	}
	opt := pe + 24
	var count, dirs int
	switch {
	case opt+2 > len(b):
		return false
	case le.Uint16(b[opt:]) == 0x10b: // PE32
		count, dirs = opt+92, opt+96
	case le.Uint16(b[opt:]) == 0x20b: // PE32+
		count, dirs = opt+108, opt+112
	default:
		return false
	}
	const security = 4 // its index among the data directories
	entry := dirs + security*8
	if entry+8 > len(b) || int(le.Uint32(b[count:])) <= security {
		return false
	}
	return le.Uint32(b[entry:]) != 0 && le.Uint32(b[entry+4:]) != 0
}

// peMachine names the machine of a PE image from its first bytes.
func peMachine(b []byte) string {
	if len(b) < 0x40 || b[0] != 'M' || b[1] != 'Z' {
		return ""
	}
	pe := int(binary.LittleEndian.Uint32(b[0x3C:]))
	if pe < 0x40 || pe > len(b)-6 || string(b[pe:pe+4]) != "PE\x00\x00" {
		return ""
	}
	switch binary.LittleEndian.Uint16(b[pe+4:]) {
	case 0x8664:
		return "amd64"
	case 0xAA64:
		return "arm64"
	case 0x014C:
		return "386"
	case 0x5064:
		return "riscv64"
	}
	return ""
}
