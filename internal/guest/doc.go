// Package guest learns what a disk image holds, for the gate's
// verification child: every byte it reads is the tenant's, so every read
// is bounded and a layout it cannot make sense of is a note, never an
// error or a panic.
//
// Probe reads the partition table (MBR, GPT with its protective or
// hybrid MBR, or none) and names each partition's role for a boot (the
// EFI system partition, a BIOS boot partition, LVM, Linux, swap, Windows)
// and its filesystem by superblock (ext2/3/4, XFS, Btrfs, FAT, NTFS, an
// LVM2 physical volume, swap). It reads a few hundred KiB at most,
// whatever the disk declares.
//
// ReadLVM maps an LVM2 physical volume's linear logical volumes, which
// Inspect reads as partitions. OpenFS opens a filesystem (ext2/3/4 and
// XFS, each with a bounded reader of our own) and ReadFile reads a file
// from it as the guest would, following symbolic links itself inside the
// guest's root and within bounds; ReadOSRelease reads os-release(5).
// BootOf says which firmware the layout can boot with, and Loaders finds
// the EFI loaders on FAT ESPs and their CPU architecture. ListPackages
// lists the installed packages from dpkg's, rpm's (sqlite, ndb, Berkeley
// DB) or apk's database. Inspect puts them together as pkg/api's
// GuestReport, with what the root says of the VM it will be: kernels and
// their virtio drivers (Windows' from NTFS, with go-ntfs), cloud-init,
// qemu-guest-agent, a serial console; InspectPackages also returns the
// package list, which BOM writes as the guest's CycloneDX SBOM.
package guest
