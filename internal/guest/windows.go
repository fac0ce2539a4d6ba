package guest

import (
	"bytes"
	"io"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// windowsBootManager is where Windows installs its UEFI boot manager on
// the ESP (bcdboot's default); its BCD store lies beside it.
const windowsBootManager = "/EFI/Microsoft/Boot/bootmgfw.efi"

// detectWindows tells Windows from its boot files, since imagepipe reads
// no NTFS: Windows Boot Manager on a FAT ESP (UEFI), or an NTFS boot
// sector that loads BOOTMGR (BIOS, Windows Vista and later). It returns
// the OS (on the largest NTFS partition, where Windows most likely is),
// the boot manager's CPU architecture when read, and a note saying what
// the answer rests on and what is not known; nil when neither is found.
func detectWindows(r io.ReaderAt, l *Layout) (*api.GuestOS, string, string) {
	var why, arch string
	for _, p := range l.Partitions {
		if p.Role != RoleESP || p.Filesystem != FsFAT {
			continue
		}
		fat, err := openFAT(r, p.Start, p.Size)
		if err != nil {
			continue
		}
		if head, err := fat.readHead(windowsBootManager, peHead); err == nil {
			why, arch = "Windows Boot Manager on the EFI system partition", peMachine(head)
			break
		}
	}
	var ntfs *Partition
	for i, p := range l.Partitions {
		if p.Filesystem != FsNTFS {
			continue
		}
		if ntfs == nil || p.Size > ntfs.Size {
			ntfs = &l.Partitions[i]
		}
		if why == "" && bootsBootmgr(r, p.Start) {
			why = "an NTFS boot sector that loads BOOTMGR"
		}
	}
	if why == "" || ntfs == nil {
		return nil, "", ""
	}
	return &api.GuestOS{ID: "windows", Partition: ntfs.Number}, arch,
		"Windows detected (" + why + "); its version, drivers (viostor, vioscsi, netkvm) and packages are unknown: imagepipe reads no NTFS"
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
