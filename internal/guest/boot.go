package guest

// Boot is which firmware can start a disk, as far as its layout shows:
// what a VM's firmware must be for the disk to boot at all.
type Boot struct {
	// BIOS: the MBR holds boot code, which a BIOS runs.
	BIOS bool `json:"bios"`
	// UEFI: an EFI system partition holds a FAT filesystem, where UEFI
	// firmware looks for a loader.
	UEFI bool `json:"uefi"`
	// Reasons say what each answer rests on.
	Reasons []string `json:"reasons,omitempty"`
}

// BootOf reads l for the firmware that can boot it. The loader files
// themselves (\EFI\BOOT\BOOTX64.EFI, grub's i386-pc files) are not read
// yet: an ESP without a loader still counts as UEFI.
func BootOf(l *Layout) Boot {
	var b Boot
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
