package guest

import (
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
	if !rep.CloudInit || !rep.GuestAgent || !rep.SerialConsole {
		t.Errorf("cloud-init %v, guest agent %v, serial console %v; want all", rep.CloudInit, rep.GuestAgent, rep.SerialConsole)
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
