package vmlaunch

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// sampleCluster is a KubeVirt configuration that permits both GPUs the
// sample GPU template offers.
var sampleCluster = KubeVirtConfig{
	Known: true, Source: "KubeVirt kubevirt/kubevirt", FeatureGates: []string{"GPU", "HostDevices"},
	DevicesListed: true, PermittedDevices: []string{"nvidia.com/GA102GL_A10", "nvidia.com/TU104GL_Tesla_T4"},
}

// TestSampleTemplatesRender parses every template in the repository's
// templates/ directory and renders a VM from it with its defaults and with
// each value of each enum parameter: the samples a provider starts from
// are valid, and make the VMs their descriptions promise.
func TestSampleTemplatesRender(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "templates", "*"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		switch filepath.Ext(f) {
		case ".yaml", ".yml", ".json":
		default:
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := ParseTemplate(data)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		seen[tmpl.ID] = true
		t.Run(tmpl.ID, func(t *testing.T) {
			for _, sets := range sampleSettings(tmpl) {
				values, err := ResolveParameters(tmpl, sets)
				if err != nil {
					t.Fatalf("--set %v: %v", sets, err)
				}
				req := RenderCases()["simple-defaults"]
				req.Template, req.Values, req.KubeVirt = tmpl, values, sampleCluster
				out, err := Render(req)
				if err != nil {
					t.Fatalf("--set %v: %v", sets, err)
				}
				checkSample(t, tmpl.ID, sets, out)
			}
		})
	}
	for _, id := range []string{"linux_server", "windows_server", "gpu_workstation", "simple_vm"} {
		if !seen[id] {
			t.Errorf("templates/ has no template %s", id)
		}
	}
}

// sampleSettings are the --set lists to render a template with: none,
// then each value of each enum parameter.
func sampleSettings(tmpl *api.VMTemplate) [][]string {
	out := [][]string{nil}
	for _, p := range tmpl.Parameters {
		for _, v := range p.Enum {
			out = append(out, []string{fmt.Sprintf("%s=%v", p.Name, v)})
		}
	}
	return out
}

// checkSample checks what each sample's description promises.
func checkSample(t *testing.T, id string, sets []string, out *Rendered) {
	t.Helper()
	vm := out.VM.Spec
	dom := vm.Template.Spec.Domain
	switch id {
	case "gpu_workstation":
		gpus := dom.Devices.GPUs
		want := "nvidia.com/GA102GL_A10"
		if len(sets) == 1 {
			want = strings.TrimPrefix(sets[0], "gpu=")
		}
		if len(gpus) != 1 || gpus[0].DeviceName != want {
			t.Errorf("--set %v: GPUs %+v, want one %s", sets, gpus, want)
		}
		if out.LiveMigratable || !strings.Contains(strings.Join(out.Reasons, "; "), "is passed through") {
			t.Errorf("--set %v: live-migratable %v %v; a GPU VM is not", sets, out.LiveMigratable, out.Reasons)
		}
	case "windows_server":
		if vm.Instancetype == nil || !strings.HasPrefix(vm.Instancetype.Name, "u1.") || vm.Preference == nil || vm.Preference.Name != "windows.2k22.virtio" {
			t.Errorf("--set %v: instancetype %+v, preference %+v", sets, vm.Instancetype, vm.Preference)
		}
		if size := vm.DataVolumeTemplates[0].Spec.Storage.Resources.Requests.Storage(); size.String() != "80Gi" {
			t.Errorf("system disk %s, want the default 80Gi", size)
		}
		if !out.LiveMigratable {
			t.Errorf("not live-migratable: %v", out.Reasons)
		}
	case "linux_server", "simple_vm":
		if dom.CPU == nil || dom.CPU.Cores != 2 || dom.Memory == nil || dom.Memory.Guest == nil {
			t.Errorf("compute %+v %+v, want 2 cores and a memory size", dom.CPU, dom.Memory)
		}
		if !out.LiveMigratable {
			t.Errorf("not live-migratable: %v", out.Reasons)
		}
		if id == "linux_server" && (len(out.Secrets) != 1 || !strings.Contains(string(out.Secrets[0].Data["userdata"]), "qemu-guest-agent")) {
			t.Errorf("cloud-init Secrets %+v, want the guest agent's user data", out.Secrets)
		}
	default:
		t.Errorf("template %s is not checked here: add what it promises", id)
	}
}
