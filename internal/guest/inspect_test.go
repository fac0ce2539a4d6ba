package guest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// debianGuest builds, with the tools a distribution's installer uses, a
// 96 MiB GPT disk: syslinux's GPT MBR code, a FAT ESP holding
// systemd-boot as the removable-media loader, and an ext4 root holding
// Debian's os-release and this machine's dpkg database. It returns the
// disk's path and how many packages dpkg-query says are installed.
func debianGuest(t *testing.T) (string, int) {
	t.Helper()
	const sdboot = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
	esp := filepath.Join(t.TempDir(), "esp.img")
	if err := os.Truncate(createFile(t, esp), 16*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.fat", "-F", "16", esp)
	run(t, "mmd", "-i", esp, "::/EFI", "::/EFI/BOOT")
	run(t, "mcopy", "-i", esp, sdboot, "::/EFI/BOOT/BOOTX64.EFI")
	status, err := os.ReadFile("/var/lib/dpkg/status")
	if err != nil {
		t.Fatalf("%v (the tests run on Debian)", err)
	}
	root := t.TempDir()
	write(t, root+"/usr/lib/os-release", debian)
	symlink(t, "../usr/lib/os-release", root+"/etc/os-release")
	write(t, root+"/var/lib/dpkg/status", string(status))
	rootfs := filepath.Join(t.TempDir(), "root.img")
	if err := os.Truncate(createFile(t, rootfs), 64*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", "-d", root, rootfs)

	disk := blankDisk(t, 96*mib)
	run(t, "sgdisk", "-n=1:0:+16M", "-t=1:EF00", "-n=2:0:+64M", "-t=2:8304", disk)
	bootCode(t, disk, "/usr/lib/syslinux/mbr/gptmbr.bin")
	l := probeFile(t, disk)
	place(t, disk, esp, l.Partitions[0].Start)
	place(t, disk, rootfs, l.Partitions[1].Start)

	out, err := exec.Command(need.Program(t, "dpkg-query"), "-W", "-f", "${db:Status-Abbrev}\n").Output()
	if err != nil {
		t.Fatal(err)
	}
	installed := 0
	for _, s := range strings.Fields(string(out)) {
		if s == "ii" {
			installed++
		}
	}
	return disk, installed
}

// TestInspectAGuestAsItsToolsMadeIt: Inspect of a disk made by sgdisk,
// mkfs.fat, mtools and mkfs.ext4 says what they made: a GPT, the ESP and
// the root, both firmwares (syslinux's MBR code and the ESP), the amd64
// loader, Debian 12 on partition 2, and as many packages as dpkg-query.
func TestInspectAGuestAsItsToolsMadeIt(t *testing.T) {
	disk, installed := debianGuest(t)
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep := Inspect(f, 96*mib)
	if rep.PartitionTable != TableGPT || len(rep.Partitions) != 2 ||
		rep.Partitions[0].Role != RoleESP || rep.Partitions[0].Filesystem != FsFAT ||
		rep.Partitions[1].Role != RoleLinux || rep.Partitions[1].Filesystem != FsExt4 {
		t.Errorf("layout %+v", rep)
	}
	if !rep.Firmware.BIOS || !rep.Firmware.UEFI || !slices.Equal(rep.Firmware.Loaders, []string{"/EFI/BOOT/BOOTX64.EFI"}) || rep.Architecture != "amd64" {
		t.Errorf("firmware %+v, architecture %q; want BIOS and UEFI, BOOTX64.EFI, amd64", rep.Firmware, rep.Architecture)
	}
	if rep.OS == nil || rep.OS.ID != "debian" || rep.OS.VersionID != "12" || rep.OS.Partition != 2 {
		t.Errorf("os %+v; want debian 12 on partition 2", rep.OS)
	}
	if rep.Packages == nil || rep.Packages.Manager != "dpkg" || rep.Packages.Count != installed || installed < 100 {
		t.Errorf("packages %+v; dpkg-query lists %d installed", rep.Packages, installed)
	}
	if len(rep.Notes) != 0 {
		t.Errorf("notes on a disk it reads whole: %q", rep.Notes)
	}
}

// TestInspectNotesWhatItCannotRead: a disk of zeros, a filesystem it has
// no reader for and a root whose os-release is a loop are notes, never a
// failure; the guest is then unknown, not refused.
func TestInspectNotesWhatItCannotRead(t *testing.T) {
	zeros := blankDisk(t, 4*mib)
	btrfs := filesystem(t, FsBtrfs, 128*mib)
	loop := filepath.Join(t.TempDir(), "loop.img")
	root := t.TempDir()
	symlink(t, "os-release", root+"/etc/os-release")
	if err := os.Truncate(createFile(t, loop), 16*mib); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", "-d", root, loop)
	for name, tc := range map[string]struct {
		path string
		note string
	}{
		"zeros":              {zeros, "no operating system found"},
		"btrfs":              {btrfs, "no reader for \"btrfs\""},
		"an os-release loop": {loop, "os-release not read"},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := os.Open(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, _ := f.Stat()
			rep := Inspect(f, st.Size())
			if rep.OS != nil || !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, tc.note) }) {
				t.Errorf("os %+v, notes %q; want none and a note saying %q", rep.OS, rep.Notes, tc.note)
			}
		})
	}
}

// TestReportsStayWithinTheirBounds: a report of many partitions, many
// notes and long ones is cut to its bounds, saying so (200 notes and the
// one on partitions left out: 186 not kept).
func TestReportsStayWithinTheirBounds(t *testing.T) {
	rep := &api.GuestReport{}
	for i := range 200 {
		rep.Partitions = append(rep.Partitions, api.GuestPartition{Number: i + 1})
		rep.Notes = append(rep.Notes, strings.Repeat("é", 400))
	}
	bound(rep)
	if len(rep.Partitions) != maxReportPartitions || len(rep.Notes) != maxNotes || rep.Notes[maxNotes-1] != "186 more notes" {
		t.Errorf("%d partitions, %d notes, last %q", len(rep.Partitions), len(rep.Notes), rep.Notes[len(rep.Notes)-1])
	}
	for _, n := range rep.Notes {
		if len(n) > maxNoteLength+len("…") || !utf8.ValidString(n) {
			t.Errorf("a note of %d bytes, valid UTF-8 %v", len(n), utf8.ValidString(n))
		}
	}
}
