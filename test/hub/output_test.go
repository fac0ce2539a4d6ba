package hub

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// decodeStrict decodes out, one JSON document, into v, refusing fields v
// does not have and anything after the document.
func decodeStrict(t *testing.T, what, out string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, out)
	}
	if dec.More() {
		t.Fatalf("%s: more than one JSON document:\n%s", what, out)
	}
}

// failureOf decodes the error object of a command that failed under -o
// json and checks that it agrees with the exit code.
func failureOf(t *testing.T, what string, r testenv.Result) api.FailureDetail {
	t.Helper()
	if r.Code == 0 {
		t.Fatalf("%s succeeded; want a failure\n%s", what, r.Stdout)
	}
	var f api.Failure
	decodeStrict(t, what, r.Stdout, &f)
	if f.Error.ExitCode != r.Code {
		t.Errorf("%s: error object says exit %d, the process exited %d", what, f.Error.ExitCode, r.Code)
	}
	return f.Error
}

// TestVMAndVolumeCommandsSpeakJSON drives every vm and volume command as
// a tenant on a real apiserver under -o json (and yaml, name and wide
// where offered) and reads back what they printed as the pkg/api models:
// results that say what changed (and, run again, that nothing did), a
// live-migration verdict that is a JSON boolean or null, kubectl-style
// names (vm create's, with --dry-run too, of what it made or would make),
// and error objects whose codes say not-found and denied.
// KubeVirt's controllers do not run; the test plays virt-controller where
// an instance is needed.
func TestVMAndVolumeCommandsSpeakJSON(t *testing.T) {
	t.Parallel()
	h := startTenantHub(t, "hub-output")
	web := h.createVM(t, "acme", "web", false)
	legacy := h.createVM(t, "acme", "legacy", true)
	// A VM no vm create made: no recorded verdict.
	before := legacy.DeepCopy()
	delete(legacy.Annotations, vmlaunch.AnnotationLiveMigratable)
	if err := h.kc.MergePatch(t.Context(), before, legacy); err != nil {
		t.Fatal(err)
	}
	tenant := func(args ...string) []string { return append(args, h.tenant...) }
	ok := func(args ...string) string { t.Helper(); return testenv.RunImagectlOK(t, tenant(args...)...).Stdout }
	vmResult := func(args ...string) api.VMResult {
		t.Helper()
		var res api.VMResult
		decodeStrict(t, strings.Join(args, " "), ok(append(args, "-o", "json")...), &res)
		return res
	}

	// vm list and get: liveMigratable is a boolean, or null for legacy.
	out := ok("vm", "list", "-o", "json")
	var raw []map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	verdicts := map[any]any{}
	for _, vm := range raw {
		v, present := vm["liveMigratable"]
		if !present {
			t.Errorf("vm list -o json: %v has no liveMigratable", vm["name"])
		}
		verdicts[vm["name"]] = v
	}
	if want := map[any]any{"legacy": nil, "web": true}; len(verdicts) != 2 || verdicts["legacy"] != nil || verdicts["web"] != true {
		t.Errorf("vm list -o json: liveMigratable %v, want %v (booleans and null, not strings)\n%s", verdicts, want, out)
	}
	var list []api.VMSummary
	decodeStrict(t, "vm list -o json", out, &list)
	var one api.VMSummary
	decodeStrict(t, "vm get web -o json", ok("vm", "get", "web", "-o", "json"), &one)
	if one.Name != "web" || one.Namespace != "acme" || one.LiveMigratable == nil || !*one.LiveMigratable || one.Digest != web.Annotations["imagepipe.io/image-digest"] {
		t.Errorf("vm get web -o json: %+v", one)
	}
	if got := ok("vm", "list", "-o", "name"); got != "virtualmachine/legacy\nvirtualmachine/web\n" {
		t.Errorf("vm list -o name: %q", got)
	}
	if got := ok("vm", "get", "web", "-o", "name"); got != "virtualmachine/web\n" {
		t.Errorf("vm get web -o name: %q", got)
	}
	wide := ok("vm", "list", "-o", "wide")
	if lines := strings.Split(strings.TrimSpace(wide), "\n"); len(lines) != 3 || !strings.Contains(lines[0], "VOLUMES") ||
		!strings.Contains(wide, one.Digest) || !strings.Contains(lines[1], "unknown") {
		t.Errorf("vm list -o wide: want a VOLUMES column, the full digest, and legacy's verdict unknown:\n%s", wide)
	}
	if table := ok("vm", "list"); strings.Contains(table, one.Digest) || !strings.Contains(table, one.Digest[7:19]) {
		t.Errorf("vm list: want the short digest only:\n%s", table)
	}
	var y api.VMSummary
	if err := yaml.UnmarshalStrict([]byte(ok("vm", "get", "legacy", "-o", "yaml")), &y); err != nil || y.Name != "legacy" || y.LiveMigratable != nil {
		t.Errorf("vm get legacy -o yaml: %+v, %v; want liveMigratable null", y, err)
	}

	// stop and start say whether they changed anything.
	if res := vmResult("vm", "stop", "web"); !reflect.DeepEqual(res, api.VMResult{Name: "web", Namespace: "acme", Action: "stop", Changed: true, RunStrategy: "Halted"}) {
		t.Errorf("vm stop web -o json: %+v", res)
	}
	if res := vmResult("vm", "stop", "web"); res.Changed {
		t.Errorf("vm stop web again: %+v, want changed false", res)
	}
	if got := ok("vm", "start", "web", "-o", "name"); got != "virtualmachine/web\n" {
		t.Errorf("vm start web -o name: %q", got)
	}

	// Volumes.
	var vol api.VolumeSummary
	decodeStrict(t, "volume create -o json", ok("volume", "create", "data1", "--size", "1Gi", "-o", "json"), &vol)
	if vol.Name != "data1" || vol.Namespace != "acme" || vol.Size != "1Gi" || !slices.Equal(vol.AccessModes, []string{"ReadWriteMany"}) || vol.VolumeMode != "Block" {
		t.Errorf("volume create -o json: %+v", vol)
	}
	if got := ok("volume", "create", "data2", "--size", "2Gi", "-o", "name"); got != "datavolume/data2\n" {
		t.Errorf("volume create -o name: %q", got)
	}
	var vols []api.VolumeSummary
	decodeStrict(t, "volume list -o json", ok("volume", "list", "-o", "json"), &vols)
	if len(vols) != 2 || !reflect.DeepEqual(vols[0], vol) {
		t.Errorf("volume list -o json: %+v; want data1 as volume create printed it, %+v", vols, vol)
	}
	if got := ok("volume", "list", "-o", "name"); got != "datavolume/data1\ndatavolume/data2\n" {
		t.Errorf("volume list -o name: %q", got)
	}
	if w := ok("volume", "list", "-o", "wide"); !strings.Contains(w, "VOLUME MODE") || !strings.Contains(w, "Block") {
		t.Errorf("volume list -o wide:\n%s", w)
	}

	res := vmResult("vm", "attach-volume", "web", "data1")
	if res.Action != "attach-volume" || !res.Changed || res.Volume != "data1" || res.Name != "web" {
		t.Errorf("vm attach-volume -o json: %+v", res)
	}
	if res := vmResult("vm", "attach-volume", "web", "data1"); res.Changed {
		t.Errorf("vm attach-volume again: %+v, want changed false", res)
	}
	var detached api.VMResult
	if err := yaml.UnmarshalStrict([]byte(ok("vm", "detach-volume", "web", "data1", "-o", "yaml")), &detached); err != nil || !detached.Changed || detached.Action != "detach-volume" {
		t.Errorf("vm detach-volume -o yaml: %+v %v", detached, err)
	}
	vmResult("vm", "attach-volume", "web", "data2")

	// migrate names the migration it created; restart and delete.
	virtController{t, h.c}.startInstance(web, "node-1", "10.0.0.7")
	migration := ok("vm", "migrate", "web", "-o", "name")
	if !regexp.MustCompile(`^virtualmachineinstancemigration/web-migration-[a-z0-9]+\n$`).MatchString(migration) {
		t.Errorf("vm migrate -o name: %q", migration)
	}
	if res := vmResult("vm", "restart", "web"); res.Action != "restart" || !res.Changed {
		t.Errorf("vm restart -o json: %+v", res)
	}
	if res := vmResult("vm", "delete", "web"); res.Action != "delete" || !slices.Equal(res.KeptVolumes, []string{"data2"}) {
		t.Errorf("vm delete -o json: %+v; want data2 kept", res)
	}
	var deleted api.VolumeDeleteResult
	decodeStrict(t, "volume delete -o json", ok("volume", "delete", "data1", "-o", "json"), &deleted)
	if deleted.Name != "data1" || deleted.Namespace != "acme" || len(deleted.AttachedTo) != 0 {
		t.Errorf("volume delete -o json: %+v", deleted)
	}

	// vm create: -o name says what it made, or with --dry-run would make;
	// -o json prints the VirtualMachine. A synced image to boot from:
	bi := &v1alpha1.BaseImage{
		ObjectMeta: metav1.ObjectMeta{Name: "rhel--9", Namespace: "acme"},
		Spec:       v1alpha1.BaseImageSpec{Tenant: "acme", Repository: "registry.example.com/acme/rhel", Tag: "9"},
	}
	if err := h.c.Create(t.Context(), bi); err != nil {
		t.Fatal(err)
	}
	bi.Status = v1alpha1.BaseImageStatus{Phase: v1alpha1.PhaseReady, ImportedDigest: one.Digest, DataSourceName: "rhel--9"}
	if err := h.c.Status().Update(t.Context(), bi); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tmpl, key := filepath.Join(dir, "simple_vm.json"), filepath.Join(dir, "id.pub")
	if err := os.WriteFile(tmpl, []byte(`{"id":"simple_vm","title":"Simple VM","parameters":[{"name":"vm_memory","default":{"value":"2Gi"}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlU3pg8jG2C5zN7D3YtKo0Yc7U5m1Q0bGm0b8dQ1x4G alice@example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	create := func(name string, args ...string) []string {
		return append([]string{"vm", "create", name, "--image", "acme/rhel:9", "--template-file", tmpl, "--ssh-key", key}, args...)
	}
	if got := ok(create("db", "--dry-run", "-o", "name")...); got != "virtualmachine/db\nsecret/db-cloudinit\nsecret/db-ssh\n" {
		t.Errorf("vm create --dry-run -o name: %q", got)
	}
	if r := testenv.RunImagectl(t, tenant("vm", "get", "db")...); r.Code == 0 {
		t.Error("vm create --dry-run -o name created the VM")
	}
	if got := ok(create("db", "-o", "name")...); got != "virtualmachine/db\n" {
		t.Errorf("vm create -o name: %q", got)
	}
	var created kubevirtv1.VirtualMachine
	if err := json.Unmarshal([]byte(ok(create("db2", "-o", "json")...)), &created); err != nil || created.Name != "db2" || created.Namespace != "acme" || created.UID == "" {
		t.Errorf("vm create -o json: %s/%s uid %q (%v); want the created VirtualMachine", created.Namespace, created.Name, created.UID, err)
	}

	// Failures: the code says what kind.
	for _, tc := range []struct {
		args []string
		code string
		say  string
	}{
		{tenant("vm", "get", "nope"), "not-found", "no VM nope in namespace acme"},
		{tenant("vm", "start", "nope"), "not-found", "no VM nope in namespace acme"},
		{tenant("vm", "attach-volume", "legacy", "nope"), "not-found", "no volume nope in namespace acme"},
		{tenant("volume", "delete", "nope"), "not-found", "no volume nope in namespace acme"},
		{[]string{"vm", "list", "--kubeconfig", h.UserKubeconfig(t, "tenant-a"), "-n", "globex"}, "denied", "forbidden"},
		{tenant("vm", "list", "-A"), "denied", "drop -A"},
	} {
		what := "imagectl " + strings.Join(tc.args, " ") + " -o json"
		f := failureOf(t, what, testenv.RunImagectl(t, append(tc.args, "-o", "json")...))
		if f.Code != tc.code || !strings.Contains(f.Message, tc.say) {
			t.Errorf("%s: %+v; want code %q and %q", what, f, tc.code, tc.say)
		}
	}
}

// TestTemplateCommandsSpeakJSON publishes the sample templates of
// templates/ to the real registry and drives every template command under
// -o json, name and wide: references REGISTRY/templates:ID, the digest
// publish printed back from list and delete, and a not-found code for a
// template that is gone.
func TestTemplateCommandsSpeakJSON(t *testing.T) {
	t.Parallel()
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	catalog := []string{"--catalog", reg.Host}
	ok := func(args ...string) string {
		t.Helper()
		return testenv.RunImagectlOK(t, append(args, catalog...)...).Stdout
	}
	ref := func(id string) string { return reg.Host + "/templates:" + id }
	ids := []string{"gpu_workstation", "linux_server", "simple_vm", "windows_server"}

	var published []api.PublishResult
	decodeStrict(t, "template publish -o json", ok("template", "publish", filepath.Join(harness.RepoRoot(t), "templates"), "-o", "json"), &published)
	digests := map[string]string{}
	for _, p := range published {
		digests[p.ID] = p.Digest
		if p.Reference != ref(p.ID) || p.Unchanged || !strings.HasPrefix(p.Digest, "sha256:") {
			t.Errorf("template publish -o json: %+v", p)
		}
	}
	if len(published) != len(ids) {
		t.Fatalf("template publish -o json: %d templates, want %d", len(published), len(ids))
	}
	if got := ok("template", "publish", filepath.Join(harness.RepoRoot(t), "templates", "linux-server.yaml"), "-o", "name"); got != ref("linux_server")+"\n" {
		t.Errorf("template publish -o name: %q", got)
	}

	var summaries []api.TemplateSummary
	decodeStrict(t, "template list -o json", ok("template", "list", "-o", "json"), &summaries)
	for _, s := range summaries {
		if s.Reference != ref(s.ID) || s.Digest != digests[s.ID] {
			t.Errorf("template list -o json: %+v; want reference %s and digest %s", s, ref(s.ID), digests[s.ID])
		}
	}
	var names []string
	for _, id := range ids {
		names = append(names, ref(id))
	}
	if got := ok("template", "list", "-o", "name"); got != strings.Join(names, "\n")+"\n" {
		t.Errorf("template list -o name: %q", got)
	}
	if w := ok("template", "list", "-o", "wide"); !strings.Contains(w, "DESCRIPTION") || !strings.Contains(w, digests["simple_vm"]) ||
		!strings.Contains(w, "CPU, memory, and boot volume size are configurable") {
		t.Errorf("template list -o wide:\n%s", w)
	}

	var shown api.VMTemplate
	decodeStrict(t, "template show -o json", ok("template", "show", "linux_server", "-o", "json"), &shown)
	if shown.ID != "linux_server" || len(shown.Parameters) != 3 {
		t.Errorf("template show linux_server -o json: %+v", shown)
	}
	if got := ok("template", "show", "linux_server", "-o", "name"); got != ref("linux_server")+"\n" {
		t.Errorf("template show -o name: %q", got)
	}

	var deleted api.TemplateDeleteResult
	decodeStrict(t, "template delete -o json", ok("template", "delete", "simple_vm", "-o", "json"), &deleted)
	if deleted != (api.TemplateDeleteResult{ID: "simple_vm", Reference: ref("simple_vm"), Digest: digests["simple_vm"]}) {
		t.Errorf("template delete -o json: %+v", deleted)
	}
	for _, args := range [][]string{{"template", "show", "simple_vm"}, {"template", "delete", "simple_vm"}} {
		what := "imagectl " + strings.Join(args, " ") + " -o json"
		f := failureOf(t, what, testenv.RunImagectl(t, append(append(args, catalog...), "-o", "json")...))
		if f.Code != "not-found" || !strings.Contains(f.Message, `has no template "simple_vm"`) {
			t.Errorf("%s: %+v; want not-found", what, f)
		}
	}
	if r := testenv.RunImagectl(t, append([]string{"template", "list", "-o", "yaml"}, catalog...)...); r.Code != 0 || !bytes.Contains([]byte(r.Stdout), []byte("reference: "+ref("linux_server"))) {
		t.Errorf("template list -o yaml: exit %d\n%s", r.Code, r.Stdout)
	}
}
