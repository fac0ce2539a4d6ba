package hub

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestVMListAcrossNamespacesAsKubectlDoes: vm list -A lists the VMs of
// every namespace with a NAMESPACE column, each with its own instance
// (two VMs of one name in two namespaces are not mixed up), and ignores
// -n as kubectl does; a tenant, who may list VMs only in its namespace, is
// told to drop -A.
func TestVMListAcrossNamespacesAsKubectlDoes(t *testing.T) {
	t.Parallel()
	h := startTenantHub(t, "hub-list")
	h.createVM(t, "acme", "web", false)
	web := h.createVM(t, "globex", "web", false)
	h.createVM(t, "globex", "db", true)
	virtController{t, h.c}.startInstance(web, "node-2", "10.0.0.9")

	var all []api.VMSummary
	out := testenv.RunImagectlOK(t, append([]string{"vm", "list", "-A", "-o", "json"}, h.admin...)...).Stdout
	if err := json.Unmarshal([]byte(out), &all); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range all {
		got = append(got, s.Namespace+"/"+s.Name+"@"+s.Node)
	}
	if want := []string{"acme/web@", "globex/db@", "globex/web@node-2"}; !slices.Equal(got, want) {
		t.Errorf("vm list -A -o json: %v, want %v (namespace/name@node)", got, want)
	}

	table := testenv.RunImagectlOK(t, append([]string{"vm", "list", "--all-namespaces", "-n", "acme"}, h.admin...)...).Stdout
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "NAMESPACE ") || !strings.HasPrefix(lines[1], "acme ") ||
		!strings.Contains(lines[3], "10.0.0.9") || !strings.HasPrefix(lines[3], "globex ") {
		t.Errorf("vm list --all-namespaces -n acme (kubectl ignores -n with -A):\n%s", table)
	}
	one := testenv.RunImagectlOK(t, append([]string{"vm", "list", "-n", "globex"}, h.admin...)...).Stdout
	if strings.Contains(one, "NAMESPACE") || strings.Contains(one, "acme") || strings.Count(one, "\n") != 3 {
		t.Errorf("vm list -n globex:\n%s", one)
	}

	r := testenv.RunImagectl(t, append([]string{"vm", "list", "-A"}, h.tenant...)...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "forbidden") || !strings.Contains(r.Stderr, "drop -A and name one with -n") || r.Stdout != "" {
		t.Errorf("tenant vm list -A: exit %d, stdout %q, stderr %q; want 1, nothing, and the advice to drop -A", r.Code, r.Stdout, r.Stderr)
	}
	if r := testenv.RunImagectlOK(t, append([]string{"vm", "list"}, h.tenant...)...); !strings.Contains(r.Stdout, "web") || strings.Contains(r.Stdout, "db") {
		t.Errorf("tenant vm list in acme:\n%s", r.Stdout)
	}
}

// TestVolumeDeleteRefusesAVolumeAVMUses: a tenant deletes its data
// volumes; one a VM still lists, by DataVolume or by claim, is refused
// naming every such VM and the detach command, unless --force; a
// DataVolume imagectl did not make (an import's) is refused even with
// --force, and a missing one is named.
func TestVolumeDeleteRefusesAVolumeAVMUses(t *testing.T) {
	t.Parallel()
	h := startTenantHub(t, "hub-volumes")
	tenant := func(args ...string) []string { return append(args, h.tenant...) }
	for _, v := range []string{"data1", "data2"} {
		testenv.RunImagectlOK(t, tenant("volume", "create", v, "--size", "1Gi")...)
	}
	h.createVM(t, "acme", "web", false)
	testenv.RunImagectlOK(t, tenant("vm", "attach-volume", "web", "data1")...)
	// A VM made elsewhere that mounts the volume's claim directly.
	legacy := h.createVM(t, "acme", "legacy", true)
	before := legacy.DeepCopy()
	legacy.Spec.Template.Spec.Volumes = append(legacy.Spec.Template.Spec.Volumes, kubevirtv1.Volume{Name: "data", VolumeSource: kubevirtv1.VolumeSource{
		PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data1"}},
	}})
	legacy.Spec.Template.Spec.Domain.Devices.Disks = append(legacy.Spec.Template.Spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: "data"})
	if err := h.kc.MergePatch(t.Context(), before, legacy); err != nil {
		t.Fatal(err)
	}
	// image-syncer's import of an image: a DataVolume without imagectl's label.
	imported := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "rhel--0123456789ab", Namespace: "acme"},
		Spec:       cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, Storage: &cdiv1.StorageSpec{}},
	}
	if err := h.c.Create(t.Context(), imported); err != nil {
		t.Fatal(err)
	}

	r := testenv.RunImagectl(t, tenant("volume", "delete", "data1")...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "volume acme/data1 is attached to VM legacy, web") ||
		!strings.Contains(r.Stderr, "imagectl vm detach-volume legacy data1") || !strings.Contains(r.Stderr, "--force") {
		t.Errorf("deleting a volume two VMs use: exit %d\n%s", r.Code, r.Stderr)
	}
	if h.dataVolumeGone(t, "acme", "data1") {
		t.Fatal("the refused deletion deleted data1")
	}
	if r := testenv.RunImagectlOK(t, tenant("volume", "delete", "data2")...); r.Stdout != "volume acme/data2 deleted\n" {
		t.Errorf("volume delete data2 printed %q", r.Stdout)
	}
	if !h.dataVolumeGone(t, "acme", "data2") {
		t.Error("data2 was not deleted")
	}
	if r := testenv.RunImagectl(t, tenant("volume", "delete", "data2")...); r.Code != 1 || !strings.Contains(r.Stderr, "no volume data2 in namespace acme") {
		t.Errorf("deleting a volume that is gone: exit %d\n%s", r.Code, r.Stderr)
	}
	for _, bad := range []string{"../data1", "Data1", "data1/x"} {
		if r := testenv.RunImagectl(t, tenant("volume", "delete", bad, "--force")...); r.Code != 1 || !strings.Contains(r.Stderr, "is not a valid name") {
			t.Errorf("volume delete %q: exit %d\n%s", bad, r.Code, r.Stderr)
		}
	}
	r = testenv.RunImagectl(t, tenant("volume", "delete", imported.Name, "--force")...)
	if r.Code != 1 || !strings.Contains(r.Stderr, "not a data volume made by imagectl volume create") || h.dataVolumeGone(t, "acme", imported.Name) {
		t.Errorf("deleting an import's DataVolume: exit %d\n%s", r.Code, r.Stderr)
	}
	// Another tenant's namespace is not reachable.
	if r := testenv.RunImagectl(t, "volume", "delete", "data1", "--kubeconfig", h.UserKubeconfig(t, "tenant-a"), "-n", "globex"); r.Code != 1 || !strings.Contains(r.Stderr, "forbidden") {
		t.Errorf("deleting in globex: exit %d\n%s", r.Code, r.Stderr)
	}

	r = testenv.RunImagectlOK(t, tenant("volume", "delete", "data1", "--force")...)
	if !strings.Contains(r.Stderr, "VM legacy, web still lists volume data1") || !h.dataVolumeGone(t, "acme", "data1") {
		t.Errorf("volume delete --force: stderr %q; data1 gone %v", r.Stderr, h.dataVolumeGone(t, "acme", "data1"))
	}
}

// TestShellCompletionOfHubNames asks imagectl for completions as a shell
// does (cobra's __complete), as the tenant: VM names for the commands that
// take a VM, its volumes for attach/detach and volume delete, and for vm
// create --image only the images a VM could boot from now (an image whose
// import has not finished is not offered). Nothing of another namespace is
// offered, a namespace the tenant may not read completes nothing, and no
// completion falls back to file names.
func TestShellCompletionOfHubNames(t *testing.T) {
	t.Parallel()
	h := startTenantHub(t, "hub-complete")
	h.createVM(t, "acme", "web", false)
	h.createVM(t, "acme", "worker", false)
	h.createVM(t, "globex", "wiki", false)
	for _, v := range []string{"data1", "data2", "logs"} {
		testenv.RunImagectlOK(t, append([]string{"volume", "create", v, "--size", "1Gi"}, h.tenant...)...)
	}
	testenv.RunImagectlOK(t, append([]string{"vm", "attach-volume", "web", "data2"}, h.tenant...)...)
	// A BaseImage image-syncer has not imported yet: no status.
	pending := &v1alpha1.BaseImage{
		ObjectMeta: metav1.ObjectMeta{Name: "rhel--10", Namespace: "acme"},
		Spec:       v1alpha1.BaseImageSpec{Tenant: "acme", Repository: "registry.example.com/acme/rhel", Tag: "10"},
	}
	if err := h.c.Create(t.Context(), pending); err != nil {
		t.Fatal(err)
	}

	const noFiles = ":4" // cobra.ShellCompDirectiveNoFileComp
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"vm", "get", ""}, []string{"web", "worker"}},
		{[]string{"vm", "get", "wo"}, []string{"worker"}},
		{[]string{"vm", "get", "web", ""}, nil}, // one argument only
		{[]string{"vm", "start", ""}, []string{"web", "worker"}},
		{[]string{"vm", "stop", ""}, []string{"web", "worker"}},
		{[]string{"vm", "restart", ""}, []string{"web", "worker"}},
		{[]string{"vm", "delete", "w"}, []string{"web", "worker"}},
		{[]string{"vm", "migrate", ""}, []string{"web", "worker"}},
		{[]string{"vm", "attach-volume", ""}, []string{"web", "worker"}},
		{[]string{"vm", "attach-volume", "web", ""}, []string{"data1", "data2", "logs"}},
		{[]string{"vm", "detach-volume", "web", ""}, []string{"data2"}},
		{[]string{"vm", "detach-volume", "worker", ""}, nil},
		{[]string{"volume", "delete", "da"}, []string{"data1", "data2"}},
		{[]string{"vm", "create", "new", "--image", ""}, nil},
		{[]string{"vm", "list", ""}, nil},
	} {
		n := len(tc.args) - 1 // the word being completed comes last
		got, directive := complete(t, nil, slices.Concat(tc.args[:n], h.tenant, tc.args[n:])...)
		if !slices.Equal(got, tc.want) || directive != noFiles {
			t.Errorf("completing imagectl %s: %q %s, want %q %s", strings.Join(tc.args, " "), got, directive, tc.want, noFiles)
		}
	}
	// globex is not tenant-a's: nothing, and no file names.
	got, directive := complete(t, nil, "vm", "get", "--kubeconfig", h.UserKubeconfig(t, "tenant-a"), "-n", "globex", "")
	if len(got) != 0 || directive != noFiles {
		t.Errorf("completing VMs of globex as tenant-a: %q %s", got, directive)
	}
	// The admin sees globex's VM there.
	if got, _ := complete(t, nil, "vm", "get", "--kubeconfig", h.Kubeconfig, "-n", "globex", ""); !slices.Equal(got, []string{"wiki"}) {
		t.Errorf("completing VMs of globex as the admin: %q", got)
	}
}

// TestWaitReadyReportsWhatKubeVirtLastSaid follows VMs with
// vmlaunch.WaitReady (what vm create --wait runs) while the test plays
// virt-controller: a VM that does not get ready in time yields an error
// naming what was waited for and KubeVirt's last status, conditions and
// instance phase; one KubeVirt reports Ready is returned with its
// instance, its status changes told on the way; a VM created stopped is
// waited for until KubeVirt reports it Stopped; a VM deleted meanwhile
// ends the wait at once.
func TestWaitReadyReportsWhatKubeVirtLastSaid(t *testing.T) {
	t.Parallel()
	h := startTenantHub(t, "hub-wait")
	vc := virtController{t, h.c}
	kc := h.kc
	web := h.createVM(t, "acme", "web", false)
	waitBriefly := func(name string, progress func(string)) (*vmlaunch.VMState, error) {
		ctx, cancel := context.WithTimeoutCause(t.Context(), 2*time.Second, errors.New("timed out after 2s"))
		defer cancel()
		return vmlaunch.WaitReady(ctx, kc, "acme", name, vmlaunch.WaitOptions{Interval: 100 * time.Millisecond, Progress: progress})
	}

	// Nothing reported yet, as when KubeVirt's controllers do not run.
	_, err := waitBriefly("web", nil)
	var werr *vmlaunch.WaitError
	if !errors.As(err, &werr) || !strings.Contains(err.Error(), "waiting for VM acme/web to be Ready (or its instance Running): timed out after 2s") ||
		!strings.Contains(err.Error(), "KubeVirt reported no status") {
		t.Fatalf("no status: %v", err)
	}

	// Unschedulable: the error carries KubeVirt's words.
	vc.reportStatus("acme", "web", kubevirtv1.VirtualMachineStatus{
		PrintableStatus: kubevirtv1.VirtualMachineStatusUnschedulable, Created: true,
		Conditions: []kubevirtv1.VirtualMachineCondition{
			{Type: kubevirtv1.VirtualMachineReady, Status: corev1.ConditionFalse, Reason: "GuestNotRunning", Message: "Guest VM is not reported as running"},
			{Type: kubevirtv1.VirtualMachineConditionType(corev1.PodScheduled), Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available: 3 Insufficient devices.kubevirt.io/kvm."},
			{Type: kubevirtv1.VirtualMachineConditionType(kubevirtv1.VirtualMachineInstanceIsMigratable), Status: corev1.ConditionTrue},
		},
	})
	_, err = waitBriefly("web", nil)
	for _, want := range []string{"KubeVirt last reported status ErrorUnschedulable", "condition Ready=False (GuestNotRunning: Guest VM is not reported as running)",
		"condition PodScheduled=False (Unschedulable: 0/3 nodes are available: 3 Insufficient devices.kubevirt.io/kvm.)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("unschedulable VM: %v; want %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "LiveMigratable") {
		t.Errorf("the error lists a condition that does not explain anything: %v", err)
	}

	// Scheduled and running: Ready.
	vc.startInstance(web, "node-1", "10.0.0.7")
	vc.reportStatus("acme", "web", harness.RunningVMStatus())
	var seen []string
	s, err := waitBriefly("web", func(status string) { seen = append(seen, status) })
	if err != nil || s.Instance == nil || s.Instance.Status.NodeName != "node-1" || !slices.Equal(seen, []string{"Running"}) {
		t.Errorf("ready VM: state %+v, progress %v, error %v", s, seen, err)
	}

	// Created stopped: waited for until Stopped, not Ready.
	h.createVM(t, "acme", "batch", true)
	vc.reportStatus("acme", "batch", kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusProvisioning})
	if _, err := waitBriefly("batch", nil); err == nil || !strings.Contains(err.Error(), "to be Stopped (its disks provisioned, ready to start)") ||
		!strings.Contains(err.Error(), "status Provisioning") {
		t.Errorf("stopped VM still provisioning: %v", err)
	}
	vc.reportStatus("acme", "batch", kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusStopped})
	if s, err := waitBriefly("batch", nil); err != nil || s.Instance != nil {
		t.Errorf("stopped VM provisioned: %+v %v", s, err)
	}

	// Deleted while waited for: the wait ends at once, not at the timeout.
	if _, err := vmlaunch.Delete(t.Context(), kc, "acme", "batch"); err != nil {
		t.Fatal(err)
	}
	// (No garbage collector runs here: the VM stays, being deleted.)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := vmlaunch.WaitReady(ctx, kc, "acme", "batch", vmlaunch.WaitOptions{}); err == nil || !strings.Contains(err.Error(), "is being deleted") {
		t.Errorf("deleted VM: %v", err)
	}
}
