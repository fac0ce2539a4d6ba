package guest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Bounds of what System reads.
const (
	// maxKernels bounds the kernels looked at, newest first by name.
	maxKernels = 8
	// maxDirSize bounds a directory listed, in bytes of its entries.
	maxDirSize = 1 << 20
	// maxModuleList bounds modules.builtin and modules.dep.
	maxModuleList = 8 << 20
	// maxBootConfig bounds /etc/default/grub and grub.cfg.
	maxBootConfig = 1 << 20
)

// virtioDrivers are the drivers a VM on KubeVirt's virtio devices needs:
// its disk (virtio_blk, or virtio_scsi behind a SCSI controller) and its
// network interface.
var virtioDrivers = []string{"virtio_blk", "virtio_scsi", "virtio_net"}

// readSystem fills rep from a Linux root filesystem: the kernels in
// /usr/lib/modules (/lib/modules through its link) and their virtio
// drivers (modules.builtin and modules.dep), whether cloud-init and
// qemu-guest-agent are installed, and whether the kernel command line in
// grub's configuration has a serial console (console=ttyS...). It returns
// notes on what it could not read.
func readSystem(fsys fs.FS, rep *api.GuestReport) []string {
	var notes []string
	versions, err := readDirNames(fsys, "/lib/modules")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		notes = append(notes, "kernel modules not listed: "+err.Error())
	}
	slices.SortFunc(versions, func(a, b string) int { return strings.Compare(b, a) })
	if len(versions) > maxKernels {
		notes = append(notes, fmt.Sprintf("%d kernels; the %d newest by name are read", len(versions), maxKernels))
		versions = versions[:maxKernels]
	}
	for _, v := range versions {
		k, note := readKernel(fsys, v)
		rep.Kernels = append(rep.Kernels, k)
		if note != "" {
			notes = append(notes, note)
		}
	}
	rep.CloudInit = anyFile(fsys, "/usr/bin/cloud-init", "/etc/cloud/cloud.cfg")
	// Ignition runs from the initramfs; the root holds its dracut module
	// (Fedora CoreOS, RHCOS) or its binary (Flatcar's /usr).
	rep.Ignition = anyFile(fsys, "/usr/lib/dracut/modules.d/30ignition/ignition", "/usr/lib/dracut/modules.d/30ignition/module-setup.sh", "/usr/bin/ignition")
	rep.GuestAgent = anyFile(fsys, "/usr/sbin/qemu-ga", "/usr/bin/qemu-ga")
	// The architecture the system runs is its init's; the EFI loader's,
	// found first, may be a shim of another.
	for _, init := range []string{"/sbin/init", "/usr/lib/systemd/systemd", "/bin/busybox"} {
		if head, err := ReadHead(fsys, init, elfHead); err == nil {
			if arch := elfMachine(head); arch != "" {
				rep.Architecture = arch
				break
			}
		}
	}
	for _, cfg := range []string{"/etc/default/grub", "/boot/grub/grub.cfg", "/boot/grub2/grub.cfg"} {
		b, err := ReadFile(fsys, cfg, maxBootConfig)
		if err == nil && hasSerialConsole(b) {
			rep.SerialConsole = true
			break
		}
	}
	return notes
}

// readKernel lists the virtio drivers of kernel version v.
func readKernel(fsys fs.FS, v string) (api.GuestKernel, string) {
	k := api.GuestKernel{Version: v}
	var notes []string
	have := map[string]bool{}
	for _, list := range []string{"modules.builtin", "modules.dep"} {
		b, err := ReadFile(fsys, path.Join("/lib/modules", v, list), maxModuleList)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			notes = append(notes, list+": "+err.Error())
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 0, 4096), 64<<10)
		for sc.Scan() {
			mod, _, _ := strings.Cut(sc.Text(), ":")
			name := path.Base(mod)
			name, _, _ = strings.Cut(name, ".ko")
			name = strings.ReplaceAll(name, "-", "_")
			if slices.Contains(virtioDrivers, name) {
				have[name] = true
			}
		}
	}
	for _, d := range virtioDrivers {
		if have[d] {
			k.Virtio = append(k.Virtio, d)
		}
	}
	if len(notes) > 0 {
		return k, fmt.Sprintf("kernel %s: not all of its module lists read (%s)", v, strings.Join(notes, "; "))
	}
	return k, ""
}

// hasSerialConsole reports a console=ttyS... on a kernel command line of
// a grub configuration.
func hasSerialConsole(b []byte) bool {
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		for f := range strings.FieldsFuncSeq(line, func(r rune) bool { return r == ' ' || r == '"' || r == '\'' || r == '\t' }) {
			if strings.HasPrefix(f, "console=ttyS") {
				return true
			}
		}
	}
	return false
}

// anyFile reports whether one of names is a regular file in the guest.
func anyFile(fsys fs.FS, names ...string) bool {
	for _, n := range names {
		if isRegular(fsys, n) {
			return true
		}
	}
	return false
}

// isRegular: a panic of the filesystem reader leaves ok false.
func isRegular(fsys fs.FS, name string) (ok bool) {
	var panicked error
	defer recoverAsError(&panicked)
	_, _, fi, err := lookup(fsys, name)
	return err == nil && fi.Mode().IsRegular()
}

// readDirNames lists the directory name (absolute in the guest, links
// followed as ReadFile does), refusing one over maxDirSize bytes.
func readDirNames(fsys fs.FS, name string) (names []string, err error) {
	defer recoverAsError(&err)
	lfs, resolved, fi, err := lookup(fsys, name)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", name)
	}
	if fi.Size() > maxDirSize {
		return nil, fmt.Errorf("%s: a directory of %d bytes: %w (%d)", name, fi.Size(), ErrTooLarge, maxDirSize)
	}
	entries, err := fs.ReadDir(lfs, resolved)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// elfHead is what elfMachine reads of an ELF file.
const elfHead = 20

// elfMachine is the CPU architecture, as Go names it, of the ELF file
// whose first bytes are b, or "" when b is not one or names another.
func elfMachine(b []byte) string {
	if len(b) < elfHead || string(b[:4]) != "\x7fELF" {
		return ""
	}
	var order binary.ByteOrder = binary.LittleEndian
	if b[5] == 2 { // EI_DATA: big-endian
		order = binary.BigEndian
	}
	switch m := order.Uint16(b[18:]); {
	case m == 0x3E:
		return "amd64"
	case m == 0xB7:
		return "arm64"
	case m == 0x03:
		return "386"
	case m == 0x28:
		return "arm"
	case m == 0xF3:
		return "riscv64"
	case m == 0x16:
		return "s390x"
	case m == 0x15 && b[5] == 1:
		return "ppc64le"
	case m == 0x15:
		return "ppc64"
	}
	return ""
}
