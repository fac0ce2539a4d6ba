package syncer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestTemplateCatalogInTheRegistry: templates are validated, published as
// OCI artifacts, listed and shown; publishing again pushes only what changed.
func TestTemplateCatalogInTheRegistry(t *testing.T) {
	t.Parallel()
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate})
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("simple_vm.json", `{"id":"simple_vm","title":"Simple VM Template","description":"CPU, memory, and boot volume size are configurable","parameters":[{"name":"vm_cpu_cores","default":{"value":2}},{"name":"vm_memory","default":{"value":"2Gi"}},{"name":"vm_disk_size","default":{"value":"20Gi"}}]}`)
	write("gpu.yaml", "id: gpu_vm\ntitle: GPU VM\nparameters:\n  - {name: memory, type: quantity, default: {value: 16Gi}}\nvm:\n  memory: ${memory}\n  gpus: [{name: gpu1, deviceName: nvidia.com/GA102GL_A10}]\n")
	catalog := []string{"--catalog", reg.Host}

	publish := func() []api.PublishResult {
		t.Helper()
		var res []api.PublishResult
		out := testenv.RunImagectlOK(t, append([]string{"template", "publish", dir, "-o", "json"}, catalog...)...)
		if err := json.Unmarshal([]byte(out.Stdout), &res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	status := func(res []api.PublishResult) map[string]bool {
		m := map[string]bool{}
		for _, r := range res {
			m[r.ID] = r.Unchanged
		}
		return m
	}
	if got := status(publish()); len(got) != 2 || got["simple_vm"] || got["gpu_vm"] {
		t.Fatalf("first publish: %v, want both published", got)
	}
	if got := status(publish()); !got["simple_vm"] || !got["gpu_vm"] {
		t.Fatalf("re-publish: %v, want both unchanged", got)
	}
	write("gpu.yaml", "id: gpu_vm\ntitle: GPU VM, larger\nparameters:\n  - {name: memory, type: quantity, default: {value: 32Gi}}\nvm:\n  memory: ${memory}\n  gpus: [{name: gpu1, deviceName: nvidia.com/GA102GL_A10}]\n")
	if got := status(publish()); !got["simple_vm"] || got["gpu_vm"] {
		t.Fatalf("after editing gpu.yaml: %v, want only gpu_vm published", got)
	}

	var list []api.TemplateSummary
	if err := json.Unmarshal([]byte(testenv.RunImagectlOK(t, append([]string{"template", "list", "-o", "json"}, catalog...)...).Stdout), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "gpu_vm" || list[0].Title != "GPU VM, larger" || list[1].Parameters != 3 {
		t.Errorf("template list: %+v", list)
	}
	shown := testenv.RunImagectlOK(t, append([]string{"template", "show", "simple_vm"}, catalog...)...).Stdout
	if !strings.Contains(shown, "type: quantity") || !strings.Contains(shown, "vm_disk_size") {
		t.Errorf("template show:\n%s", shown)
	}
	// skopeo, an independent client, sees an OCI artifact of our type.
	raw := testenv.Run(t, "skopeo", "inspect", "--raw", "--tls-verify=false", "docker://"+reg.Host+"/templates:simple_vm")
	if !strings.Contains(string(raw), api.TemplateArtifactType) {
		t.Errorf("manifest %s lacks the artifact type", raw)
	}

	// An invalid file stops the whole publish, naming the file and parameter.
	write("broken.yaml", "id: broken\ntitle: Broken\nparameters:\n  - {name: vm_cpu_cores, type: integer, min: 4, default: {value: 2}}\n")
	r := testenv.RunImagectl(t, append([]string{"template", "publish", dir}, catalog...)...)
	if r.Code == 0 || !strings.Contains(r.Stderr, "broken.yaml") || !strings.Contains(r.Stderr, "parameter vm_cpu_cores: default: 2 is below the minimum 4") {
		t.Errorf("publishing an invalid template: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := testenv.RunImagectl(t, append([]string{"template", "show", "broken"}, catalog...)...); r.Code == 0 {
		t.Error("the invalid template was published")
	}
}

// TestVMLaunchFromASyncedImage: a tenant creates a VM from an image the
// syncer replicated and a published template, with exactly the RBAC of
// config/tenant, and drives its lifecycle. KubeVirt's controllers do not
// run: where a running instance is needed, the test plays virt-controller.
func TestVMLaunchFromASyncedImage(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := startTestHub(t, "hub-a")
	hub.BindTenant(t, "tenant-a", "acme")
	// Every VM written below goes through KubeVirt v1.8.0's own admission webhooks,
	// configured like a default OpenShift Virtualization install.
	adm := hub.StartKubeVirtAdmission(t, harness.OpenShiftVirtualizationCR())
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")

	v1 := importImage(t, rawDisk(t, "bootable"), reg.Host+"/acme/rhel:9")
	hub.waitReady(t, "acme", "rhel--9", v1.Digest)

	dir := t.TempDir()
	tmplFile := filepath.Join(dir, "simple_vm.yaml")
	if err := os.WriteFile(tmplFile, []byte("id: simple_vm\ntitle: Simple VM\nparameters:\n  - {name: vm_cpu_cores, type: integer, min: 1, max: 8, default: {value: 2}}\n  - {name: vm_memory, default: {value: 2Gi}}\n  - {name: vm_disk_size, default: {value: 20Gi}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.RunImagectlOK(t, "template", "publish", tmplFile, "--catalog", reg.Host)
	key := filepath.Join(dir, "id.pub")
	if err := os.WriteFile(key, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlU3pg8jG2C5zN7D3YtKo0Yc7U5m1Q0bGm0b8dQ1x4G alice@example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	kube := []string{"--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "acme"}
	vm := func(args ...string) testenv.Result {
		return testenv.RunImagectl(t, append(append([]string{"vm"}, args...), kube...)...)
	}
	vmOK := func(args ...string) testenv.Result {
		t.Helper()
		return testenv.RunImagectlOK(t, append(append([]string{"vm"}, args...), kube...)...)
	}

	// Parameter errors name the parameter; nothing is created.
	r := vm("create", "web", "--image", "acme/rhel:9", "--template", "simple_vm", "--catalog", reg.Host, "--set", "vm_cpu_cores=16")
	if r.Code == 0 || !strings.Contains(r.Stderr, "parameter vm_cpu_cores: 16 is above the maximum 8") {
		t.Errorf("out-of-bounds parameter: exit %d\n%s", r.Code, r.Stderr)
	}
	// Another tenant's image, and an image not imported yet, are refused.
	if r := vm("create", "web", "--image", "globex/rhel:9", "--template", "simple_vm", "--catalog", reg.Host); r.Code == 0 || !strings.Contains(r.Stderr, "not synced into namespace acme") {
		t.Errorf("another tenant's image: exit %d\n%s", r.Code, r.Stderr)
	}
	importImage(t, rawDisk(t, "still importing"), reg.Host+"/acme/rhel:10")
	hub.baseImage(t, "acme", "rhel--10", "importing", func(b *v1alpha1.BaseImage) bool { return pickedUp(b) })
	if r := vm("create", "web", "--image", "acme/rhel:10", "--template", "simple_vm", "--catalog", reg.Host); r.Code == 0 || !strings.Contains(r.Stderr, "not ready yet") {
		t.Errorf("an image still importing: exit %d\n%s", r.Code, r.Stderr)
	}
	var vms kubevirtv1.VirtualMachineList
	if err := hub.Client.List(t.Context(), &vms, client.InNamespace("acme")); err != nil || len(vms.Items) != 0 {
		t.Fatalf("refused creates left VMs: %v %v", vms.Items, err)
	}

	// A dry run prints the VM and its Secrets and creates nothing; a GPU
	// template is reported as not live-migratable, with the reason.
	gpuFile := filepath.Join(dir, "gpu.yaml")
	if err := os.WriteFile(gpuFile, []byte("id: gpu_vm\ntitle: GPU VM\nvm:\n  memory: 8Gi\n  gpus: [{name: gpu1, deviceName: nvidia.com/GA102GL_A10}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = vmOK("create", "gpu", "--image", "acme/rhel:9", "--template-file", gpuFile, "--ssh-key", key, "--dry-run", "-o", "yaml")
	if !strings.Contains(r.Stdout, "kind: VirtualMachine") || !strings.Contains(r.Stdout, "kind: Secret") || !strings.Contains(r.Stdout, "deviceName: nvidia.com/GA102GL_A10") {
		t.Errorf("dry run printed:\n%s", r.Stdout)
	}
	if !strings.Contains(r.Stderr, "will NOT be live-migratable") || !strings.Contains(r.Stderr, "GPU gpu1 (nvidia.com/GA102GL_A10) is passed through") {
		t.Errorf("dry run of a GPU VM reported:\n%s", r.Stderr)
	}
	if err := hub.Client.List(t.Context(), &vms, client.InNamespace("acme")); err != nil || len(vms.Items) != 0 {
		t.Fatalf("the dry run created VMs: %v %v", vms.Items, err)
	}

	// Create, as the tenant.
	r = vmOK("create", "web", "--image", "acme/rhel:9", "--template", "simple_vm", "--catalog", reg.Host, "--set", "vm_cpu_cores=4", "--ssh-key", key)
	if !strings.Contains(r.Stderr, "will be live-migratable") {
		t.Errorf("create did not report live migration:\n%s", r.Stderr)
	}
	// KubeVirt's own code agrees: virt-controller would launch it, and virt-handler would call it live-migratable.
	if lm := adm.LiveMigration(t, "acme", "web"); !lm.LiveMigratable() || lm.LaunchError != "" {
		t.Errorf("KubeVirt says web is live-migratable %v (%s: %s), launch error %q; imagectl said it will be", lm.LiveMigratable(), lm.Condition.Reason, lm.Condition.Message, lm.LaunchError)
	}
	var got kubevirtv1.VirtualMachine
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web"}, &got); err != nil {
		t.Fatal(err)
	}
	dvt := got.Spec.DataVolumeTemplates[0].Spec
	if dvt.SourceRef == nil || dvt.SourceRef.Kind != "DataSource" || dvt.SourceRef.Name != "rhel--9" || dvt.Storage.AccessModes[0] != corev1.ReadWriteMany ||
		*got.Spec.Template.Spec.EvictionStrategy != kubevirtv1.EvictionStrategyLiveMigrate || *got.Spec.RunStrategy != kubevirtv1.RunStrategyAlways ||
		got.Spec.Template.Spec.Domain.CPU.Cores != 4 || got.Annotations["imagepipe.io/image-digest"] != v1.Digest {
		t.Errorf("created VM: %+v", got.Spec)
	}
	var secret corev1.Secret
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web-ssh"}, &secret); err != nil || len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].UID != got.UID {
		t.Errorf("SSH key Secret %v owned by %v (%v)", secret.Name, secret.OwnerReferences, err)
	}
	if r := vm("create", "web", "--image", "acme/rhel:9", "--template", "simple_vm", "--catalog", reg.Host); r.Code == 0 || !strings.Contains(r.Stderr, "already exists") {
		t.Errorf("a second VM of the same name: exit %d\n%s", r.Code, r.Stderr)
	}

	// Update: the template applied again with a changed parameter keeps
	// the others (cpu 4), changes memory (the VM does not run yet: at its
	// start), and refuses a new root disk size.
	r = vmOK("update", "web", "--set", "vm_memory=4Gi", "--catalog", reg.Host, "-o", "json")
	var upd api.VMResult
	if err := json.Unmarshal([]byte(r.Stdout), &upd); err != nil {
		t.Fatal(err)
	}
	if !upd.Changed || len(upd.Changes) != 1 || upd.Changes[0].Field != "memory" || !strings.Contains(upd.Changes[0].To, "4Gi") || upd.Changes[0].When != api.VMChangeAtStart {
		t.Errorf("vm update --set vm_memory=4Gi: %+v", upd)
	}
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web"}, &got); err != nil {
		t.Fatal(err)
	}
	if m := got.Spec.Template.Spec.Domain.Memory; m == nil || m.Guest.String() != "4Gi" || got.Spec.Template.Spec.Domain.CPU.Cores != 4 {
		t.Errorf("after vm update: memory %+v, cores %d; want 4Gi and the 4 cores it was created with", m, got.Spec.Template.Spec.Domain.CPU.Cores)
	}
	if r := vmOK("update", "web", "--catalog", reg.Host); !strings.Contains(r.Stdout, "unchanged") {
		t.Errorf("vm update with nothing changed: %s", r.Stdout)
	}
	if r := vm("update", "web", "--set", "vm_disk_size=40Gi", "--catalog", reg.Host); r.Code == 0 || !strings.Contains(r.Stderr, "does not change the root disk's size") {
		t.Errorf("vm update of the disk size: exit %d\n%s", r.Code, r.Stderr)
	}

	// Lifecycle: stop and start edit the run strategy.
	runStrategy := func() kubevirtv1.VirtualMachineRunStrategy {
		var vm kubevirtv1.VirtualMachine
		if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web"}, &vm); err != nil {
			t.Fatal(err)
		}
		return *vm.Spec.RunStrategy
	}
	vmOK("stop", "web")
	if rs := runStrategy(); rs != kubevirtv1.RunStrategyHalted {
		t.Errorf("after stop: %s", rs)
	}
	if r := vm("restart", "web"); r.Code == 0 {
		t.Error("a stopped VM restarted")
	}
	vmOK("start", "web")
	if rs := runStrategy(); rs != kubevirtv1.RunStrategyAlways {
		t.Errorf("after start: %s", rs)
	}
	if r := vm("migrate", "web"); r.Code == 0 || !strings.Contains(r.Stderr, "not running") {
		t.Errorf("migrating a VM without an instance: exit %d\n%s", r.Code, r.Stderr)
	}
	virtControllerStartsInstance(t, hub, &got)
	var list []api.VMSummary
	if err := json.Unmarshal([]byte(vmOK("list", "-o", "json").Stdout), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Node != "node-1" || list[0].IP != "10.0.0.7" || list[0].LiveMigratable == nil || !*list[0].LiveMigratable || list[0].Template != "simple_vm" {
		t.Errorf("vm list: %+v", list)
	}
	if c := list[0].Conditions; len(c) != 4 || c[0].Type != "Ready" || c[0].Status != "True" || c[1].Status != "False" || c[2].Status != "False" || c[3].Status != "False" {
		t.Errorf("the running VM's conditions: %+v; want Ready alone", c)
	} else if _, err := time.Parse(time.RFC3339, c[0].LastTransitionTime); err != nil {
		t.Errorf("Ready's last transition %q: %v", c[0].LastTransitionTime, err)
	}
	// Updated while it runs, on a KubeVirt that rolls out live updates:
	// memory reaches the running VM, CPU cores at its next restart.
	var running api.VMResult
	if err := json.Unmarshal([]byte(vmOK("update", "web", "--set", "vm_memory=6Gi", "--set", "vm_cpu_cores=2", "--catalog", reg.Host, "-o", "json").Stdout), &running); err != nil {
		t.Fatal(err)
	}
	when := map[string]string{}
	for _, c := range running.Changes {
		when[c.Field] = c.When
	}
	if len(when) != 2 || when["memory"] != api.VMChangeLive || when["cpu"] != api.VMChangeAtRestart {
		t.Errorf("vm update of a running VM: %+v; want memory live and cpu at the next restart", running.Changes)
	}
	r = vmOK("migrate", "web")
	var migrations kubevirtv1.VirtualMachineInstanceMigrationList
	if err := hub.Client.List(t.Context(), &migrations, client.InNamespace("acme")); err != nil || len(migrations.Items) != 1 || migrations.Items[0].Spec.VMIName != "web" {
		t.Errorf("migrations %+v (%v)", migrations.Items, err)
	}
	// The tenant cancels it, as KubeVirt cancels one: its object goes.
	if r := vmOK("migrate", "web", "--cancel"); !strings.Contains(r.Stdout, "virtualmachineinstancemigration acme/"+migrations.Items[0].Name+" cancelled") {
		t.Errorf("vm migrate --cancel printed %q", r.Stdout)
	}
	if err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(&migrations.Items[0]), &kubevirtv1.VirtualMachineInstanceMigration{}); !apierrors.IsNotFound(err) {
		t.Errorf("the cancelled migration is still there (%v)", err)
	}
	if r := vm("migrate", "web", "--cancel"); r.Code == 0 || !strings.Contains(r.Stderr, "no migration in progress") {
		t.Errorf("cancelling without a migration: exit %d\n%s", r.Code, r.Stderr)
	}
	vmOK("restart", "web")
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web"}, &kubevirtv1.VirtualMachineInstance{}); err == nil {
		t.Error("restart left the old instance")
	}

	// A data volume outlives the VM it was attached to.
	testenv.RunImagectlOK(t, append([]string{"volume", "create", "data1", "--size", "1Gi"}, kube...)...)
	// volume list selects by label: the VM's root disk is not a volume.
	if r := testenv.RunImagectlOK(t, append([]string{"volume", "list"}, kube...)...); !strings.Contains(r.Stdout, "data1") || strings.Contains(r.Stdout, "rootdisk") {
		t.Errorf("volume list:\n%s", r.Stdout)
	}
	var vols []api.VolumeSummary
	if err := json.Unmarshal([]byte(testenv.RunImagectlOK(t, append([]string{"volume", "list", "-o", "json"}, kube...)...).Stdout), &vols); err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || vols[0].Name != "data1" || vols[0].Size != "1Gi" || vols[0].Namespace != "acme" {
		t.Errorf("volume list -o json: %+v", vols)
	}
	if r := vmOK("attach-volume", "web", "data1"); !strings.HasPrefix(r.Stdout, "volume data1 attached to virtualmachine acme/web") {
		t.Errorf("attach-volume output: %s", r.Stdout)
	}
	if r := vmOK("attach-volume", "web", "data1"); r.Stdout != "volume data1: nothing to do\n" {
		t.Errorf("attach-volume again: %q, want nothing to do", r.Stdout)
	}
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web"}, &got); err != nil {
		t.Fatal(err)
	}
	if vols := got.Spec.Template.Spec.Volumes; vols[len(vols)-1].DataVolume == nil || vols[len(vols)-1].DataVolume.Name != "data1" {
		t.Errorf("attach-volume: volumes %+v", vols)
	}
	r = vmOK("delete", "web")
	if !strings.Contains(r.Stdout, "data volumes kept: data1") {
		t.Errorf("delete output: %s", r.Stdout)
	}
	var dv cdiv1.DataVolume
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "data1"}, &dv); err != nil || dv.DeletionTimestamp != nil {
		t.Errorf("the data volume did not survive the VM: %v", err)
	}
	switch err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web"}, &got); {
	case apierrors.IsNotFound(err):
	case err != nil:
		t.Fatalf("reading the VM after its delete: %v", err)
	case got.DeletionTimestamp == nil:
		t.Error("the VM was not deleted")
	}

	// The tenant cannot act in another namespace.
	other := []string{"vm", "list", "--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "globex"}
	if r := testenv.RunImagectl(t, other...); r.Code == 0 || !strings.Contains(strings.ToLower(r.Stderr), "forbidden") {
		t.Errorf("tenant-a listing VMs in globex: exit %d\n%s", r.Code, r.Stderr)
	}
}

// virtControllerStartsInstance plays KubeVirt's virt-controller and
// virt-handler: the VM's instance, scheduled to node-1 with an address,
// reported live-migratable.
func virtControllerStartsInstance(t *testing.T, h *testHub, vm *kubevirtv1.VirtualMachine) {
	t.Helper()
	h.Create(t, harness.RunningInstance(vm, "node-1", "10.0.0.7", true))
	// and reports the VM running, as its VM controller does.
	var cur kubevirtv1.VirtualMachine
	if err := h.Client.Get(t.Context(), client.ObjectKeyFromObject(vm), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Status.PrintableStatus = kubevirtv1.VirtualMachineStatusRunning
	cur.Status.Ready = true
	cur.Status.Conditions = harness.RunningVMStatus().Conditions
	if err := h.Client.Status().Update(t.Context(), &cur); err != nil {
		t.Fatalf("reporting VM %s running: %v", vm.Name, err)
	}
}
