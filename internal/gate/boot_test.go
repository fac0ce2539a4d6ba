package gate

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/imagepipe/imagepipe/internal/bootcheck"
	"github.com/imagepipe/imagepipe/internal/containerdisk"
	"github.com/imagepipe/imagepipe/internal/convert"
	"github.com/imagepipe/imagepipe/internal/need"
	"github.com/imagepipe/imagepipe/internal/publish"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// smallGuestBooted is what test/guests.sh's small guests print once
// booted, with the firmware they saw.
var smallGuestBooted = regexp.MustCompile(`IMAGEPIPE-GUEST-BOOTED firmware=(bios|uefi)`)

// TestTheGateBootsWhatItVerifies: with a boot check, each disk whose guest
// was read is booted with the firmware the inspection found, from the
// verification's own copy, and the verdict says so: imagectl's qcow2 of
// the BIOS-only guest (verified as it streamed), another client's raw
// UEFI-only guest, and a disk no firmware starts, which is accepted and
// not booted. QEMU runs as nobody when the test runs as root.
func TestTheGateBootsWhatItVerifies(t *testing.T) {
	need.Program(t, "qemu-system-x86_64")
	dir := need.Guests(t)
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	e := newEnv(t)
	e.v.BootCheck = &BootCheck{Options: bootcheck.Options{
		Signals: []*regexp.Regexp{smallGuestBooted}, Deadline: 10 * time.Minute, Agent: true, Credential: need.QEMUUser(t),
	}}
	for _, tc := range []struct {
		name     string
		push     func(t *testing.T, repo string) string
		booted   bool
		firmware string
		reason   string
	}{
		{"imagectl-bios", func(t *testing.T, repo string) string {
			return e.importDisk(t, repo, read("bios.raw"), containerdisk.Options{DiskFormat: convert.FormatQCOW2, Compression: containerdisk.CompressionZstd}, publish.ImportOptions{})
		}, true, "bios", ""},
		{"raw-uefi", func(t *testing.T, repo string) string { return craftImage(t, read("uefi.raw")).push(t, e, repo) }, true, "uefi", ""},
		{"no-firmware", func(t *testing.T, repo string) string { return craftImage(t, rawDisk(t, 4<<20, 47)).push(t, e, repo) }, false, "", bootcheck.ErrNoFirmware.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.push(t, "acme/"+tc.name)
			v, err := e.v.Verify(t.Context(), mustDigest(t, e.host+"/acme/"+tc.name+"@"+d))
			if err != nil || v.Verdict != api.VerdictAccepted || len(v.Images) != 1 {
				t.Fatalf("%+v, %v; want accepted", v, err)
			}
			g := v.Images[0].Guest
			if g == nil || g.Boot == nil {
				t.Fatalf("the guest report %+v has no boot", g)
			}
			b := g.Boot
			if b.Booted != tc.booted || b.Firmware != tc.firmware || !strings.Contains(b.Reason, tc.reason) {
				t.Fatalf("the boot: %+v; want booted %v with %q, reason %q", b, tc.booted, tc.firmware, tc.reason)
			}
			if tc.booted && !strings.HasSuffix(b.Signal, "firmware="+tc.firmware) {
				t.Errorf("the guest said %q; want it to have seen %s", b.Signal, tc.firmware)
			}
			t.Logf("%s: booted %v in %.1fs under %s: %s%s", tc.name, b.Booted, b.Seconds, b.Accelerator, b.Signal, b.Reason)
		})
	}
}

// TestALayerReadBeforeTheBootCheckIsBootedWhenNamedAgain: a layer the gate
// read and kept before the boot check was on is read again, and booted,
// when a new manifest names it once the check is on; then it is kept
// with its boot and not read a third time.
func TestALayerReadBeforeTheBootCheckIsBootedWhenNamedAgain(t *testing.T) {
	need.Program(t, "qemu-system-x86_64")
	bios, err := os.ReadFile(filepath.Join(need.Guests(t), "bios.raw"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.v.Store = &Store{Dir: t.TempDir()}
	img := craftImage(t, bios)
	verify := func(repo string) *api.GuestReport {
		t.Helper()
		d := img.push(t, e, repo)
		v, err := e.v.Verify(t.Context(), mustDigest(t, e.host+"/"+repo+"@"+d))
		if err != nil || v.Verdict != api.VerdictAccepted || len(v.Images) != 1 || v.Images[0].Guest == nil {
			t.Fatalf("%+v, %v; want accepted with a guest report", v, err)
		}
		return v.Images[0].Guest
	}
	if g := verify("acme/before"); g.Boot != nil {
		t.Fatalf("booted without a boot check: %+v", g.Boot)
	}
	e.v.BootCheck = &BootCheck{Options: bootcheck.Options{
		Signals: []*regexp.Regexp{smallGuestBooted}, Deadline: 10 * time.Minute, Credential: need.QEMUUser(t),
	}}
	img.annotations = map[string]string{"org.example.rev": "2"} // another manifest, the same layer
	if g := verify("acme/after"); g.Boot == nil || !g.Boot.Booted {
		t.Fatalf("the layer named again with the boot check on: boot %+v; want booted", g.Boot)
	}
	img.annotations = map[string]string{"org.example.rev": "3"}
	e.v.BootCheck.Options.QEMU = "/nonexistent/qemu" // a third read would fail
	if g := verify("acme/again"); g.Boot == nil || !g.Boot.Booted {
		t.Fatalf("the kept record's boot: %+v", g.Boot)
	}
}

// TestAConsoleLineIsKeptBounded: a guest's console line goes into the
// verdict in at most maxBootLine bytes of valid UTF-8, however the guest
// wrote it.
func TestAConsoleLineIsKeptBounded(t *testing.T) {
	for _, line := range []string{strings.Repeat("é", 200), "\xff\xfeboot" + strings.Repeat("x", 1000), "login: "} {
		got := cut(line, maxBootLine)
		if len(got) > maxBootLine || !utf8.ValidString(got) || got == "" {
			t.Errorf("cut(%.20q...) = %.40q (%d bytes); want valid UTF-8 within %d", line, got, len(got), maxBootLine)
		}
	}
}
