package bootcheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// smallSignal is what test/guests.sh's small guests print once booted,
// the firmware named in full: Boot matches a line still arriving too.
var smallSignal = regexp.MustCompile(`IMAGEPIPE-GUEST-BOOTED firmware=(bios|uefi)`)

// guests is the directory of the guests `make tools` builds, with QEMU.
func guests(t *testing.T) string {
	t.Helper()
	need.Program(t, "qemu-system-x86_64")
	return need.Guests(t)
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
				Firmware: fw, Signals: []*regexp.Regexp{smallSignal}, Credential: need.QEMUUser(t), TempDir: need.ReachableTempDir(t),
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
	accel := Accelerator(t.Context(), filepath.Join(dir, "bios.raw"), Options{Signals: []*regexp.Regexp{smallSignal}, Credential: need.QEMUUser(t), TempDir: need.ReachableTempDir(t)})
	rep, err := Boot(t.Context(), filepath.Join(dir, "bios.raw"), Options{Accel: accel, Signals: []*regexp.Regexp{smallSignal}, Credential: need.QEMUUser(t), TempDir: need.ReachableTempDir(t)})
	if err != nil || !rep.Booted || rep.Accel != accel {
		t.Errorf("booting with the accelerator found, %s: %+v, %v", accel, rep, err)
	}
	if _, err := FirmwareFor(api.GuestFirmware{}); err != ErrNoFirmware {
		t.Errorf("FirmwareFor of a disk nothing boots: %v, want ErrNoFirmware", err)
	}
}

// TestAGuestThatDoesNotBootIsReported: a UEFI-only disk under SeaBIOS
// never signals; a guest past the serial, CPU or overlay bound is stopped. Each is
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
		{"overlay bound", "bios.raw", Options{Firmware: BIOS, MaxOverlay: 64 << 10}, "Could not create temporary overlay"}, // its qcow2 header is larger
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.opts.Signals, tc.opts.Credential, tc.opts.TempDir = []*regexp.Regexp{smallSignal}, need.QEMUUser(t), need.ReachableTempDir(t)
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

// TestTheProbeBoots: the one-sector probe disk prints its signal under the
// accelerator Accelerator finds with it.
func TestTheProbeBoots(t *testing.T) {
	need.Program(t, "qemu-system-x86_64")
	probe := filepath.Join(need.ReachableTempDir(t), "probe.raw")
	f, err := os.Create(probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteProbe(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	opts := Options{Signals: []*regexp.Regexp{regexp.MustCompile(ProbeSignal)}, Credential: need.QEMUUser(t), TempDir: need.ReachableTempDir(t), Deadline: time.Minute}
	opts.Accel = Accelerator(t.Context(), probe, opts)
	rep, err := Boot(t.Context(), probe, opts)
	if err != nil || !rep.Booted || rep.Signal != ProbeSignal {
		t.Fatalf("booting the probe under %s: %+v, %v; want its signal", opts.Accel, rep, err)
	}
	t.Logf("the probe booted under %s in %s", rep.Accel, rep.Elapsed.Round(time.Millisecond))
}
