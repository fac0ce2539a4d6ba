package hub

import (
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestVMConsoleThroughTheAggregationLayer: imagectl vm console reaches a
// running VM's serial port through the real API server: its aggregation
// layer routes the APIService v1.subresources.kubevirt.io, its RBAC decides
// who may connect, and its front-proxy certificate vouches for the user to
// virt-api. Keys reach the VM, its output the terminal, and Ctrl+] ends the
// session without sending it. A tenant reaches neither another tenant's VM
// nor one that is not running.
//
// Played by this test (harness.VirtAPIConsole): virt-api and the VM's
// serial port, which echoes what it is sent.
func TestVMConsoleThroughTheAggregationLayer(t *testing.T) {
	t.Parallel()
	h := startTenantHub(t, "hub-console")
	virtAPI := h.StartVirtAPIConsole(t)
	web := h.createVM(t, "acme", "web", false)
	h.createVM(t, "acme", "stopped", true)
	pending := h.createVM(t, "acme", "pending", false)
	other := h.createVM(t, "globex", "db", false)
	virtController{t, h.c}.startInstance(web, "node-1", "10.0.0.5")
	virtController{t, h.c}.startInstance(other, "node-1", "10.0.0.6")
	vmi := virtController{t, h.c}.startInstance(pending, "node-1", "10.0.0.7")
	vmi.Status.Phase = kubevirtv1.Scheduling
	if err := h.c.Update(t.Context(), vmi); err != nil {
		t.Fatal(err)
	}

	console := func(kube []string, name, stdin string) testenv.Result {
		return testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: append([]string{"vm", "console", name}, kube...),
			Env: []string{"IMAGEPIPE_CACHE=" + t.TempDir()}, Stdin: stdin})
	}
	r := console(h.tenant, "web", "root\rnot sent\x1dnor this\r")
	if r.Code != 0 || r.Stdout != harness.ConsoleBanner+"root\rnot sent" || !strings.Contains(r.Stderr, "Ctrl+] leaves") {
		t.Errorf("vm console web: exit %d, stdout %q, stderr %q; want the banner, then the echo of what came before Ctrl+]", r.Code, r.Stdout, r.Stderr)
	}
	sessions := virtAPI.Sessions()
	if len(sessions) != 1 || sessions[0].User != "tenant-a" || sessions[0].Namespace != "acme" || sessions[0].VMI != "web" || sessions[0].Subprotocol != "plain.kubevirt.io" {
		t.Errorf("virt-api served %+v, want one plain.kubevirt.io session of tenant-a on acme/web", sessions)
	}

	// The end of input ends the session too.
	if r := console(h.tenant, "web", "ls\r"); r.Code != 0 || r.Stdout != harness.ConsoleBanner+"ls\r" {
		t.Errorf("vm console web with input that ends: exit %d, stdout %q", r.Code, r.Stdout)
	}
	refused := func(r testenv.Result, what, want string) {
		t.Helper()
		if r.Code == 0 || !strings.Contains(r.Stderr, want) {
			t.Errorf("%s: exit %d, want an error saying %q:\n%s", what, r.Code, want, r.Stderr)
		}
	}
	refused(console([]string{"--kubeconfig", h.UserKubeconfig(t, "tenant-a"), "-n", "globex"}, "db", "\x1d"), "another tenant's VM", "forbidden")
	refused(console(h.tenant, "pending", "\x1d"), "a VM whose instance is not running yet", `phase is "Scheduling" instead of Running`)
	refused(console(h.tenant, "stopped", "\x1d"), "a stopped VM", "VM acme/stopped is not running")
	refused(console(h.tenant, "nothing", "\x1d"), "a VM that does not exist", "no VM nothing in namespace acme")
	if n := len(virtAPI.Sessions()); n != 2 {
		t.Errorf("virt-api served %d sessions, want the 2 allowed", n)
	}
}
