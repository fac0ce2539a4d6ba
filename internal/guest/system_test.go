package guest

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// TestSystemAsADebianCloudImageHasIt: a merged-/usr root (/lib a link to
// usr/lib) with two kernels, the newer with virtio_blk and virtio_net
// built in and virtio_scsi a compressed module, cloud-init,
// qemu-guest-agent and a serial console on grub's command line, made by
// mkfs.ext4 -d, reads as such; a root without them reads as without.
func TestSystemAsADebianCloudImageHasIt(t *testing.T) {
	full := openTree(t, func(root string) {
		symlink(t, "usr/lib", root+"/lib")
		k := root + "/usr/lib/modules/6.1.0-28-cloud-amd64/"
		write(t, k+"modules.builtin", "kernel/drivers/block/virtio_blk.ko\nkernel/drivers/net/virtio_net.ko\nkernel/fs/ext4/ext4.ko\n")
		write(t, k+"modules.dep", "kernel/drivers/scsi/virtio_scsi.ko.xz: kernel/drivers/scsi/scsi_mod.ko.xz\nkernel/drivers/scsi/scsi_mod.ko.xz:\n")
		write(t, root+"/usr/lib/modules/5.10.0-1-amd64/modules.dep", "kernel/drivers/net/e1000/e1000.ko:\n")
		write(t, root+"/usr/lib/modules/5.10.0-1-amd64/modules.builtin", "")
		write(t, root+"/usr/bin/cloud-init", "#!/usr/bin/python3\n")
		write(t, root+"/usr/sbin/qemu-ga", "\x7fELF")
		// init: this machine's own /bin/true, linked as Debian links it.
		self, err := os.ReadFile("/bin/true")
		if err != nil {
			t.Fatal(err)
		}
		write(t, root+"/usr/lib/systemd/systemd", string(self))
		symlink(t, "/lib/systemd/systemd", root+"/sbin/init")
		write(t, root+"/etc/default/grub", "GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX=\"console=tty0 console=ttyS0,115200 earlyprintk=ttyS0,115200\"\n")
	})
	var rep api.GuestReport
	if notes := readSystem(full, &rep); len(notes) != 0 {
		t.Errorf("notes: %q", notes)
	}
	want := []api.GuestKernel{{Version: "6.1.0-28-cloud-amd64", Virtio: []string{"virtio_blk", "virtio_scsi", "virtio_net"}}, {Version: "5.10.0-1-amd64"}}
	if !slices.EqualFunc(rep.Kernels, want, func(a, b api.GuestKernel) bool { return a.Version == b.Version && slices.Equal(a.Virtio, b.Virtio) }) {
		t.Errorf("kernels %+v; want %+v", rep.Kernels, want)
	}
	if !rep.CloudInit || !rep.GuestAgent || !rep.SerialConsole || rep.Ignition {
		t.Errorf("cloud-init %v, guest agent %v, serial console %v, ignition %v; want all but Ignition", rep.CloudInit, rep.GuestAgent, rep.SerialConsole, rep.Ignition)
	}
	if want := hostArch(t); rep.Architecture != want {
		t.Errorf("architecture %q; want %q, what debug/elf reads of the same init", rep.Architecture, want)
	}

	bare := openTree(t, func(root string) {
		write(t, root+"/etc/default/grub", "#GRUB_CMDLINE_LINUX=\"console=ttyS0\"\nGRUB_CMDLINE_LINUX=\"quiet\"\n")
		if err := os.MkdirAll(root+"/etc/cloud", 0o755); err != nil { // a directory is not cloud-init
			t.Fatal(err)
		}
		symlink(t, "/etc/cloud", root+"/usr/bin/cloud-init")
	})
	rep = api.GuestReport{}
	if notes := readSystem(bare, &rep); len(notes) != 0 || len(rep.Kernels) != 0 || rep.CloudInit || rep.GuestAgent || rep.SerialConsole {
		t.Errorf("a bare root: %+v, notes %q", rep, notes)
	}
}

// TestSystemNotesWhatItCannotRead: a /lib/modules that loops, module
// lists over their bound, and more kernels than are read are notes.
func TestSystemNotesWhatItCannotRead(t *testing.T) {
	loop := openTree(t, func(root string) {
		symlink(t, "modules", root+"/lib/modules")
	})
	var rep api.GuestReport
	if notes := readSystem(loop, &rep); len(notes) != 1 || !strings.Contains(notes[0], "symbolic links") {
		t.Errorf("a /lib/modules loop: notes %q", notes)
	}

	big := openTree(t, func(root string) {
		for i := range maxKernels + 2 {
			k := root + "/lib/modules/6." + string(rune('a'+i)) + "/"
			write(t, k+"modules.dep", "kernel/drivers/block/virtio_blk.ko:\n")
		}
		f, err := os.OpenFile(root+"/lib/modules/6.j/modules.builtin", os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(maxModuleList + 1); err != nil {
			t.Fatal(err)
		}
		f.Close()
	})
	rep = api.GuestReport{}
	notes := readSystem(big, &rep)
	if len(rep.Kernels) != maxKernels || rep.Kernels[0].Version != "6.j" || !slices.Equal(rep.Kernels[0].Virtio, []string{"virtio_blk"}) {
		t.Errorf("kernels %+v; want the %d newest, 6.j first with virtio_blk from modules.dep", rep.Kernels, maxKernels)
	}
	for _, want := range []string{"the 8 newest", "kernel 6.j: not all of its module lists read (modules.builtin"} {
		if !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, want) }) {
			t.Errorf("notes %q; want one saying %q", notes, want)
		}
	}
}

// hostArch is what debug/elf, an independent reader, says /bin/true is
// built for, named as Go names it.
func hostArch(t *testing.T) string {
	t.Helper()
	f, err := elf.Open("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}[f.Machine]
}

// TestSystemOfAnIgnitionGuest: a root as Fedora CoreOS ships it, with
// Ignition's dracut module and no cloud-init, reads as Ignition's; a
// script as init gives no architecture.
func TestSystemOfAnIgnitionGuest(t *testing.T) {
	fsys := openTree(t, func(root string) {
		write(t, root+"/usr/lib/dracut/modules.d/30ignition/ignition", "\x7fELF")
		write(t, root+"/sbin/init", "#!/bin/sh\n")
	})
	var rep api.GuestReport
	if notes := readSystem(fsys, &rep); len(notes) != 0 || !rep.Ignition || rep.CloudInit || rep.Architecture != "" {
		t.Errorf("%+v, notes %q; want Ignition, no cloud-init, no architecture", rep, notes)
	}
}

// TestELFMachineAsDebugELFReadsIt: elfMachine names the architectures
// debug/elf's constants name, in both byte orders, and nothing else.
func TestELFMachineAsDebugELFReadsIt(t *testing.T) {
	for _, tc := range []struct {
		m    elf.Machine
		data elf.Data
		want string
	}{
		{elf.EM_X86_64, elf.ELFDATA2LSB, "amd64"},
		{elf.EM_AARCH64, elf.ELFDATA2LSB, "arm64"},
		{elf.EM_RISCV, elf.ELFDATA2LSB, "riscv64"},
		{elf.EM_S390, elf.ELFDATA2MSB, "s390x"},
		{elf.EM_PPC64, elf.ELFDATA2LSB, "ppc64le"},
		{elf.EM_PPC64, elf.ELFDATA2MSB, "ppc64"},
		{elf.EM_MIPS, elf.ELFDATA2MSB, ""},
	} {
		b := make([]byte, elfHead)
		copy(b, elf.ELFMAG)
		b[elf.EI_DATA] = byte(tc.data)
		if tc.data == elf.ELFDATA2MSB {
			binary.BigEndian.PutUint16(b[18:], uint16(tc.m))
		} else {
			binary.LittleEndian.PutUint16(b[18:], uint16(tc.m))
		}
		if got := elfMachine(b); got != tc.want {
			t.Errorf("%v %v: %q, want %q", tc.m, tc.data, got, tc.want)
		}
	}
	if got := elfMachine([]byte("\x7fELF")); got != "" {
		t.Errorf("a short header: %q", got)
	}
}
