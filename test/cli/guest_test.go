package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// guestDisk makes, with the tools an installer uses, a 96 MiB GPT disk:
// syslinux's GPT MBR code, a FAT ESP holding systemd-boot as the
// removable-media loader (at 1 MiB), and an ext4 root holding Debian 12's
// os-release, this machine's dpkg database, a cloud kernel's module lists,
// cloud-init and a serial console on grub's command line (at 17 MiB).
func guestDisk(t *testing.T, dir string) string {
	t.Helper()
	esp := filepath.Join(dir, "esp.img")
	testenv.Run(t, "truncate", "-s", "16M", esp)
	testenv.Run(t, "mkfs.fat", "-F", "16", esp)
	testenv.Run(t, "mmd", "-i", esp, "::/EFI", "::/EFI/BOOT")
	testenv.Run(t, "mcopy", "-i", esp, "/usr/lib/systemd/boot/efi/systemd-bootx64.efi", "::/EFI/BOOT/BOOTX64.EFI")
	root := filepath.Join(dir, "root")
	for _, d := range []string{"usr/lib/modules/6.1.0-28-cloud-amd64", "usr/bin", "etc/default", "var/lib/dpkg"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	osRelease := "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\nID=debian\n"
	if err := os.WriteFile(filepath.Join(root, "usr/lib/os-release"), []byte(osRelease), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../usr/lib/os-release", filepath.Join(root, "etc/os-release")); err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, "cp", "/var/lib/dpkg/status", filepath.Join(root, "var/lib/dpkg/status"))
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"usr/lib/modules/6.1.0-28-cloud-amd64/modules.builtin": "kernel/drivers/block/virtio_blk.ko\nkernel/drivers/net/virtio_net.ko\n",
		"usr/lib/modules/6.1.0-28-cloud-amd64/modules.dep":     "kernel/drivers/scsi/virtio_scsi.ko.xz:\n",
		"usr/bin/cloud-init": "#!/usr/bin/python3\n",
		"etc/default/grub":   "GRUB_CMDLINE_LINUX=\"console=tty0 console=ttyS0,115200\"\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rootfs := filepath.Join(dir, "root.img")
	testenv.Run(t, "truncate", "-s", "64M", rootfs)
	testenv.Run(t, "mkfs.ext4", "-q", "-F", "-d", root, rootfs)
	disk := filepath.Join(dir, "disk.raw")
	testenv.Run(t, "truncate", "-s", "96M", disk)
	testenv.Run(t, "sgdisk", "-n=1:2048:+16M", "-t=1:EF00", "-n=2:34816:+64M", "-t=2:8304", disk)
	testenv.Run(t, "dd", "status=none", "conv=notrunc", "bs=440", "count=1", "if=/usr/lib/syslinux/mbr/gptmbr.bin", "of="+disk)
	testenv.Run(t, "dd", "status=none", "conv=notrunc,sparse", "bs=1M", "seek=1", "if="+esp, "of="+disk)
	testenv.Run(t, "dd", "status=none", "conv=notrunc,sparse", "bs=1M", "seek=17", "if="+rootfs, "of="+disk)
	return disk
}

// TestInspectShowsWhatADiskHolds: imagectl inspect of a disk, raw or as
// a compressed qcow2 qemu-img made, says what is inside, before any
// upload: the layout, both firmwares, the loader and its architecture,
// Debian 12, its packages, its kernel's virtio drivers, cloud-init and
// the serial console; a compressed raw image, read once as it
// streams, says its guest was not read.
func TestInspectShowsWhatADiskHolds(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	raw := guestDisk(t, dir)
	qcow2 := filepath.Join(dir, "disk.qcow2")
	testenv.Run(t, "qemu-img", "convert", "-q", "-c", "-f", "raw", "-O", "qcow2", raw, qcow2)
	for _, path := range []string{raw, qcow2} {
		code, out, stderr := testenv.Exit(t, testenv.Imagectl, "inspect", "-o", "json", path)
		var r api.ImageReport
		if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil {
			t.Fatalf("inspect %s: exit %d, %v\n%s%s", path, code, err, out, stderr)
		}
		g := r.Guest
		if g == nil || g.PartitionTable != "gpt" || len(g.Partitions) != 2 || g.Partitions[0].Role != "esp" || g.Partitions[1].Filesystem != "ext4" {
			t.Fatalf("%s: guest %+v", path, g)
		}
		if !g.Firmware.BIOS || !g.Firmware.UEFI || !slices.Equal(g.Firmware.Loaders, []string{"/EFI/BOOT/BOOTX64.EFI"}) || g.Architecture != "amd64" {
			t.Errorf("%s: firmware %+v, architecture %q", path, g.Firmware, g.Architecture)
		}
		if g.OS == nil || g.OS.ID != "debian" || g.OS.VersionID != "12" || g.Packages == nil || g.Packages.Manager != "dpkg" || g.Packages.Count < 100 {
			t.Errorf("%s: os %+v, packages %+v", path, g.OS, g.Packages)
		}
		if len(g.Kernels) != 1 || !slices.Equal(g.Kernels[0].Virtio, []string{"virtio_blk", "virtio_scsi", "virtio_net"}) || !g.CloudInit || g.GuestAgent || !g.SerialConsole {
			t.Errorf("%s: kernels %+v, cloud-init %v, guest agent %v, serial console %v", path, g.Kernels, g.CloudInit, g.GuestAgent, g.SerialConsole)
		}
	}
	code, out, _ := testenv.Exit(t, testenv.Imagectl, "inspect", qcow2)
	for _, want := range []string{"partition table:", "firmware:", "bios, uefi (/EFI/BOOT/BOOTX64.EFI)", "os:", "Debian GNU/Linux 12 (bookworm) (debian 12)", "packages:", "6.1.0-28-cloud-amd64 (virtio: virtio_blk, virtio_scsi, virtio_net)", "cloud-init:", "guest agent:"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("the table (exit %d) does not say %q:\n%s", code, want, out)
		}
	}

	testenv.Run(t, "zstd", "-q", "-k", raw, "-o", raw+".zst")
	code, out, _ = testenv.Exit(t, testenv.Imagectl, "inspect", "-o", "json", raw+".zst")
	var r api.ImageReport
	if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.Guest == nil || r.Guest.OS != nil || len(r.Guest.Notes) != 1 || !strings.Contains(r.Guest.Notes[0], "not read") {
		t.Errorf("a compressed raw image: exit %d, %v, guest %+v", code, err, r.Guest)
	}
}

// TestInspectWritesADisksSBOM: imagectl inspect FILE --sbom OUT writes,
// before any upload, the CycloneDX SBOM of the disk's guest: the disk
// (its SHA-256, of the raw bytes a qcow2 holds too) as its subject, Debian
// 12 as its OS and every package dpkg-query lists as installed; a raw
// image read as it streams has no guest to list, and no SBOM is written.
func TestInspectWritesADisksSBOM(t *testing.T) {
	testenv.RequireQEMU(t)
	dir := t.TempDir()
	raw := guestDisk(t, dir)
	installed := strings.Count(string(testenv.Run(t, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}\n")), "ii ")
	out := filepath.Join(dir, "sbom.json")
	code, _, stderr := testenv.Exit(t, testenv.Imagectl, "inspect", "--sbom", out, raw)
	if code != 0 {
		t.Fatalf("inspect --sbom: exit %d\n%s", code, stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat, SpecVersion string
		Metadata               struct {
			Component struct {
				Type, Name string
				Hashes     []struct{ Alg, Content string }
			}
		}
		Components []struct{ Type, Name, Version, Purl string }
	}
	if err := json.Unmarshal(b, &bom); err != nil || bom.BOMFormat != "CycloneDX" || bom.SpecVersion != "1.5" {
		t.Fatalf("the SBOM: %v\n%.300s", err, b)
	}
	sum := strings.Fields(string(testenv.Run(t, "sha256sum", raw)))[0]
	if c := bom.Metadata.Component; c.Type != "file" || c.Name != "disk.raw" || len(c.Hashes) != 1 || c.Hashes[0].Content != sum {
		t.Errorf("the SBOM's subject %+v; want disk.raw, sha256 %s", c, sum)
	}
	libs := 0
	for _, c := range bom.Components {
		switch c.Type {
		case "operating-system":
			if c.Name != "debian" || c.Version != "12" {
				t.Errorf("the OS component: %+v", c)
			}
		case "library":
			libs++
			if !strings.HasPrefix(c.Purl, "pkg:deb/debian/") || !strings.Contains(c.Purl, "distro=debian-12") {
				t.Errorf("%s: purl %s", c.Name, c.Purl)
			}
		}
	}
	if libs != installed {
		t.Errorf("the SBOM lists %d packages; dpkg-query says %d are installed", libs, installed)
	}

	testenv.Run(t, "zstd", "-q", "-k", raw, "-o", raw+".zst")
	streamed := filepath.Join(dir, "streamed.json")
	if code, _, stderr := testenv.Exit(t, testenv.Imagectl, "inspect", "--sbom", streamed, raw+".zst"); code == 0 || !strings.Contains(stderr, "--sbom") {
		t.Errorf("inspect --sbom of a streamed raw image: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(streamed); !os.IsNotExist(err) {
		t.Errorf("an SBOM was written for a guest not read (%v)", err)
	}
}
