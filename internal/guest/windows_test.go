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

// TestInspectDetectsWindows: a GPT disk laid out as Windows Setup lays
// it (an ESP, a Microsoft reserved partition, an NTFS basic data
// partition mkntfs made) is Windows with its virtio drivers when the
// NTFS holds its kernel and drivers; else Windows, its drivers unknown,
// when the ESP holds Windows Boot Manager, and a BIOS disk when the NTFS boot code loads BOOTMGR; an
// NTFS partition alone (a data disk) is not. What is not read is a
// note. No Windows boot file can be had here: the ESP's boot manager is
// systemd-boot's EFI binary (an amd64 PE, as bootmgfw.efi is) at
// Microsoft's path, and the BIOS boot code is mkntfs's with Windows'
// "BOOTMGR is missing" message written into it.
func TestInspectDetectsWindows(t *testing.T) {
	const sdboot = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"
	ntfs := filesystem(t, FsNTFS, 64*mib)
	esp := filesystem(t, FsFAT, 64*mib)
	run(t, "mmd", "-i", esp, "::/EFI", "::/EFI/Microsoft", "::/EFI/Microsoft/Boot")
	run(t, "mcopy", "-i", esp, sdboot, "::/EFI/Microsoft/Boot/bootmgfw.efi")

	// Windows as Setup leaves it, as far as inspection looks: its kernel
	// and two of the virtio drivers, written by ntfs-3g (a FUSE mount:
	// the tests run as root).
	windows := filesystem(t, FsNTFS, 64*mib)
	mnt := t.TempDir()
	run(t, "ntfs-3g", windows, mnt)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = exec.Command("umount", mnt).Run()
		}
	})
	for _, f := range []string{"ntoskrnl.exe", "drivers/viostor.sys", "drivers/netkvm.sys", "drivers/disk.sys"} {
		write(t, mnt+"/Windows/System32/"+f, "MZ")
	}
	hive, err := os.ReadFile(softwareHive(t))
	if err != nil {
		t.Fatal(err)
	}
	write(t, mnt+"/Windows/System32/config/SOFTWARE", string(hive))
	write(t, mnt+"/"+cloudbaseInitConf, "[DEFAULT]\nusername=Admin\n")
	run(t, "umount", mnt)
	mounted = false
	installed := blankDisk(t, 200*mib)
	run(t, "sgdisk", "-n=1:0:+64M", "-t=1:EF00", "-n=2:0:+16M", "-t=2:0C01", "-n=3:0:+64M", "-t=3:0700", installed)
	place(t, installed, esp, probeFile(t, installed).Partitions[0].Start)
	place(t, installed, windows, probeFile(t, installed).Partitions[2].Start)

	uefi := blankDisk(t, 200*mib)
	run(t, "sgdisk", "-n=1:0:+64M", "-t=1:EF00", "-n=2:0:+16M", "-t=2:0C01", "-n=3:0:+64M", "-t=3:0700", uefi)
	l := probeFile(t, uefi)
	place(t, uefi, esp, l.Partitions[0].Start)
	place(t, uefi, ntfs, l.Partitions[2].Start)

	dataDisk := blankDisk(t, 100*mib)
	run(t, "sgdisk", "-n=1:0:+64M", "-t=1:0700", dataDisk)
	place(t, dataDisk, ntfs, probeFile(t, dataDisk).Partitions[0].Start)

	bootmgr := filesystem(t, FsNTFS, 64*mib)
	f, err := os.OpenFile(bootmgr, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("BOOTMGR is missing"), 0x180); err != nil {
		t.Fatal(err)
	}
	f.Close()
	bios := blankDisk(t, 100*mib)
	cmd := exec.Command(need.Program(t, "sfdisk"), "-q", bios)
	cmd.Stdin = strings.NewReader("label: dos\nstart=2048,size=131072,type=7,bootable\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v\n%s", err, out)
	}
	bootCode(t, bios, "/usr/lib/syslinux/mbr/mbr.bin")
	place(t, bios, bootmgr, probeFile(t, bios).Partitions[0].Start)

	for name, tc := range map[string]struct {
		disk    string
		windows bool
		part    int
		arch    string
	}{
		"installed": {installed, true, 3, "amd64"},
		"uefi":      {uefi, true, 3, "amd64"},
		"bios":      {bios, true, 1, ""},
		"data disk": {dataDisk, false, 0, ""},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := os.Open(tc.disk)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, _ := f.Stat()
			rep := Inspect(f, st.Size())
			detected := slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.HasPrefix(n, "Windows detected") })
			if !tc.windows {
				if rep.OS != nil || detected {
					t.Errorf("os %+v, notes %q; want none", rep.OS, rep.Notes)
				}
				return
			}
			if name == "installed" && (len(rep.Kernels) != 1 || rep.Kernels[0].Version != "windows" || !slices.Equal(rep.Kernels[0].Virtio, []string{"viostor", "netkvm"})) {
				t.Errorf("kernels %+v; want windows with viostor and netkvm", rep.Kernels)
			}
			if name != "installed" && (len(rep.Kernels) != 0 || rep.CloudbaseInit) {
				t.Errorf("kernels %+v; want none known", rep.Kernels)
			}
			if name == "installed" {
				if !rep.CloudbaseInit {
					t.Errorf("cloudbase-init, installed, not found")
				}
				if rep.OS == nil || rep.OS.ID != "windows" || rep.OS.VersionID != "10.0.22631" || rep.OS.PrettyName != "Windows 11 Pro 23H2" || rep.OS.Partition != 3 || rep.Architecture != "amd64" || len(rep.Notes) != 0 {
					t.Errorf("os %+v, arch %q, notes %q; want Windows 11 Pro 23H2 (10.0.22631) on partition 3, amd64, no notes", rep.OS, rep.Architecture, rep.Notes)
				}
				return
			}
			if rep.OS == nil || rep.OS.ID != "windows" || rep.OS.Partition != tc.part || rep.Architecture != tc.arch || !detected || len(rep.Notes) != 1 {
				t.Errorf("os %+v, arch %q, notes %q; want windows on partition %d, %q", rep.OS, rep.Architecture, rep.Notes, tc.part, tc.arch)
			}
		})
	}
}

// softwareHive is a registry hive holding what Windows 11 Pro 23H2
// writes in HKLM\SOFTWARE\Microsoft\Windows NT\CurrentVersion (its
// ProductName still "Windows 10 Pro"), written by hivex's hivexsh into a
// real hive: the NTUSER.DAT regparser's tests read, fetched with it
// through the Go module proxy.
func softwareHive(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "www.velocidex.com/golang/regparser").Output()
	if err != nil {
		t.Fatalf("go list -m www.velocidex.com/golang/regparser: %v", err)
	}
	base, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "testdata", "NTUSER.DAT"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "SOFTWARE")
	if err := os.WriteFile(p, base, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(need.Program(t, "hivexsh"), "-w", p)
	cmd.Stdin = strings.NewReader(`cd \
add Microsoft
cd Microsoft
add Windows NT
cd Windows NT
add CurrentVersion
cd CurrentVersion
setval 5
ProductName
string:Windows 10 Pro
DisplayVersion
string:23H2
CurrentBuild
string:22631
CurrentMajorVersionNumber
dword:0x0000000a
CurrentMinorVersionNumber
dword:0x00000000
commit
`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hivexsh: %v\n%s", err, out)
	}
	return p
}
