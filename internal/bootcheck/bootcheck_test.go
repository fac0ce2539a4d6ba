package bootcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// smallSignal is what test/guests.sh's small guests print once booted,
// the firmware named in full: Boot matches a line still arriving too.
var smallSignal = regexp.MustCompile(`IMAGEPIPE-GUEST-BOOTED firmware=(bios|uefi)`)

// guests is the directory of the guests `make tools` builds
// (test/guests.sh), or the test skips, which CI counts as a failure.
func guests(t *testing.T) string {
	t.Helper()
	need.Program(t, "qemu-system-x86_64")
	if nobody() != nil {
		need.Program(t, "prlimit")
	}
	out, err := exec.Command("bash", filepath.Join("..", "..", "test", "guests.sh"), "--dir").Output()
	if err != nil {
		t.Fatalf("test/guests.sh --dir: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(dir, "versions")); err != nil {
		need.Missing(t, "the test guests are not built in %s: run make tools (test/guests.sh)", dir)
	}
	return dir
}

// nobody is QEMU's user when the test runs as root.
func nobody() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: 65534, Gid: 65534}
}

// tempDir is a TempDir that QEMU's user may reach.
func tempDir(t *testing.T) string {
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestGuestsBootWithTheFirmwareTheInspectionFound: each small guest boots
// with the firmware FirmwareFor picks from what the inspection would say,
// as an unprivileged QEMU; the guest's own word says which firmware it saw.
func TestGuestsBootWithTheFirmwareTheInspectionFound(t *testing.T) {
	dir := guests(t)
	for _, tc := range []struct {
		disk string
		fw   api.GuestFirmware
		want Firmware
	}{
		{"bios.raw", api.GuestFirmware{BIOS: true}, BIOS},
		{"uefi.raw", api.GuestFirmware{UEFI: true}, UEFI},
		{"hybrid.raw", api.GuestFirmware{BIOS: true, UEFI: true}, BIOS},
	} {
		t.Run(tc.disk, func(t *testing.T) {
			t.Parallel()
			fw, err := FirmwareFor(tc.fw)
			if err != nil || fw != tc.want {
				t.Fatalf("FirmwareFor(%+v) = %s, %v; want %s", tc.fw, fw, err, tc.want)
			}
			rep, err := Boot(t.Context(), filepath.Join(dir, tc.disk), Options{
				Firmware: fw, Signals: []*regexp.Regexp{smallSignal}, Credential: nobody(), TempDir: tempDir(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Booted || !strings.HasSuffix(rep.Signal, "firmware="+string(fw)) || rep.Firmware != fw {
				t.Fatalf("%s with %s: %+v; want booted, the guest saying %s", tc.disk, fw, rep, fw)
			}
			t.Logf("%s booted with %s (%s) in %s", tc.disk, fw, rep.Accel, rep.Elapsed.Round(100*time.Millisecond))
		})
	}
	// The accelerator found boots the probe, whichever it is.
	accel := Accelerator(t.Context(), filepath.Join(dir, "bios.raw"), Options{Signals: []*regexp.Regexp{smallSignal}, Credential: nobody(), TempDir: tempDir(t)})
	rep, err := Boot(t.Context(), filepath.Join(dir, "bios.raw"), Options{Accel: accel, Signals: []*regexp.Regexp{smallSignal}, Credential: nobody(), TempDir: tempDir(t)})
	if err != nil || !rep.Booted || rep.Accel != accel {
		t.Errorf("booting with the accelerator found, %s: %+v, %v", accel, rep, err)
	}
	if _, err := FirmwareFor(api.GuestFirmware{}); err != ErrNoFirmware {
		t.Errorf("FirmwareFor of a disk nothing boots: %v, want ErrNoFirmware", err)
	}
}

// TestAGuestThatDoesNotBootIsReported: a UEFI-only disk under SeaBIOS
// never signals; a guest past the serial or CPU bound is stopped. Each is
// a report, not an error, saying why.
func TestAGuestThatDoesNotBootIsReported(t *testing.T) {
	dir := guests(t)
	for _, tc := range []struct {
		name, disk string
		opts       Options
		reason     string
	}{
		{"no loader for the firmware", "uefi.raw", Options{Firmware: BIOS, Deadline: 20 * time.Second}, "no boot signal within 20s"},
		{"serial bound", "bios.raw", Options{Firmware: BIOS, MaxSerial: 8}, "serial output over 8 bytes"},
		{"CPU bound", "uefi.raw", Options{Firmware: UEFI, CPUTime: time.Second}, "CPU time was bounded at 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.opts.Signals, tc.opts.Credential, tc.opts.TempDir = []*regexp.Regexp{smallSignal}, nobody(), tempDir(t)
			rep, err := Boot(t.Context(), filepath.Join(dir, tc.disk), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Booted || !strings.Contains(rep.Reason, tc.reason) {
				t.Errorf("%s: %+v; want not booted: %s", tc.disk, rep, tc.reason)
			}
		})
	}
}

// TestADebianGuestSignalsByDefault: the Debian guest with cloud-init and
// a NoCloud seed says it booted in a way DefaultSignals know (a login
// prompt or cloud-init's final message) within the deadline, under TCG.
func TestADebianGuestSignalsByDefault(t *testing.T) {
	dir := guests(t)
	xorrisofs := need.Program(t, "xorrisofs")
	data := filepath.Join(t.TempDir(), "cidata")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"user-data": "#cloud-config\n", "meta-data": `{"instance-id":"bootcheck"}`} {
		if err := os.WriteFile(filepath.Join(data, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	seed := filepath.Join(filepath.Dir(data), "seed.iso")
	if out, err := exec.Command(xorrisofs, "-quiet", "-output", seed, "-volid", "cidata", "-joliet", "-rock", data).CombinedOutput(); err != nil {
		t.Fatalf("xorrisofs: %v\n%s", err, out)
	}
	rep, err := Boot(t.Context(), filepath.Join(dir, "debian.raw"), Options{
		Seed: seed, MemoryMiB: 1024, Deadline: 15 * time.Minute, Credential: nobody(), TempDir: tempDir(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Booted {
		t.Fatalf("the Debian guest did not signal: %s\n%s", rep.Reason, strings.Join(rep.LastLines, "\n"))
	}
	t.Logf("the Debian guest signalled %q after %s (%s)", rep.Signal, rep.Elapsed.Round(time.Second), rep.Accel)
}
