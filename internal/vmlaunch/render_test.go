package vmlaunch

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/internal/cdi"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// RenderCases are the rendering cases with golden files; test/vm creates
// each rendered VM on a real apiserver with KubeVirt's CRDs.
func RenderCases() map[string]Request {
	rwxBlock := cdi.Storage{StorageClass: "shared", AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock}
	rwoFS := cdi.Storage{StorageClass: "local", AccessMode: corev1.ReadWriteOnce, VolumeMode: corev1.PersistentVolumeFilesystem}
	image := Image{
		Tenant: "acme", Name: "rhel", Tag: "9", Namespace: "acme", DataSource: "rhel",
		Digest: "sha256:" + strings.Repeat("ab", 32), VirtualSize: 10 << 30,
	}
	hinted := image
	hinted.Instancetype, hinted.Preference = "u1.medium", "rhel.9"
	must := func(doc string, sets ...string) (*Request, error) {
		tmpl, err := ParseTemplate([]byte(doc))
		if err != nil {
			return nil, err
		}
		values, err := ResolveParameters(tmpl, sets)
		if err != nil {
			return nil, err
		}
		return &Request{Name: "web", Namespace: "acme", Template: tmpl, Values: values, Image: image, Storage: rwxBlock}, nil
	}
	gpuDoc := `
id: gpu_vm
title: GPU VM
parameters:
  - {name: cores, type: integer, min: 1, max: 32, default: {value: 8}}
  - {name: memory, type: quantity, default: {value: 16Gi}}
  - {name: gpu_model, type: string, enum: [nvidia.com/GA102GL_A10, nvidia.com/TU104GL_Tesla_T4], default: {value: nvidia.com/GA102GL_A10}}
vm:
  cpuCores: ${cores}
  memory: ${memory}
  diskSize: 40Gi
  gpus: [{name: gpu1, deviceName: "${gpu_model}"}]
`
	multusDoc := `
id: multus_vm
title: VM on a secondary network
parameters:
  - {name: net, type: string, default: {value: tenant-vlan}}
vm:
  memory: 1Gi
  network: ${net}
  userData: |
    #cloud-config
    packages: [nginx]
`
	secureBootDoc := `
id: secure_vm
title: VM with Secure Boot on SCSI disks
vm:
  memory: 2Gi
  firmware: efi-secureboot
  diskBus: scsi
`
	cases := map[string]Request{}
	add := func(name string, r *Request, err error, edit func(*Request)) {
		if err != nil {
			panic(name + ": " + err.Error())
		}
		if edit != nil {
			edit(r)
		}
		cases[name] = *r
	}
	r, err := must(simpleVM)
	add("simple-defaults", r, err, nil)
	r, err = must(simpleVM, "vm_cpu_cores=4", "vm_memory=8Gi", "vm_disk_size=5Gi")
	add("simple-small-disk-ssh-stopped", r, err, func(r *Request) {
		r.SSHKeys = []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlU3pg8jG2C5zN7D3YtKo0Yc7U5m1Q0bGm0b8dQ1x4G alice@example.com"}
		r.Stopped = true
	})
	r, err = must(simpleVM)
	add("simple-rwo-filesystem", r, err, func(r *Request) {
		r.Storage, r.StorageNote = rwoFS, "StorageClass local offers no ReadWriteMany volumes"
	})
	r, err = must(simpleVM)
	add("simple-image-hints-udn-layer2", r, err, func(r *Request) {
		r.Image, r.Network = hinted, PrimaryUDNLayer2
		r.KubeVirt = KubeVirtConfig{Known: true, Bindings: []string{BindingL2Bridge}, Source: "KubeVirt openshift-cnv/kubevirt-kubevirt-hyperconverged"}
	})
	r, err = must(gpuDoc)
	add("gpu", r, err, func(r *Request) { r.KubeVirt = gpuCluster })
	r, err = must(multusDoc)
	add("multus-userdata", r, err, nil)
	r, err = must(simpleVM)
	add("uefi-only-disk", r, err, func(r *Request) {
		r.Image.Guest = cdi.GuestFacts{Firmware: cdi.FirmwareEFI, VirtioKnown: true, Virtio: []string{cdi.VirtioBlock, cdi.VirtioNet}, OSName: "Fedora Linux 41 (Cloud Edition)", OSID: "fedora", OSVersion: "41"}
		r.SSHKeys = []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlU3pg8jG2C5zN7D3YtKo0Yc7U5m1Q0bGm0b8dQ1x4G alice@example.com"}
	})
	r, err = must(simpleVM)
	add("bios-only-disk-without-virtio", r, err, func(r *Request) {
		r.Image.Guest = cdi.GuestFacts{Firmware: cdi.FirmwareBIOS, VirtioKnown: true, OSName: "Windows Server 2022"}
		r.SSHKeys = []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBlU3pg8jG2C5zN7D3YtKo0Yc7U5m1Q0bGm0b8dQ1x4G alice@example.com"}
	})
	r, err = must(secureBootDoc)
	add("template-secure-boot", r, err, func(r *Request) {
		r.Image.Guest = cdi.GuestFacts{Firmware: cdi.FirmwareBoth}
	})
	return cases
}

// gpuCluster is a KubeVirt configuration that permits the golden GPU.
var gpuCluster = KubeVirtConfig{
	Known: true, Source: "KubeVirt kubevirt/kubevirt",
	DevicesListed: true, PermittedDevices: []string{"nvidia.com/GA102GL_A10"},
}

func TestRenderGolden(t *testing.T) {
	for name, req := range RenderCases() {
		t.Run(name, func(t *testing.T) {
			out, err := Render(req)
			if err != nil {
				t.Fatal(err)
			}
			got := renderedYAML(t, out)
			path := filepath.Join("testdata", "golden", name+".yaml")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/vmlaunch -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("rendered VM differs from %s (go test -update rewrites it):\n%s", path, got)
			}
		})
	}
}

// renderedYAML is the golden form: the VM, its Secrets and the verdict.
func renderedYAML(t *testing.T, r *Rendered) []byte {
	t.Helper()
	doc := map[string]any{"vm": r.VM, "secrets": r.Secrets, "liveMigratable": r.LiveMigratable, "reasons": r.Reasons, "notes": r.Notes}
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRenderVerdicts(t *testing.T) {
	cases := RenderCases()
	for name, want := range map[string]struct {
		migratable bool
		reason     string
	}{
		"simple-defaults":               {true, ""},
		"simple-image-hints-udn-layer2": {true, ""},
		"simple-rwo-filesystem":         {false, "no ReadWriteMany"},
		"gpu":                           {false, "GPU gpu1 (nvidia.com/GA102GL_A10) is passed through"},
	} {
		out, err := Render(cases[name])
		if err != nil {
			t.Fatal(err)
		}
		if out.LiveMigratable != want.migratable || (want.reason != "" && !strings.Contains(strings.Join(out.Reasons, "; "), want.reason)) {
			t.Errorf("%s: migratable %v %v, want %v %q", name, out.LiveMigratable, out.Reasons, want.migratable, want.reason)
		}
		ev := *out.VM.Spec.Template.Spec.EvictionStrategy
		if (ev == "LiveMigrate") != want.migratable {
			t.Errorf("%s: eviction strategy %s", name, ev)
		}
	}
	// The root disk is never smaller than the image.
	small := cases["simple-small-disk-ssh-stopped"]
	out, err := Render(small)
	if err != nil {
		t.Fatal(err)
	}
	size := out.VM.Spec.DataVolumeTemplates[0].Spec.Storage.Resources.Requests[corev1.ResourceStorage]
	if size.Value() < small.Image.VirtualSize {
		t.Errorf("root disk %s is smaller than the %d-byte image", size.String(), small.Image.VirtualSize)
	}
}

func TestRenderRefusesWhatCannotBoot(t *testing.T) {
	tmpl, err := ParseTemplate([]byte(`{"id":"nothing","title":"No memory","parameters":[{"name":"vm_cpu_cores","default":{"value":2}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	values, _ := ResolveParameters(tmpl, nil)
	req := Request{Name: "web", Namespace: "acme", Template: tmpl, Values: values, Image: RenderCases()["simple-defaults"].Image,
		Storage: cdi.Storage{AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock}}
	if _, err := Render(req); err == nil || !strings.Contains(err.Error(), "neither memory") {
		t.Errorf("a VM without memory or instancetype: %v", err)
	}
	req.Name = "Web_1"
	if _, err := Render(req); err == nil || !strings.Contains(err.Error(), "VM name") {
		t.Errorf("an invalid VM name: %v", err)
	}
}

// TestNetworkBindingChosenFromWhatTheClusterRegisters renders a VM on each
// kind of primary network against the bindings of a default OpenShift
// Virtualization install, a vanilla KubeVirt, one with passt enabled, and
// a configuration the user may not read.
func TestNetworkBindingChosenFromWhatTheClusterRegisters(t *testing.T) {
	openshift := KubeVirtConfig{Known: true, Bindings: []string{BindingL2Bridge}, Source: "KubeVirt openshift-cnv/kubevirt"}
	vanilla := KubeVirtConfig{Known: true, Source: "KubeVirt kubevirt/kubevirt"}
	withPasst := KubeVirtConfig{Known: true, Bindings: []string{BindingL2Bridge, BindingPasst}, Source: "KubeVirt openshift-cnv/kubevirt"}
	unknown := KubeVirtConfig{}
	for _, tc := range []struct {
		name       string
		network    PrimaryNetwork
		bindings   KubeVirtConfig
		binding    string // the interface's plugin binding; "" for KubeVirt's own
		migratable bool
		refusal    string // a part of the error, when refused
		note       string
	}{
		{"pod network, vanilla", PrimaryPod, vanilla, "", true, "", ""},
		{"layer2, openshift", PrimaryUDNLayer2, openshift, BindingL2Bridge, true, "", ""},
		{"layer2, vanilla", PrimaryUDNLayer2, vanilla, "", false, `needs KubeVirt's "l2bridge" network binding, which the cluster does not register (KubeVirt kubevirt/kubevirt; spec.configuration.network.binding registers: none)`, ""},
		{"layer2, unreadable", PrimaryUDNLayer2, unknown, BindingL2Bridge, true, "", "assuming \"l2bridge\" is registered"},
		{"layer3, openshift", PrimaryUDNLayer3, openshift, "", false, `registers: l2bridge); on OpenShift Virtualization the provider enables it with the HyperConverged annotation deployPasstNetworkBinding=true`, ""},
		{"layer3, passt enabled", PrimaryUDNLayer3, withPasst, BindingPasst, false, "", ""},
		{"layer3, unreadable", PrimaryUDNLayer3, unknown, "", false, "could not be read to check", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := RenderCases()["simple-defaults"]
			req.Network, req.KubeVirt = tc.network, tc.bindings
			out, err := Render(req)
			if tc.refusal != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refusal) {
					t.Fatalf("Render = %v, want a refusal containing %q", err, tc.refusal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			iface := out.VM.Spec.Template.Spec.Domain.Devices.Interfaces[0]
			got := ""
			if iface.Binding != nil {
				got = iface.Binding.Name
			}
			if got != tc.binding || out.LiveMigratable != tc.migratable {
				t.Errorf("binding %q, live-migratable %v; want %q, %v", got, out.LiveMigratable, tc.binding, tc.migratable)
			}
			if notes := strings.Join(out.Notes, "; "); (tc.note == "") != (notes == "") || !strings.Contains(notes, tc.note) {
				t.Errorf("notes %q, want %q", notes, tc.note)
			}
		})
	}
}

// TestHostDevicesPassThrough: a host device bound to a parameter reaches
// the VM and pins it to its node; one left unset adds nothing; a device
// name that is not a resource name is refused, naming its kind.
func TestHostDevicesPassThrough(t *testing.T) {
	doc := `
id: hostdev_vm
title: Host device
parameters:
  - {name: mem, default: {value: 2Gi}}
  - {name: nic, type: string}
vm:
  memory: "${mem}"
  hostDevices: [{name: nic1, deviceName: "${nic}"}]
`
	tmpl, err := ParseTemplate([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	base := RenderCases()["simple-defaults"]
	render := func(sets ...string) (*Rendered, error) {
		values, err := ResolveParameters(tmpl, sets)
		if err != nil {
			t.Fatal(err)
		}
		req := base
		req.Template, req.Values = tmpl, values
		return Render(req)
	}
	out, err := render("nic=intel.com/sriov_net")
	if err != nil {
		t.Fatal(err)
	}
	hd := out.VM.Spec.Template.Spec.Domain.Devices.HostDevices
	if len(hd) != 1 || hd[0].Name != "nic1" || hd[0].DeviceName != "intel.com/sriov_net" {
		t.Errorf("host devices %+v, want nic1 = intel.com/sriov_net", hd)
	}
	if out.LiveMigratable || !strings.Contains(strings.Join(out.Reasons, "; "), "host device nic1 (intel.com/sriov_net) is passed through") {
		t.Errorf("migratable %v, reasons %v; want not migratable because of the host device", out.LiveMigratable, out.Reasons)
	}
	if out, err = render(); err != nil || len(out.VM.Spec.Template.Spec.Domain.Devices.HostDevices) != 0 {
		t.Errorf("an unset host device: %v, host devices %+v; want none", err, out.VM.Spec.Template.Spec.Domain.Devices.HostDevices)
	}
	if _, err := render("nic=not a resource"); err == nil || !strings.Contains(err.Error(), `host device device name "not a resource"`) {
		t.Errorf("a bad host device name: %v", err)
	}
}

// TestPassedThroughDevicesNeedWhatKubeVirtPermits: a GPU or host device is
// rendered only when the cluster's KubeVirt would run it — the feature gate
// its kind needs (HostDevices for host devices; GPUs are GA in v1.8) and its
// resource name in permittedHostDevices, which virt-controller enforces —
// and refused otherwise, naming the configuration to change. What cannot be
// checked is said in a note.
func TestPassedThroughDevicesNeedWhatKubeVirtPermits(t *testing.T) {
	doc := `
id: devices_vm
title: Devices
parameters:
  - {name: mem, default: {value: 2Gi}}
  - {name: gpu, type: string}
  - {name: nic, type: string}
vm:
  memory: "${mem}"
  gpus: [{name: gpu1, deviceName: "${gpu}"}]
  hostDevices: [{name: nic1, deviceName: "${nic}"}]
`
	tmpl, err := ParseTemplate([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	const gpu, nic = "nvidia.com/GA102GL_A10", "intel.com/sriov_net"
	permitsBoth := KubeVirtConfig{Known: true, Source: "KubeVirt kubevirt/kubevirt", FeatureGates: []string{"HostDevices"}, DevicesListed: true, PermittedDevices: []string{nic, gpu}}
	noGate := permitsBoth
	noGate.FeatureGates = []string{"Snapshot"}
	gpuOnly := permitsBoth
	gpuOnly.PermittedDevices = []string{gpu}
	unlisted := permitsBoth
	unlisted.DevicesListed, unlisted.PermittedDevices = false, nil
	for name, tc := range map[string]struct {
		kv       KubeVirtConfig
		sets     []string
		wantErr  string
		wantNote string
	}{
		"gpu permitted":              {kv: permitsBoth, sets: []string{"gpu=" + gpu}},
		"both permitted":             {kv: permitsBoth, sets: []string{"gpu=" + gpu, "nic=" + nic}},
		"gpu without the gate":       {kv: noGate, sets: []string{"gpu=" + gpu}},
		"host device without gate":   {kv: noGate, sets: []string{"nic=" + nic}, wantErr: `host device nic1 (intel.com/sriov_net) needs KubeVirt's "HostDevices" feature gate, which KubeVirt kubevirt/kubevirt does not enable (spec.configuration.developerConfiguration.featureGates: Snapshot)`},
		"host device not permitted":  {kv: gpuOnly, sets: []string{"nic=" + nic}, wantErr: "host device nic1 (intel.com/sriov_net) is not permitted by KubeVirt kubevirt/kubevirt (spec.configuration.permittedHostDevices permits: nvidia.com/GA102GL_A10)"},
		"gpu not permitted":          {kv: KubeVirtConfig{Known: true, Source: "KubeVirt kubevirt/kubevirt", DevicesListed: true}, sets: []string{"gpu=" + gpu}, wantErr: "permittedHostDevices permits: none"},
		"no permittedHostDevices":    {kv: unlisted, sets: []string{"gpu=" + gpu}, wantNote: "lists no permittedHostDevices; GPU gpu1 (nvidia.com/GA102GL_A10) must come from an external device plugin"},
		"configuration not readable": {kv: KubeVirtConfig{}, sets: []string{"nic=" + nic}, wantNote: "could not read KubeVirt's configuration; not checked that it permits host device nic1"},
	} {
		t.Run(name, func(t *testing.T) {
			values, err := ResolveParameters(tmpl, tc.sets)
			if err != nil {
				t.Fatal(err)
			}
			req := RenderCases()["simple-defaults"]
			req.Template, req.Values, req.KubeVirt = tmpl, values, tc.kv
			out, err := Render(req)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			devs := out.VM.Spec.Template.Spec.Domain.Devices
			if len(devs.GPUs)+len(devs.HostDevices) != len(tc.sets) {
				t.Errorf("rendered GPUs %+v and host devices %+v for %v", devs.GPUs, devs.HostDevices, tc.sets)
			}
			if notes := strings.Join(out.Notes, "\n"); !strings.Contains(notes, tc.wantNote) {
				t.Errorf("notes %q, want %q", notes, tc.wantNote)
			}
		})
	}
}

// TestLocalnetsAttachAsBridgedSecondaryInterfaces: the template's localnets
// (a parameter left empty attaches nothing) and vm create's, each a bridged
// Multus interface beside the primary one; the VM stays live-migratable.
// Bad names and a localnet named twice are refused.
func TestLocalnetsAttachAsBridgedSecondaryInterfaces(t *testing.T) {
	tmpl, err := ParseTemplate([]byte(`
id: dc_vm
title: VM on the datacenter network
parameters:
  - {name: storage_net, type: string, default: {value: ""}}
vm:
  memory: 1Gi
  localnets: [datacenter, "${storage_net}"]
`))
	if err != nil {
		t.Fatal(err)
	}
	base := RenderCases()["simple-defaults"]
	render := func(extra []string, sets ...string) (*Rendered, error) {
		values, err := ResolveParameters(tmpl, sets)
		if err != nil {
			t.Fatal(err)
		}
		req := base
		req.Template, req.Values, req.Localnets = tmpl, values, extra
		return Render(req)
	}
	r, err := render([]string{"backup"}, "storage_net=san")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(r.Localnets, ",") != "datacenter,san,backup" || !r.LiveMigratable {
		t.Errorf("localnets %v, live-migratable %v (%v)", r.Localnets, r.LiveMigratable, r.Reasons)
	}
	spec := r.VM.Spec.Template.Spec
	if len(spec.Networks) != 4 || len(spec.Domain.Devices.Interfaces) != 4 {
		t.Fatalf("networks %+v, interfaces %+v", spec.Networks, spec.Domain.Devices.Interfaces)
	}
	for i, name := range []string{"datacenter", "san", "backup"} {
		n, iface := spec.Networks[i+1], spec.Domain.Devices.Interfaces[i+1]
		if n.Name != name || n.Multus == nil || n.Multus.NetworkName != name || n.Multus.Default || iface.Name != name || iface.Bridge == nil {
			t.Errorf("localnet %s: network %+v, interface %+v", name, n, iface)
		}
	}
	if r, err := render(nil); err != nil || strings.Join(r.Localnets, ",") != "datacenter" {
		t.Errorf("an empty parameter attached %v (%v)", r.Localnets, err)
	}
	for extra, want := range map[string]string{"Data_Center": "want a DNS label", "default": "primary interface", "datacenter": "named twice"} {
		if _, err := render([]string{extra}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--localnet %s: %v, want an error saying %q", extra, err, want)
		}
	}
	many := make([]string, MaxLocalnets)
	for i := range many {
		many[i] = "net" + strings.Repeat("x", i)
	}
	if _, err := render(many); err == nil || !strings.Contains(err.Error(), "at most 8") {
		t.Errorf("%d localnets: %v", len(many)+1, err)
	}
}
