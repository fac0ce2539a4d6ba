package guest

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestTheGateBootsTheDebianGuestATenantPushed: a tenant imports the Debian
// guest with imagectl into a registry whose image-gate runs with
// --boot-check; the gate verifies it, boots it from its own copy under
// QEMU (as nobody when the test runs as root, with the seed the gate
// writes) and signs a verdict saying it booted, which `imagectl inspect`
// shows the tenant. Everything is the shipped binaries'.
func TestTheGateBootsTheDebianGuestATenantPushed(t *testing.T) {
	dir := guests(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate,
		GateArgs: []string{"--boot-check", "--boot-deadline", bootDeadline.String()}})
	ref := reg.Host + "/acme/debian:12"
	testenv.RunImagectlOK(t, "import", "--quiet", filepath.Join(dir, "debian.raw"), ref)

	_, pub := harness.ProviderKeyFiles(t)
	var report api.ContainerDiskReport
	harness.WaitUntil(t, "the gate's verdict on "+ref, bootDeadline+2*time.Minute, 2*time.Second, func() (bool, error) {
		r := testenv.RunImagectlOK(t, "inspect", "--gate-keys", pub, "-o", "json", "docker://"+ref)
		if err := json.Unmarshal([]byte(r.Stdout), &report); err != nil {
			return false, err
		}
		return report.Gate != nil && report.Gate.Verdict != nil, nil
	})
	if report.Gate == nil || report.Gate.Verdict == nil || report.Gate.Verdict.Verdict != api.VerdictAccepted || len(report.Gate.Verdict.Images) != 1 {
		t.Fatalf("the gate's verdict: %+v; want accepted", report.Gate)
	}
	g := report.Gate.Verdict.Images[0].Guest
	if g == nil || g.Boot == nil {
		t.Fatalf("the verdict's guest %+v has no boot check", g)
	}
	if b := g.Boot; !b.Booted || b.Firmware != "bios" || b.Signal == "" {
		t.Fatalf("the boot check: %+v; want booted with bios\n%s", b, strings.Join(b.LastLines, "\n"))
	}
	t.Logf("the gate booted the Debian guest in %.0fs under %s: %q", g.Boot.Seconds, g.Boot.Accelerator, g.Boot.Signal)

	r := testenv.RunImagectlOK(t, "inspect", "--gate-keys", pub, "docker://"+ref)
	if !strings.Contains(r.Stdout, "boot check") || !strings.Contains(r.Stdout, "booted with bios") {
		t.Errorf("imagectl inspect does not show the boot check:\n%s", r.Stdout)
	}
}
