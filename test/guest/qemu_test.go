package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/bootcheck"
	"github.com/imagepipe/imagepipe/internal/need"
)

// bootSignal is what test/guests.sh's small guests print on the serial
// console once their kernel has started init.
const bootSignal = "IMAGEPIPE-GUEST-BOOTED"

// guests is need.Guests.
func guests(t *testing.T) string { return need.Guests(t) }

// firmware is what a machine boots with.
type firmware string

const (
	bios firmware = "bios" // SeaBIOS, QEMU's default
	uefi firmware = "uefi" // OVMF, on a q35 machine
)

// ovmf are the OVMF code and variables templates of Debian's ovmf.
var ovmf = struct{ code, vars string }{bootcheck.DefaultOVMFCode, bootcheck.DefaultOVMFVars}

// machineSpec is one QEMU machine.
type machineSpec struct {
	disk     string   // a raw disk, the backing file of a throwaway qcow2 overlay
	seed     string   // a NoCloud ISO attached as a virtio disk, as KubeVirt attaches its cloudinitdisk
	firmware firmware // bios when empty
	uuid     string   // the SMBIOS system UUID, when set
	sshPort  int      // when not 0: 127.0.0.1:sshPort forwards to the guest's port 22
	memMiB   int
	accel    string // kvm or tcg
	// agent gives the guest the QEMU guest agent's virtio-serial port, as
	// virt-launcher gives every VM; machine.agent is its host end.
	agent bool
}

// machine is a QEMU process and its serial console.
type machine struct {
	cmd     *exec.Cmd
	console *console
	done    chan struct{} // closed once QEMU has exited
	err     error         // Wait's answer, read after done
	stderr  string        // the file QEMU's stderr goes to
	agent   string        // the guest agent's Unix socket, when spec.agent
	started time.Time
}

// boot starts QEMU on spec, no network but what the SSH forward allows
// (user networking restricted to it), QEMU's seccomp sandbox on, and kills
// its process group when the test ends.
func boot(t *testing.T, spec machineSpec) *machine {
	t.Helper()
	qemu := need.Program(t, "qemu-system-x86_64")
	need.Program(t, "qemu-img")
	dir := t.TempDir()
	overlay := filepath.Join(dir, "overlay.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", spec.disk, overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create overlay of %s: %v\n%s", spec.disk, err, out)
	}
	args := []string{
		"-nodefaults", "-display", "none", "-no-user-config", "-no-reboot",
		"-accel", spec.accel, "-m", strconv.Itoa(max(spec.memMiB, 256)),
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-chardev", "stdio,id=serial0,signal=off", "-serial", "chardev:serial0",
		"-drive", "file=" + overlay + ",format=qcow2,if=virtio",
	}
	if spec.firmware == uefi {
		if _, err := os.Stat(ovmf.code); err != nil {
			need.Missing(t, "OVMF is not installed (%s; make tools installs the Debian package ovmf)", ovmf.code)
		}
		vars := filepath.Join(dir, "OVMF_VARS.fd")
		data, err := os.ReadFile(ovmf.vars)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vars, data, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-machine", "q35",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmf.code,
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
	}
	if spec.seed != "" {
		args = append(args, "-drive", "file="+spec.seed+",format=raw,if=virtio,readonly=on")
	}
	if spec.uuid != "" {
		args = append(args, "-uuid", spec.uuid)
	}
	if spec.sshPort != 0 {
		args = append(args,
			"-netdev", fmt.Sprintf("user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:%d-:22", spec.sshPort),
			"-device", "virtio-net-pci,netdev=net0")
	}
	m := &machine{done: make(chan struct{}), stderr: filepath.Join(dir, "qemu.stderr")}
	if spec.agent {
		m.agent = filepath.Join(dir, "agent.sock")
		args = append(args, bootcheck.AgentArgs(m.agent)...)
	}
	cmd := exec.Command(qemu, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	m.cmd = cmd
	errFile, err := os.Create(m.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer errFile.Close() // QEMU has its own descriptor
	cmd.Stderr = errFile
	logFile, err := os.Create(filepath.Join(dir, "serial.log"))
	if err != nil {
		t.Fatal(err)
	}
	m.console = newConsole(logFile, time.Now())
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", qemu, err)
	}
	m.started = time.Now()
	t.Logf("started QEMU (%s, %s) pid %d: %s", spec.accel, cmp(spec.firmware, bios), cmd.Process.Pid, strings.Join(cmd.Args, " "))
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		m.console.read(stdout)
	}()
	go func() {
		<-readDone
		m.err = cmd.Wait()
		m.console.close()
		close(m.done)
	}()
	t.Cleanup(func() {
		if err := m.kill(); err != nil {
			t.Error(err)
		}
		logFile.Close()
		if t.Failed() {
			t.Logf("QEMU stderr: %s\nlast serial lines:\n%s", m.errors(), strings.Join(m.console.tail(40), "\n"))
		}
	})
	return m
}

// kill ends QEMU's process group and waits for QEMU.
func (m *machine) kill() error {
	_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-m.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("QEMU pid %d outlived SIGKILL", m.cmd.Process.Pid)
	}
}

// errors is what QEMU wrote on stderr so far.
func (m *machine) errors() string {
	data, _ := os.ReadFile(m.stderr)
	return strings.TrimSpace(string(data))
}

func cmp[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// exited reports whether QEMU has ended, and how.
func (m *machine) exited() (bool, error) {
	select {
	case <-m.done:
		return true, m.err
	default:
		return false, nil
	}
}

// console is a machine's serial output, line by line, kept in full and
// written to a log file; waiters are woken at each line.
type console struct {
	start   time.Time // lines in the log file carry the seconds since
	mu      sync.Mutex
	lines   []string
	at      []time.Duration // when each line ended, since start
	partial strings.Builder
	closed  bool
	changed chan struct{} // closed and replaced at each line and at the end
	log     io.Writer
}

func newConsole(log io.Writer, start time.Time) *console {
	return &console{changed: make(chan struct{}), log: log, start: start}
}

func (c *console) read(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			_, _ = fmt.Fprintf(c.log, "[%7.1fs] %s", time.Since(c.start).Seconds(), line)
			c.mu.Lock()
			c.partial.WriteString(line)
			if strings.HasSuffix(line, "\n") {
				c.lines = append(c.lines, strings.TrimRight(c.partial.String(), "\r\n"))
				c.at = append(c.at, time.Since(c.start))
				c.partial.Reset()
				close(c.changed)
				c.changed = make(chan struct{})
			}
			c.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

func (c *console) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.partial.Len() > 0 {
		c.lines = append(c.lines, c.partial.String())
		c.at = append(c.at, time.Since(c.start))
	}
	c.closed = true
	close(c.changed)
}

// tail returns the last n lines, each after the seconds since QEMU
// started.
func (c *console) tail(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for i := max(0, len(c.lines)-n); i < len(c.lines); i++ {
		out = append(out, fmt.Sprintf("[%7.1fs] %s", c.at[i].Seconds(), c.lines[i]))
	}
	return out
}

// last is the console's last line that is not blank, for a failure
// message: what the guest was doing when the test gave up.
func (c *console) last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(c.lines[i]); l != "" {
			return fmt.Sprintf("[%.1fs] %.200s", c.at[i].Seconds(), l)
		}
	}
	return "(nothing yet)"
}

// errConsoleClosed says QEMU ended before the console showed what was
// waited for.
var errConsoleClosed = errors.New("QEMU exited")

// waitFor waits until match holds for the lines so far, the console ends
// or ctx ends.
func (c *console) waitFor(ctx context.Context, match func(lines []string) bool) error {
	for {
		c.mu.Lock()
		ok, closed, changed := match(c.lines), c.closed, c.changed
		c.mu.Unlock()
		if ok {
			return nil
		}
		if closed {
			return errConsoleClosed
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitLine waits for a line holding s and returns it.
func (c *console) waitLine(ctx context.Context, s string) (string, error) {
	var found string
	err := c.waitFor(ctx, func(lines []string) bool {
		for _, l := range lines {
			if strings.Contains(l, s) {
				found = l
				return true
			}
		}
		return false
	})
	return found, err
}

var (
	accelOnce sync.Once
	accel     string
)

// accelerator is the accelerator that boots guests here, found once
// (bootcheck.Accelerator, probing with the small BIOS guest).
func accelerator(t *testing.T, dir string) string {
	t.Helper()
	accelOnce.Do(func() {
		accel = bootcheck.Accelerator(t.Context(), filepath.Join(dir, "bios.raw"), bootcheck.Options{
			Signals: []*regexp.Regexp{regexp.MustCompile(bootSignal)}, TempDir: t.TempDir(),
		})
		t.Logf("guests boot under %s here", accel)
	})
	return accel
}
