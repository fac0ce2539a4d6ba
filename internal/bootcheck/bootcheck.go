package bootcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Firmware is what QEMU starts the disk with.
type Firmware string

// The firmware QEMU offers: SeaBIOS (its default) and OVMF (UEFI, on a
// q35 machine).
const (
	BIOS Firmware = "bios"
	UEFI Firmware = "uefi"
)

// ErrNoFirmware says the inspection found no firmware that starts the disk.
var ErrNoFirmware = errors.New("the inspection found no firmware that starts the disk")

// FirmwareFor is the firmware to boot a disk with, from what the
// inspection found: BIOS when the disk boots with it (QEMU's default, as
// KubeVirt's), else UEFI.
func FirmwareFor(f api.GuestFirmware) (Firmware, error) {
	switch {
	case f.BIOS:
		return BIOS, nil
	case f.UEFI:
		return UEFI, nil
	}
	return "", ErrNoFirmware
}

// DefaultSignals are the serial console lines that say a guest booted:
// cloud-init's final message, or a getty's login prompt.
var DefaultSignals = []*regexp.Regexp{
	regexp.MustCompile(`Cloud-init v\. \S+ finished at`),
	regexp.MustCompile(`^\S+ login: `),
}

// Debian's ovmf package.
const (
	DefaultOVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	DefaultOVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// Defaults of Options.
const (
	DefaultMemoryMiB  = 512
	DefaultDeadline   = 5 * time.Minute
	DefaultMaxSerial  = 1 << 20
	DefaultMaxOverlay = 1 << 30
	DefaultLastLines  = 20
	// maxLine bounds one serial line kept; the rest of a longer line is
	// counted against MaxSerial and dropped.
	maxLine = 4096
)

// Options shape one boot. The zero value boots a raw disk with BIOS under
// TCG with the defaults above.
type Options struct {
	// QEMU is the qemu-system-x86_64 binary (default: the one on PATH).
	QEMU string
	// Format is the disk's format, raw (default) or qcow2.
	Format string
	// Firmware is BIOS (default) or UEFI (FirmwareFor).
	Firmware Firmware
	// OVMFCode and OVMFVars are the UEFI firmware and the template of its
	// variables, copied for each boot (default Debian's ovmf).
	OVMFCode, OVMFVars string
	// Seed is a NoCloud ISO attached as a second virtio disk, as KubeVirt
	// attaches a VM's cloudinitdisk.
	Seed string
	// Accel is kvm or tcg (default); Accelerator finds which works.
	Accel string
	// MemoryMiB is the guest's memory (default DefaultMemoryMiB).
	MemoryMiB int
	// Deadline bounds the boot in wall time (default DefaultDeadline);
	// CPUTime bounds QEMU's CPU time (RLIMIT_CPU; default the deadline).
	Deadline, CPUTime time.Duration
	// MaxSerial bounds the serial output read, in bytes (default
	// DefaultMaxSerial): past it, the guest is stopped, not booted.
	MaxSerial int64
	// Signals are the serial lines that say the guest booted (default
	// DefaultSignals).
	Signals []*regexp.Regexp
	// Credential, when set, is the unprivileged user QEMU runs as.
	Credential *syscall.Credential
	// TempDir holds the boot's overlay and firmware variables in a
	// directory of its own, removed at the end (default os.TempDir()); it
	// must be reachable by Credential's user.
	TempDir string
	// MaxOverlay bounds the size of the files QEMU writes, the overlay
	// above all (RLIMIT_FSIZE; default DefaultMaxOverlay): the guest's
	// writes past it fail, as I/O errors it sees.
	MaxOverlay int64
	// Agent gives the guest the QEMU guest agent's port, as KubeVirt
	// does; an answer to guest-sync is a boot signal too (AgentSignal).
	Agent bool
	// Logger receives progress (default: discard).
	Logger *slog.Logger
}

// AgentSignal is Report.Signal when the guest agent's answer said the
// guest booted.
const AgentSignal = "guest agent"

// Report is what one boot showed.
type Report struct {
	Booted   bool          `json:"booted"`
	Elapsed  time.Duration `json:"elapsed"` // to the signal, or to the end
	Firmware Firmware      `json:"firmware"`
	Accel    string        `json:"accel"`
	// Signal is the console line that said the guest booted.
	Signal string `json:"signal,omitempty"`
	// Reason says why a guest that did not boot stopped: the deadline,
	// the CPU or serial bound, or QEMU's exit.
	Reason string `json:"reason,omitempty"`
	// LastLines are the console's last lines (DefaultLastLines).
	LastLines []string `json:"lastLines,omitempty"`
	// PeakMemory is QEMU's peak resident memory, in bytes.
	PeakMemory int64 `json:"peakMemory,omitempty"`
}

// Boot boots disk under QEMU as opts says and reports whether the guest
// signalled that it booted. It fails only when QEMU cannot be run; a guest
// that does not boot is a Report with Booted false and its Reason.
func Boot(ctx context.Context, disk string, opts Options) (*Report, error) {
	f, err := os.Open(disk)
	if err != nil {
		return nil, fmt.Errorf("opening the disk: %w", err)
	}
	defer f.Close()
	return BootFile(ctx, f, opts)
}

// BootFile is Boot of the disk open as f, which QEMU only reads.
func BootFile(ctx context.Context, f *os.File, opts Options) (*Report, error) {
	o := withDefaults(opts)
	disk := f.Name()
	tmp, err := os.MkdirTemp(o.TempDir, "bootcheck-")
	if err != nil {
		return nil, fmt.Errorf("making the boot's directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	var args []string
	// QEMU reads the disk, the seed and OVMF through descriptors we
	// opened (its fd sets): a QEMU of another user needs no access to
	// their files or directories.
	var extra []*os.File
	fdset := func(f *os.File) string {
		extra = append(extra, f)
		n := len(extra)
		args = append(args, "-add-fd", fmt.Sprintf("fd=%d,set=%d", 2+n, n))
		return fmt.Sprintf("/dev/fdset/%d", n)
	}
	args = []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-accel", o.Accel, "-m", strconv.Itoa(o.MemoryMiB),
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-chardev", "stdio,id=serial0,signal=off", "-serial", "chardev:serial0",
		// A NIC with no route anywhere: QEMU's user network, restricted,
		// answers DHCP and nothing else. A guest without a NIC waits for
		// one (systemd-networkd-wait-online, two minutes) before
		// cloud-init's network stage.
		"-nic", "user,restrict=on,model=virtio-net-pci",
	}
	diskPath := fdset(f) // before args is read: fdset appends to it
	args = append(args, "-drive", "file="+diskPath+",format="+o.Format+",if=virtio,snapshot=on")
	if o.Seed != "" {
		seed, err := os.Open(o.Seed)
		if err != nil {
			return nil, fmt.Errorf("opening the seed: %w", err)
		}
		defer seed.Close()
		seedPath := fdset(seed)
		args = append(args, "-drive", "file="+seedPath+",format=raw,if=virtio,readonly=on")
	}
	if o.Firmware == UEFI {
		vars, err := copyVars(o.OVMFVars, filepath.Join(tmp, "OVMF_VARS.fd"), o.Credential)
		if err != nil {
			return nil, err
		}
		code, err := os.Open(o.OVMFCode)
		if err != nil {
			return nil, fmt.Errorf("opening OVMF: %w", err)
		}
		defer code.Close()
		codePath := fdset(code)
		args = append(args, "-machine", "q35",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+codePath,
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
	}
	agentSocket := ""
	if o.Agent {
		agentSocket = filepath.Join(tmp, "agent.sock")
		args = append(args, AgentArgs(agentSocket)...)
	}
	if o.Credential != nil {
		if err := os.Chown(tmp, int(o.Credential.Uid), int(o.Credential.Gid)); err != nil {
			return nil, fmt.Errorf("giving the boot's directory to QEMU's user: %w", err)
		}
	}

	cmd := exec.Command(o.QEMU, args...)
	if o.Credential != nil {
		// Bounding another user's process takes CAP_SYS_RESOURCE, which a
		// container may lack: util-linux's prlimit bounds itself, as QEMU's
		// user, and runs QEMU in its place (the same process).
		cpu := strconv.FormatUint(cpuSeconds(o.CPUTime), 10)
		fsize := strconv.FormatInt(o.MaxOverlay, 10)
		cmd = exec.Command("prlimit", append([]string{"--cpu=" + cpu + ":" + cpu, "--fsize=" + fsize + ":" + fsize, "--", o.QEMU}, args...)...)
	}
	cmd.ExtraFiles = extra
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp) // snapshot=on's overlay
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: o.Credential}
	stderr := &limitedBuffer{max: 64 << 10}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting QEMU: %w", err)
	}
	pgid := cmd.Process.Pid
	kill := func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
	defer kill()
	if o.Credential != nil {
		// bounded by prlimit
	} else if err := errors.Join(
		unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_CPU, &unix.Rlimit{Cur: cpuSeconds(o.CPUTime), Max: cpuSeconds(o.CPUTime)}, nil),
		unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: uint64(o.MaxOverlay), Max: uint64(o.MaxOverlay)}, nil),
	); err != nil {
		kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("bounding QEMU's CPU time and file size: %w", err)
	}
	o.Logger.Info("booting", "disk", disk, "firmware", o.Firmware, "accel", o.Accel)

	rep := &Report{Firmware: o.Firmware, Accel: o.Accel}
	lines := make(chan serialLine)
	readErr := make(chan error, 1)
	go func() { readErr <- readLines(stdout, o.MaxSerial, lines) }()
	timer := time.NewTimer(o.Deadline)
	defer timer.Stop()
	agentCtx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	agent := make(chan struct{})
	if agentSocket != "" {
		go func() {
			if WaitAgent(agentCtx, agentSocket) == nil {
				close(agent)
			}
		}()
	}
	var last []string
	keep := func(l string) {
		last = append(last, l)
		if len(last) > DefaultLastLines {
			last = last[1:]
		}
	}
	waited := false
	// stop kills QEMU, reads its console to the end and reaps it.
	stop := func() error {
		kill()
		for range lines {
		}
		rerr := <-readErr
		waited = true
		return errors.Join(rerr, cmd.Wait())
	}
	// ended says why QEMU ended by itself.
	ended := func(rerr error) string {
		if errors.Is(rerr, errSerialLimit) {
			kill()
			_ = cmd.Wait()
			waited = true
			return fmt.Sprintf("serial output over %d bytes", o.MaxSerial)
		}
		err := cmd.Wait()
		waited = true
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && (ws.Signal() == syscall.SIGKILL || ws.Signal() == syscall.SIGXCPU) {
				return fmt.Sprintf("QEMU was killed (%v): its CPU time was bounded at %s", ws.Signal(), o.CPUTime)
			}
		}
		msg := strings.TrimSpace(stderr.String())
		if err != nil {
			return fmt.Sprintf("QEMU exited (%v): %s", err, msg)
		}
		return strings.TrimSpace("the guest powered off or rebooted before it signalled " + msg)
	}
loop:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				rep.Reason = ended(<-readErr)
				break loop
			}
			if !l.partial {
				keep(l.text)
			}
			for _, re := range o.Signals {
				if re.MatchString(l.text) {
					if l.partial {
						keep(l.text)
					}
					rep.Booted, rep.Signal = true, l.text
					break loop
				}
			}
		case <-agent:
			rep.Booted, rep.Signal = true, AgentSignal
			break loop
		case <-timer.C:
			rep.Reason = "no boot signal within " + o.Deadline.String()
			break loop
		case <-ctx.Done():
			_ = stop()
			return nil, ctx.Err()
		}
	}
	rep.Elapsed = time.Since(start)
	rep.LastLines = last
	if !waited {
		_ = stop() // QEMU killed by us: its exit says nothing
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rep.PeakMemory = ru.Maxrss << 10 // KiB on Linux
	}
	o.Logger.Info("boot checked", "booted", rep.Booted, "elapsed", rep.Elapsed, "reason", rep.Reason)
	return rep, nil
}

// Accelerator is kvm when /dev/kvm opens and probe, a disk that boots
// quickly, signals under KVM within a minute as opts says; else tcg. A
// /dev/kvm that opens may still fail every guest (nested virtualisation
// that cannot emulate), which only a boot shows.
func Accelerator(ctx context.Context, probe string, opts Options) string {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	opts.Accel = "kvm"
	opts.Deadline = time.Minute
	rep, err := Boot(ctx, probe, opts)
	if err != nil || !rep.Booted {
		return "tcg"
	}
	return "kvm"
}

// ProbeSignal is what the probe disk prints on the serial port.
const ProbeSignal = "IMAGEPIPE-BOOT-PROBE"

// WriteProbe writes a 1 MiB raw disk whose BIOS boot code prints
// ProbeSignal on the first serial port and halts: a probe for
// Accelerator that needs no guest image. (SeaBIOS skips a disk of one
// sector.)
func WriteProbe(w io.Writer) error {
	code := []byte{
		0x31, 0xc0, // xor ax, ax
		0x8e, 0xd8, // mov ds, ax
		0xfc,             // cld
		0xba, 0xf8, 0x03, // mov dx, 0x3f8 (COM1)
		0xbe, 0x18, 0x7c, // mov si, 0x7c18 (the message below)
		0xac,       // next: lodsb
		0x84, 0xc0, // test al, al
		0x74, 0x03, // jz halt
		0xee,       // out dx, al
		0xeb, 0xf8, // jmp next
		0xf4,       // halt: hlt
		0xeb, 0xfd, // jmp halt
		0x90, 0x90, // to offset 0x18
	}
	sector := make([]byte, 1<<20)
	copy(sector, code)
	copy(sector[len(code):], ProbeSignal+"\r\n\x00")
	sector[510], sector[511] = 0x55, 0xaa
	_, err := w.Write(sector)
	return err
}

func withDefaults(o Options) Options {
	if o.QEMU == "" {
		o.QEMU = "qemu-system-x86_64"
	}
	if o.Format == "" {
		o.Format = "raw"
	}
	if o.Firmware == "" {
		o.Firmware = BIOS
	}
	if o.OVMFCode == "" {
		o.OVMFCode = DefaultOVMFCode
	}
	if o.OVMFVars == "" {
		o.OVMFVars = DefaultOVMFVars
	}
	if o.Accel == "" {
		o.Accel = "tcg"
	}
	if o.MemoryMiB <= 0 {
		o.MemoryMiB = DefaultMemoryMiB
	}
	if o.Deadline <= 0 {
		o.Deadline = DefaultDeadline
	}
	if o.CPUTime <= 0 {
		o.CPUTime = o.Deadline
	}
	if o.MaxOverlay <= 0 {
		o.MaxOverlay = DefaultMaxOverlay
	}
	if o.MaxSerial <= 0 {
		o.MaxSerial = DefaultMaxSerial
	}
	if o.Signals == nil {
		o.Signals = DefaultSignals
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func cpuSeconds(d time.Duration) uint64 { return uint64((d + time.Second - 1) / time.Second) }

// copyVars copies the OVMF variables template to a file QEMU writes.
func copyVars(from, to string, cred *syscall.Credential) (string, error) {
	data, err := os.ReadFile(from)
	if err != nil {
		return "", fmt.Errorf("reading OVMF's variables: %w", err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(to, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", err
		}
	}
	return to, nil
}

var errSerialLimit = errors.New("serial output over its limit")

// serialLine is a console line, or the start of one read so far (a login
// prompt waits without its line end).
type serialLine struct {
	text    string
	partial bool
}

// readLines sends r's lines without their line ends, each cut at maxLine,
// and after each read the unfinished line so far, until r ends or limit
// bytes were read; then it closes lines.
func readLines(r io.Reader, limit int64, lines chan<- serialLine) error {
	defer close(lines)
	var (
		line  []byte
		total int64
		buf   = make([]byte, 4096)
	)
	for {
		n, err := r.Read(buf)
		total += int64(n)
		chunk := buf[:n]
		if total > limit {
			chunk = chunk[:max(0, int64(n)-(total-limit))]
		}
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				line = append(line, chunk[:min(len(chunk), maxLine-len(line))]...)
				break
			}
			line = append(line, chunk[:min(i, maxLine-len(line))]...)
			lines <- serialLine{text: strings.TrimRight(string(line), "\r")}
			line, chunk = line[:0], chunk[i+1:]
		}
		if len(line) > 0 {
			lines <- serialLine{text: string(line), partial: true}
		}
		if total > limit {
			return errSerialLimit
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	b   strings.Builder
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return l.b.String() }
