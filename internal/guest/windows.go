package guest

import (
	"bytes"
	"cmp"
	"fmt"
	"io"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// windowsBootManager is where Windows installs its UEFI boot manager on
// the ESP (bcdboot's default); its BCD store lies beside it.
const windowsBootManager = "/EFI/Microsoft/Boot/bootmgfw.efi"

// maxNTFSVolumes bounds the NTFS volumes looked into for Windows.
const maxNTFSVolumes = 4

// detectWindows finds Windows on a disk without an os-release: its
// kernel on an NTFS volume (readWindows), with the virtio drivers
// installed beside it; else its boot files: Windows Boot Manager on a FAT
// ESP (UEFI), or an NTFS boot sector that loads BOOTMGR (BIOS, Windows
// Vista and later), on the largest NTFS partition. It fills rep.OS (nil
// when neither is found), rep.Kernels and rep.Architecture (from the boot
// manager's PE header) and returns notes on what is not known.
func detectWindows(r io.ReaderAt, l *Layout, rep *api.GuestReport) []string {
	var notes []string
	var ntfs []Partition
	for _, p := range l.Partitions {
		if p.Filesystem == FsNTFS {
			ntfs = append(ntfs, p)
		}
	}
	for i, p := range ntfs {
		if i == maxNTFSVolumes {
			notes = append(notes, fmt.Sprintf("%d more NTFS partitions not looked into", len(ntfs)-i))
			break
		}
		w, err := readWindows(r, p.Start, p.Size)
		if err != nil {
			notes = append(notes, fmt.Sprintf("partition %d (ntfs) not read: %v", p.Number, err))
			continue
		}
		if w.kernel {
			rep.OS = &api.GuestOS{ID: "windows", VersionID: w.version, PrettyName: w.name, Partition: p.Number}
			rep.Kernels = []api.GuestKernel{{Version: "windows", Virtio: w.virtio}}
			rep.CloudbaseInit = w.cloudbaseInit
			rep.Architecture = cmp.Or(rep.Architecture, bootManagerArch(r, l))
			if w.version == "" {
				notes = append(notes, "Windows detected (its kernel, ntoskrnl.exe); its version is unknown (its SOFTWARE registry hive not read)")
			}
			return notes
		}
	}
	why := ""
	head, found := bootManager(r, l)
	if found {
		why = "Windows Boot Manager on the EFI system partition"
	}
	var largest *Partition
	for i, p := range ntfs {
		if largest == nil || p.Size > largest.Size {
			largest = &ntfs[i]
		}
		if why == "" && bootsBootmgr(r, p.Start) {
			why = "an NTFS boot sector that loads BOOTMGR"
		}
	}
	if why == "" || largest == nil {
		return notes
	}
	rep.OS = &api.GuestOS{ID: "windows", Partition: largest.Number}
	rep.Architecture = cmp.Or(rep.Architecture, peMachine(head))
	return append(notes, "Windows detected ("+why+"); its kernel was not found, so its version and drivers (viostor, vioscsi, netkvm) are unknown")
}

// bootManager reads the head of Windows Boot Manager on the first FAT
// ESP holding it.
func bootManager(r io.ReaderAt, l *Layout) ([]byte, bool) {
	for _, p := range l.Partitions {
		if p.Role != RoleESP || p.Filesystem != FsFAT {
			continue
		}
		fat, err := openFAT(r, p.Start, p.Size)
		if err != nil {
			continue
		}
		if head, err := fat.readHead(windowsBootManager, peHead); err == nil {
			return head, true
		}
	}
	return nil, false
}

// bootManagerArch is the CPU architecture of Windows Boot Manager, or "".
func bootManagerArch(r io.ReaderAt, l *Layout) string {
	head, _ := bootManager(r, l)
	return peMachine(head)
}

// bootsBootmgr reports an NTFS boot sector whose boot code loads
// BOOTMGR, as Windows' own (its messages name it) and no other does.
func bootsBootmgr(r io.ReaderAt, off int64) bool {
	b := make([]byte, sectorSize)
	if readFull(r, b, off) != nil {
		return false
	}
	return bytes.Contains(b, []byte("BOOTMGR"))
}
