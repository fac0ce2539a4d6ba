package guest

import (
	"bytes"
	"debug/pe"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/internal/need"
)

// bootCode copies the first 440 bytes of a boot loader's MBR code, as
// its installer does, into disk.
func bootCode(t *testing.T, disk, code string) {
	t.Helper()
	b, err := os.ReadFile(code)
	if err != nil {
		t.Fatalf("%v (Debian's syslinux-common ships it)", err)
	}
	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b[:min(len(b), 440)], 0); err != nil {
		t.Fatal(err)
	}
}

func blankDisk(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.Truncate(createFile(t, p), size); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBootOfTheLoadersDisks: an MBR disk with syslinux's MBR code boots
// with BIOS only; a GPT disk with an ESP made by mkfs.fat and no boot
// code with UEFI only; a hybrid one (an ESP, a BIOS boot partition and
// syslinux's GPT MBR code) with both; a blank table with neither.
func TestBootOfTheLoadersDisks(t *testing.T) {
	const syslinux = "/usr/lib/syslinux/mbr/"

	mbr := blankDisk(t, 100*mib)
	cmd := exec.Command(need.Program(t, "sfdisk"), "-q", mbr)
	cmd.Stdin = strings.NewReader("label: dos\n,,83,*\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v\n%s", err, out)
	}
	if b := BootOf(probeFile(t, mbr)); b.BIOS || b.UEFI {
		t.Errorf("a table without boot code: %+v", b)
	}
	bootCode(t, mbr, syslinux+"mbr.bin")
	if b := BootOf(probeFile(t, mbr)); !b.BIOS || b.UEFI {
		t.Errorf("syslinux's MBR code: %+v; want BIOS only", b)
	}

	uefi := blankDisk(t, 200*mib)
	run(t, "sgdisk", "-n=1:0:+64M", "-t=1:EF00", "-n=2:0:0", "-t=2:8300", uefi)
	l := probeFile(t, uefi)
	if b := BootOf(l); b.BIOS || b.UEFI {
		t.Errorf("an ESP without a filesystem: %+v", b)
	}
	place(t, uefi, filesystem(t, FsFAT, 64*mib), l.Partitions[0].Start)
	if b := BootOf(probeFile(t, uefi)); b.BIOS || !b.UEFI {
		t.Errorf("an ESP with FAT, no boot code: %+v; want UEFI only", b)
	}

	hybrid := blankDisk(t, 200*mib)
	run(t, "sgdisk", "-n=1:0:+1M", "-t=1:EF02", "-n=2:0:+64M", "-t=2:EF00", "-n=3:0:0", "-t=3:8300", "-A=3:set:2", hybrid)
	l = probeFile(t, hybrid)
	place(t, hybrid, filesystem(t, FsFAT, 64*mib), l.Partitions[1].Start)
	bootCode(t, hybrid, syslinux+"gptmbr.bin")
	b := BootOf(probeFile(t, hybrid))
	if !b.BIOS || !b.UEFI || !slices.Contains(b.Reasons, "a BIOS boot partition") {
		t.Errorf("a hybrid disk: %+v; want both", b)
	}
}

// TestLoadersOnTheESP: systemd-boot's EFI binary, copied by mtools to the
// removable-media path of an ESP that mkfs.fat made as FAT12, FAT16 and
// FAT32, is found with its machine, amd64.
func TestLoadersOnTheESP(t *testing.T) {
	const sdboot = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
	if _, err := os.Stat(sdboot); err != nil {
		t.Fatalf("%v (Debian's systemd-boot-efi ships it)", err)
	}
	for _, tc := range []struct {
		fatBits string
		size    int64
	}{{"12", 4 * mib}, {"16", 64 * mib}, {"32", 260 * mib}} {
		t.Run("FAT"+tc.fatBits, func(t *testing.T) {
			esp := filepath.Join(t.TempDir(), "esp.img")
			if err := os.Truncate(createFile(t, esp), tc.size); err != nil {
				t.Fatal(err)
			}
			run(t, "mkfs.fat", "-F", tc.fatBits, esp)
			run(t, "mmd", "-i", esp, "::/EFI", "::/EFI/BOOT", "::/EFI/debian")
			run(t, "mcopy", "-i", esp, sdboot, "::/EFI/BOOT/BOOTX64.EFI")
			run(t, "mcopy", "-i", esp, "/etc/os-release", "::/EFI/debian/a-long-file-name.txt")
			disk := blankDisk(t, tc.size+2*mib)
			run(t, "sgdisk", "-n=1:0:0", "-t=1:EF00", disk)
			l := probeFile(t, disk)
			place(t, disk, esp, l.Partitions[0].Start)
			l = probeFile(t, disk)
			f, err := os.Open(disk)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got := Loaders(f, l)
			want := []Loader{{Partition: 1, Path: "/EFI/BOOT/BOOTX64.EFI", Arch: "amd64"}}
			if !slices.Equal(got, want) {
				t.Errorf("loaders %+v; want %+v (layout %+v)", got, want, l)
			}
			fat, err := openFAT(f, l.Partitions[0].Start, l.Partitions[0].Size)
			if err != nil {
				t.Fatal(err)
			}
			if fat.bits != map[string]int{"12": 12, "16": 16, "32": 32}[tc.fatBits] {
				t.Errorf("read as FAT%d", fat.bits)
			}
			wantText, _ := os.ReadFile("/etc/os-release")
			if b, err := fat.readHead("/efi/DEBIAN/A-LONG-FILE-NAME.TXT", 1<<20); err != nil || string(b) != string(wantText) {
				t.Errorf("a long name, any case: %q, %v", b, err)
			}
		})
	}
}

// TestASignedLoaderIsSeen: peSigned reads the certificate table from a
// loader's first 4 KiB as Go's debug/pe reads it from the whole file:
// Debian's systemd-boot, which is not signed, and the same binary with
// a certificate table named in its header (the data directory a signed
// shim fills).
func TestASignedLoaderIsSeen(t *testing.T) {
	const sdboot = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
	b, err := os.ReadFile(sdboot)
	if err != nil {
		t.Fatalf("%v (Debian's systemd-boot-efi ships it)", err)
	}
	signed := bytes.Clone(b)
	f, err := pe.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	oh, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok {
		t.Fatal("systemd-boot is not PE32+")
	}
	// The security directory is the 5th of the PE32+ optional header's
	// data directories, which start 112 bytes into it.
	dir := int(binary.LittleEndian.Uint32(b[0x3C:])) + 24 + 112 + 4*8
	binary.LittleEndian.PutUint32(signed[dir:], uint32(len(b)))
	binary.LittleEndian.PutUint32(signed[dir+4:], 0x800)
	for _, tc := range []struct {
		name string
		b    []byte
	}{{"systemd-boot", b}, {"with a certificate table", signed}} {
		f, err := pe.NewFile(bytes.NewReader(tc.b))
		if err != nil {
			t.Fatal(err)
		}
		d := f.OptionalHeader.(*pe.OptionalHeader64).DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY]
		want := d.VirtualAddress != 0 && d.Size != 0
		if got := peSigned(tc.b[:peHead]); got != want {
			t.Errorf("%s: signed %v, debug/pe says %v", tc.name, got, want)
		}
	}
	if oh.DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY].Size != 0 || !peSigned(signed[:peHead]) {
		t.Error("the test's two loaders are not one unsigned and one signed")
	}
}
