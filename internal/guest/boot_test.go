package guest

import (
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
