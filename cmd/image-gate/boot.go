package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/imagepipe/imagepipe/internal/bootcheck"
	"github.com/imagepipe/imagepipe/internal/gate"
)

// bootFlags are the boot check's settings (gate.BootCheck).
type bootFlags struct {
	enabled    bool
	accel      string
	deadline   time.Duration
	memoryMiB  int
	user       string
	qemu       string
	maxOverlay int64
}

// Defaults of the boot check's flags.
const (
	defaultBootDeadline = 5 * time.Minute
	defaultBootMemory   = 1024 // MiB
	defaultBootOverlay  = 1 << 30
)

func (b *bootFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&b.enabled, "boot-check", false, "boot each disk whose guest was read under QEMU (on a throwaway overlay, with the firmware the inspection found, a NIC that reaches nothing, a NoCloud seed and the guest agent's port) and record in the verdict whether it signalled that it booted; hubs may import only images that did (image-syncer --require-boot). Needs qemu-system-x86_64, and OVMF for UEFI-only disks")
	f.StringVar(&b.accel, "boot-accel", "auto", "accelerator of the boot check: kvm, tcg, or auto (kvm when a probe boots under it at start, tcg otherwise)")
	f.DurationVar(&b.deadline, "boot-deadline", defaultBootDeadline, "time a guest has to signal that it booted; its QEMU's CPU time is bounded by the same")
	f.IntVar(&b.memoryMiB, "boot-memory", defaultBootMemory, "guest memory of the boot check, in MiB")
	f.StringVar(&b.user, "boot-user", "", "user QEMU runs as (default: nobody when the gate runs as root; the gate's own user otherwise)")
	f.StringVar(&b.qemu, "boot-qemu", "qemu-system-x86_64", "the QEMU the boot check runs")
	f.Int64Var(&b.maxOverlay, "boot-max-overlay", defaultBootOverlay, "bytes the guest's throwaway overlay may grow to (QEMU's RLIMIT_FSIZE): the guest's writes past them fail")
}

func (b *bootFlags) validate() error {
	if !b.enabled {
		return nil
	}
	var errs []error
	if b.accel != "auto" && b.accel != "kvm" && b.accel != "tcg" {
		errs = append(errs, fmt.Errorf("--boot-accel %q: want auto, kvm or tcg", b.accel))
	}
	if b.deadline < 10*time.Second || b.deadline > time.Hour {
		errs = append(errs, fmt.Errorf("--boot-deadline %s: want 10s to 1h", b.deadline))
	}
	if b.maxOverlay < 64<<20 {
		errs = append(errs, fmt.Errorf("--boot-max-overlay %d: want at least 64 MiB", b.maxOverlay))
	}
	if b.memoryMiB < 128 || b.memoryMiB > 16<<10 {
		errs = append(errs, fmt.Errorf("--boot-memory %d: want 128 to 16384 MiB", b.memoryMiB))
	}
	return errors.Join(errs...)
}

// args are the flags that carry the boot check to a verification child,
// with the accelerator resolved.
func (b *bootFlags) args() []string {
	if !b.enabled {
		return nil
	}
	args := []string{"--boot-check", "--boot-accel", b.accel, "--boot-deadline", b.deadline.String(),
		"--boot-memory", strconv.Itoa(b.memoryMiB), "--boot-qemu", b.qemu, "--boot-max-overlay", strconv.FormatInt(b.maxOverlay, 10)}
	if b.user != "" {
		args = append(args, "--boot-user", b.user)
	}
	return args
}

// credential is the user QEMU runs as: --boot-user, or nobody for a gate
// running as root; nil runs it as the gate's own user.
func (b *bootFlags) credential() (*syscall.Credential, error) {
	name := b.user
	if name == "" {
		if os.Geteuid() != 0 {
			return nil, nil
		}
		name = "nobody"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("--boot-user: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("--boot-user %s: %w", name, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("--boot-user %s is root: QEMU runs as an unprivileged user", name)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// check is the gate.BootCheck of a verification child, its overlays in
// tempDir; nil when the boot check is off.
func (b *bootFlags) check(tempDir string) (*gate.BootCheck, error) {
	if !b.enabled {
		return nil, nil
	}
	cred, err := b.credential()
	if err != nil {
		return nil, err
	}
	accel := b.accel
	if accel == "auto" {
		accel = "tcg" // the parent resolves auto; a child run by hand does not probe
	}
	return &gate.BootCheck{Options: bootcheck.Options{
		QEMU: b.qemu, Accel: accel, MemoryMiB: b.memoryMiB, Deadline: b.deadline,
		MaxOverlay: b.maxOverlay, Agent: true, Credential: cred, TempDir: bootTempDir(tempDir, cred),
	}}, nil
}

// bootTempDir is where QEMU's overlay goes: the gate's own folder, unless
// QEMU runs as another user, which may not enter it; then $TMPDIR.
func bootTempDir(gateDir string, cred *syscall.Credential) string {
	if cred != nil {
		return os.TempDir()
	}
	return gateDir
}

// prepare checks, when the boot check is on, that what it runs is there
// (so that a gate that cannot boot anything does not start, rather than
// failing every verification), and turns --boot-accel auto into kvm or
// tcg by booting the probe disk under KVM.
func (b *bootFlags) prepare(ctx context.Context, tempDir string) error {
	if !b.enabled {
		return nil
	}
	cred, err := b.credential()
	if err != nil {
		return err
	}
	if _, err := exec.LookPath(b.qemu); err != nil {
		return fmt.Errorf("--boot-check needs QEMU (--boot-qemu): %w", err)
	}
	if cred != nil {
		if _, err := exec.LookPath("prlimit"); err != nil {
			return fmt.Errorf("--boot-check runs QEMU as another user through util-linux's prlimit: %w", err)
		}
	}
	if b.accel != "auto" {
		return nil
	}
	dir, err := os.MkdirTemp(bootTempDir(tempDir, cred), "boot-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	probe := filepath.Join(dir, "probe.raw")
	f, err := os.Create(probe)
	if err != nil {
		return err
	}
	err = bootcheck.WriteProbe(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	b.accel = bootcheck.Accelerator(ctx, probe, bootcheck.Options{
		QEMU: b.qemu, Signals: []*regexp.Regexp{regexp.MustCompile(bootcheck.ProbeSignal)}, Credential: cred, TempDir: dir,
	})
	return nil
}
