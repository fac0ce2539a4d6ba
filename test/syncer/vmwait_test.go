package syncer

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestVMCreateWaitsUntilKubeVirtReportsReady: a tenant creates a VM from
// an image the syncer replicated with vm create --wait, which returns only
// once KubeVirt reports the VM Ready — here when the test, playing
// virt-controller and virt-handler, does — and prints where it runs; with
// nobody reporting, --timeout ends it with exit 1, naming what it waited
// for, saying KubeVirt reported nothing, and that the VM stays. Shell
// completion offers the synced image for --image.
func TestVMCreateWaitsUntilKubeVirtReportsReady(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	hub.BindTenant(t, "tenant-a", "acme")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")
	v1 := importImage(t, rawDisk(t, "bootable"), reg.Host+"/acme/rhel:9")
	hub.waitReady(t, "acme", "rhel--9", v1.Digest)

	kube := []string{"--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "acme"}
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: append(append([]string{"__complete", "vm", "create", "web"}, kube...), "--image", "acme/")})
	if r.Code != 0 || r.Stdout != "acme/rhel:9\n:4\n" {
		t.Errorf("completing --image acme/: exit %d, %q (%s); want the synced image", r.Code, r.Stdout, r.Stderr)
	}

	tmpl := filepath.Join(t.TempDir(), "simple_vm.yaml")
	if err := os.WriteFile(tmpl, []byte("id: simple_vm\ntitle: Simple VM\nparameters:\n  - {name: vm_memory, default: {value: 2Gi}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	create := func(name string, args ...string) []string {
		return append(append([]string{"vm", "create", name, "--image", "acme/rhel:9", "--template-file", tmpl}, args...), kube...)
	}

	// --wait tells each status KubeVirt reports, and returns when it
	// reports the VM Ready.
	var stdout strings.Builder
	stderr := &lockedBuffer{}
	cmd := exec.Command(testenv.Imagectl, create("web", "--wait", "--timeout", "3m")...)
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	var vm kubevirtv1.VirtualMachine
	waitFor(t, "vm create --wait to create VM web", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web"}, &vm)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	select {
	case err := <-exited:
		waited = true
		t.Fatalf("vm create --wait returned before KubeVirt reported anything: %v\n%s\n%s", err, stdout.String(), stderr.String())
	default:
	}
	virtControllerReportsStatus(t, hub, &vm, kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusStarting})
	waitFor(t, "vm create --wait to tell the status Starting", func() (bool, error) {
		return strings.Contains(stderr.String(), "VM web: Starting\n"), nil
	})
	virtControllerStartsInstance(t, hub, &vm)
	virtControllerReportsStatus(t, hub, &vm, harness.RunningVMStatus())
	err := <-exited
	waited = true
	if err != nil {
		t.Fatalf("vm create --wait: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "virtualmachine acme/web created from acme/rhel:9") ||
		!strings.HasSuffix(stdout.String(), "virtualmachine acme/web is Running on node node-1, IP 10.0.0.7\n") {
		t.Errorf("vm create --wait printed:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "waiting up to 3m0s for VM acme/web to be Ready (or its instance Running)") || !strings.Contains(stderr.String(), "VM web: Starting") {
		t.Errorf("vm create --wait told on stderr:\n%s", stderr.String())
	}

	// Nobody reports: the timeout says what it waited for, and the VM stays.
	r = testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: create("db", "--wait", "--timeout", "3s")})
	for _, want := range []string{"waiting for VM acme/db to be Ready (or its instance Running): timed out after 3s",
		"KubeVirt reported no status for it", "the VM was created and stays: imagectl vm get db -n acme"} {
		if r.Code != 1 || !strings.Contains(r.Stderr, want) {
			t.Errorf("vm create --wait --timeout 3s: exit %d, stderr %q; want 1 and %q", r.Code, r.Stderr, want)
		}
	}
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "db"}, &vm); err != nil {
		t.Errorf("the VM that timed out is gone: %v", err)
	}
}

// virtControllerReportsStatus plays virt-controller: it writes status
// as the VM's, through the status subresource.
func virtControllerReportsStatus(t *testing.T, h *testHub, vm *kubevirtv1.VirtualMachine, status kubevirtv1.VirtualMachineStatus) {
	t.Helper()
	if err := h.Client.Get(t.Context(), client.ObjectKeyFromObject(vm), vm); err != nil {
		t.Fatal(err)
	}
	vm.Status = status
	if err := h.Client.Status().Update(t.Context(), vm); err != nil {
		t.Fatalf("reporting VM %s status %s: %v", vm.Name, status.PrintableStatus, err)
	}
}

// lockedBuffer is a strings.Builder a running command writes to while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
