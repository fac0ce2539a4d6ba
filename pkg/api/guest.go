package api

// GuestReport is what imagepipe read inside a disk: its partitions, the
// firmware it can boot with, its operating system and its packages. Every
// byte of it is the image's, so a field is empty when unknown, and Notes
// say what could not be read; an unknown guest is never a rejection.
type GuestReport struct {
	// PartitionTable is "gpt", "mbr", "none" (a filesystem on the whole
	// disk, or nothing recognised), or "unknown" when unreadable.
	PartitionTable string `json:"partitionTable"`
	// Filesystem is the whole disk's, when it has no partition table.
	Filesystem string           `json:"filesystem,omitempty"`
	Partitions []GuestPartition `json:"partitions,omitempty"`
	Firmware   GuestFirmware    `json:"firmware"`
	// OS is the operating system's own account of itself, when found.
	OS *GuestOS `json:"os,omitempty"`
	// Architecture is the CPU architecture the guest's boot files are
	// built for, as Go names it (amd64, arm64), when known.
	Architecture string `json:"architecture,omitempty"`
	// Packages are the installed packages' count, when a package
	// database was read.
	Packages *GuestPackages `json:"packages,omitempty"`
	// Kernels are the Linux kernels installed, newest first by version
	// name, or Windows', each with the virtio drivers it has.
	Kernels []GuestKernel `json:"kernels,omitempty"`
	// CloudInit: cloud-init is installed, so the VM reads its cloud-init
	// data (the SSH keys vm create passes) at boot.
	CloudInit bool `json:"cloudInit"`
	// Ignition: Ignition is installed (Fedora CoreOS, RHCOS, Flatcar),
	// which reads its own config, not cloud-init's data.
	Ignition bool `json:"ignition,omitempty"`
	// CloudbaseInit: cloudbase-init is installed (Windows), which reads
	// cloud-init's NoCloud data, SSH keys included.
	CloudbaseInit bool `json:"cloudbaseInit,omitempty"`
	// GuestAgent: qemu-guest-agent is installed.
	GuestAgent bool `json:"guestAgent"`
	// SerialConsole: grub's kernel command line has a serial console
	// (console=ttyS...), which vm console attaches to.
	SerialConsole bool `json:"serialConsole"`
	// Notes say what was found wrong or not read.
	Notes []string `json:"notes,omitempty"`
	// Boot is what the gate's boot check saw, when the provider runs one
	// (image-gate --boot-check).
	Boot *GuestBoot `json:"boot,omitempty"`
}

// GuestBoot is one boot of the disk under QEMU on a throwaway overlay,
// with no network and a NoCloud seed.
type GuestBoot struct {
	// Booted: the guest signalled on its serial console (cloud-init's
	// final message, a login prompt) or its guest agent answered, before
	// the deadline.
	Booted bool `json:"booted"`
	// Seconds is the time from QEMU's start to the signal, or to the end.
	Seconds float64 `json:"seconds"`
	// Firmware is bios or uefi; Accelerator kvm or tcg.
	Firmware    string `json:"firmware"`
	Accelerator string `json:"accelerator"`
	// Signal is the console line, or "guest agent", that said it booted.
	Signal string `json:"signal,omitempty"`
	// Reason says why a guest that did not boot was stopped.
	Reason string `json:"reason,omitempty"`
	// LastLines are the serial console's last lines, as the guest wrote
	// them (its bytes, bounded in number and length).
	LastLines []string `json:"lastLines,omitempty"`
}

// GuestPartition is one entry of the partition table.
type GuestPartition struct {
	Number int   `json:"number"`
	Start  int64 `json:"start"` // bytes
	Size   int64 `json:"size"`  // bytes
	// Role is what its type means to a boot: esp, bios-boot, lvm, linux,
	// swap, windows, extended, or empty.
	Role string `json:"role,omitempty"`
	// Filesystem is what its first bytes show: ext2, ext3, ext4, xfs,
	// btrfs, vfat, ntfs, lvm2-pv, swap, or empty.
	Filesystem string `json:"filesystem,omitempty"`
}

// GuestFirmware says which firmware can start the disk, KubeVirt's
// spec.domain.firmware.bootloader: bios, efi, or both.
type GuestFirmware struct {
	BIOS bool `json:"bios"`
	UEFI bool `json:"uefi"`
	// Loaders are the EFI loaders found at the removable-media paths.
	Loaders []string `json:"loaders,omitempty"`
	// SecureBoot: one of them carries an Authenticode signature (a
	// signed shim, Windows' boot manager), so the disk can start with
	// Secure Boot on if the firmware trusts the signer, which is not
	// checked. Without a signed loader it cannot.
	SecureBoot bool `json:"secureBoot,omitempty"`
	// Reasons say what each answer rests on.
	Reasons []string `json:"reasons,omitempty"`
}

// GuestOS is what the guest's os-release says.
type GuestOS struct {
	ID         string `json:"id,omitempty"`
	VersionID  string `json:"versionID,omitempty"`
	PrettyName string `json:"prettyName,omitempty"`
	// Partition is the number of the partition it was read from (0 for
	// the whole disk).
	Partition int `json:"partition"`
	// LogicalVolume is the LVM2 logical volume ("vg/lv") on that
	// partition it was read from, when it was.
	LogicalVolume string `json:"logicalVolume,omitempty"`
}

// GuestPackages counts the installed packages of one package manager.
type GuestPackages struct {
	Manager string `json:"manager"` // dpkg, rpm or apk
	Count   int    `json:"count"`
}

// GuestKernel is a Linux kernel installed in the guest, or Windows'
// (Version "windows").
type GuestKernel struct {
	Version string `json:"version"`
	// Virtio are the drivers of KubeVirt's virtio devices it has, built
	// in or as modules: virtio_blk, virtio_scsi, virtio_net; Windows'
	// installed virtio-win drivers: viostor, vioscsi, netkvm.
	Virtio []string `json:"virtio,omitempty"`
}

// Annotations image-syncer writes on a DataSource from the guest report of
// the gate's verdict on the image it serves, so that imagectl vm create,
// which reads DataSources and not verdicts, boots the disk as it must
// (internal/cdi's GuestFacts writes and reads them). An annotation that is
// absent means the fact is unknown; every value is the syncer's, and a
// tenant cannot write DataSources.
const (
	// AnnotationGuestFirmware is the firmware the disk boots with: "bios",
	// "efi", or "bios+efi".
	AnnotationGuestFirmware = "imagepipe.io/guest-firmware"
	// AnnotationGuestSecureBoot says whether the disk's EFI loader is
	// signed, so that it can start under Secure Boot: "signed" or
	// "unsigned"; absent when no EFI loader was found.
	AnnotationGuestSecureBoot = "imagepipe.io/guest-secure-boot"
	// AnnotationGuestVirtio lists the virtio devices the guest has drivers
	// for, comma-separated and sorted, of "block" (Linux virtio_blk,
	// Windows viostor), "net" (virtio_net, netkvm) and "scsi"
	// (virtio_scsi, vioscsi); "none" when drivers were looked for and none
	// found.
	AnnotationGuestVirtio = "imagepipe.io/guest-virtio"
	// AnnotationGuestOS is os-release's PRETTY_NAME, at most
	// MaxGuestOSName bytes of printable text; vm create copies it onto
	// the VM, where vm get shows it.
	AnnotationGuestOS = "imagepipe.io/guest-os"
	// AnnotationGuestOSID and AnnotationGuestOSVersion are os-release's
	// ID and VERSION_ID, as image-syncer's preference table reads them.
	AnnotationGuestOSID      = "imagepipe.io/guest-os-id"
	AnnotationGuestOSVersion = "imagepipe.io/guest-os-version"
	// AnnotationGuestInit is what configures the guest at its first boot:
	// "cloud-init", "cloudbase-init", "ignition" or "none"; absent when
	// the guest's system was not read.
	AnnotationGuestInit = "imagepipe.io/guest-init"
	// MaxGuestOSName bounds each OS annotation's value, in bytes.
	MaxGuestOSName = 128
)
