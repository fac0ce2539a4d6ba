package hub

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/test/harness"
)

// goldenVM is one of the renderer's golden files (internal/vmlaunch/testdata/golden), which
// TestRenderGolden keeps equal to what vmlaunch.Render produces.
type goldenVM struct {
	name string
	doc  struct {
		VM             *kubevirtv1.VirtualMachine `json:"vm"`
		Secrets        []*corev1.Secret           `json:"secrets"`
		LiveMigratable bool                       `json:"liveMigratable"`
		Reasons        []string                   `json:"reasons"`
	}
}

// rendered returns the golden VM as vm create would have it from vmlaunch.Render, moved with its
// Secrets into namespace ns.
func (g goldenVM) rendered(ns string) *vmlaunch.Rendered {
	vm := g.doc.VM.DeepCopy()
	vm.Namespace = ns
	vm.Status = kubevirtv1.VirtualMachineStatus{}
	r := &vmlaunch.Rendered{VM: vm, LiveMigratable: g.doc.LiveMigratable, Reasons: g.doc.Reasons}
	for _, s := range g.doc.Secrets {
		s := s.DeepCopy()
		s.Namespace = ns
		r.Secrets = append(r.Secrets, s)
	}
	return r
}

func readGoldenVMs(t *testing.T) []goldenVM {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "internal", "vmlaunch", "testdata", "golden", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	var out []goldenVM
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		g := goldenVM{name: strings.TrimSuffix(filepath.Base(f), ".yaml")}
		if err := yaml.Unmarshal(data, &g.doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, g)
	}
	return out
}

// kubeVirtVerdict is what KubeVirt decides about a golden VM under one configuration, where it
// differs from "admitted intact, launchable, and live-migratable exactly as imagectl says".
type kubeVirtVerdict struct {
	// refused: the words KubeVirt's admission refuses the VM with.
	refused string
	// launchError: the words virt-controller fails to launch the admitted VM with.
	launchError string
	// notMigratable: the words of KubeVirt's reason for calling the instance of a VM imagectl
	// calls live-migratable not live-migratable.
	notMigratable string
}

// TestRenderedVMsThroughKubeVirtAdmission creates every golden VM as imagectl's vm create does
// (vmlaunch.Create) on hubs whose apiserver sends VirtualMachines through KubeVirt v1.8.0's own
// mutating and validating webhook code, configured by the KubeVirt object of a default OpenShift
// Virtualization install and by vanilla KubeVirt's. Each VM is admitted, or refused with
// KubeVirt's reason where the configuration lacks what it needs; an admitted VM keeps what
// imagectl meant after KubeVirt's mutation (run strategy, disks, volumes, network bindings, data
// volume templates, compute, eviction strategy), stops and starts as imagectl does it, can be
// launched, and KubeVirt's own live-migration condition for the instance it would start agrees
// with the verdict imagectl recorded in imagepipe.io/live-migratable.
//
// The golden VM on a layer-2 primary user defined network was rendered for a cluster registering
// the l2bridge binding. Vanilla KubeVirt registers none, and its admission does not check
// bindings: it admits that VM, which then cannot launch and would not live-migrate; imagectl
// itself refuses to render it there (checkLayer2Launch).
func TestRenderedVMsThroughKubeVirtAdmission(t *testing.T) {
	t.Parallel()
	golden := readGoldenVMs(t)
	for _, shape := range []struct {
		name     string
		cr       harness.KubeVirtCR
		verdicts map[string]kubeVirtVerdict
	}{
		{name: "openshift-virtualization", cr: harness.OpenShiftVirtualizationCR()},
		{name: "vanilla-kubevirt", cr: harness.VanillaKubeVirtCR(), verdicts: map[string]kubeVirtVerdict{
			"simple-image-hints-udn-layer2": {
				launchError:   "couldn't find configuration for network binding: l2bridge",
				notMigratable: "does not use masquerade or a migratable plugin to connect to the pod network",
			},
		}},
	} {
		t.Run(shape.name, func(t *testing.T) {
			hub := harness.StartHub(t, shape.name)
			adm := hub.StartKubeVirtAdmission(t, shape.cr)
			kc, err := kube.New(hub.RestConfig, harness.NewScheme(t))
			if err != nil {
				t.Fatal(err)
			}
			// imagectl decides bindings from the KubeVirt object; it must read what KubeVirt reads.
			bindings, err := vmlaunch.ReadKubeVirtConfig(t.Context(), kc)
			if err != nil {
				t.Fatal(err)
			}
			if !bindings.Known || !slices.Equal(bindings.Bindings, adm.Config.NetworkBindings) {
				t.Errorf("imagectl reads network bindings %v (known %v) from %s; KubeVirt's configuration has %v",
					bindings.Bindings, bindings.Known, bindings.Source, adm.Config.NetworkBindings)
			}
			// ... and the feature gates that decide whether host devices are admitted.
			if gates := slices.Sorted(slices.Values(adm.Config.FeatureGates)); !slices.Equal(bindings.FeatureGates, gates) {
				t.Errorf("imagectl reads feature gates %v; KubeVirt's configuration has %v", bindings.FeatureGates, gates)
			}
			for _, g := range golden {
				t.Run(g.name, func(t *testing.T) {
					checkThroughKubeVirt(t, adm, kc, g, shape.verdicts[g.name])
				})
			}
			t.Run("layer2-udn-as-rendered-here", func(t *testing.T) {
				checkLayer2Launch(t, adm, kc, bindings)
			})
		})
	}
}

// checkThroughKubeVirt creates the golden VM g in a namespace of its own and checks KubeVirt's
// verdicts on it against want.
func checkThroughKubeVirt(t *testing.T, adm *harness.KubeVirtAdmission, kc *kube.Client, g goldenVM, want kubeVirtVerdict) {
	ctx := t.Context()
	ns := g.name
	if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	r := g.rendered(ns)
	meant := r.VM.DeepCopy()
	err := vmlaunch.Create(ctx, kc, r)
	switch {
	case want.refused != "" && err == nil:
		t.Fatalf("KubeVirt admitted the VM; want it refused with %q", want.refused)
	case want.refused != "" && !strings.Contains(err.Error(), want.refused):
		t.Fatalf("KubeVirt refused the VM with %v; want %q", err, want.refused)
	case want.refused != "":
		t.Logf("refused as expected: %v", err)
		return
	case err != nil:
		t.Fatalf("KubeVirt refused the VM: %v", err)
	}

	stored := r.VM
	checkMeaningKept(t, meant, stored)
	if changes := jsonChanges(t, meant.Spec, stored.Spec); len(changes) > 0 {
		t.Logf("KubeVirt's mutation of spec: %s", strings.Join(changes, "; "))
	}
	if got := stored.Annotations[vmlaunch.AnnotationLiveMigratable]; got != fmt.Sprint(g.doc.LiveMigratable) {
		t.Errorf("stored %s=%q; imagectl decided %v", vmlaunch.AnnotationLiveMigratable, got, g.doc.LiveMigratable)
	}

	lm := adm.LiveMigration(t, ns, stored.Name)
	t.Logf("KubeVirt: LiveMigratable=%s %s %q (claims %+v, launch error %q); imagectl: %v %q",
		lm.Condition.Status, lm.Condition.Reason, lm.Condition.Message, lm.Claims, lm.LaunchError, g.doc.LiveMigratable, g.doc.Reasons)
	switch {
	case want.launchError == "" && lm.LaunchError != "":
		t.Errorf("KubeVirt could not launch the VM: %s", lm.LaunchError)
	case want.launchError != "" && !strings.Contains(lm.LaunchError, want.launchError):
		t.Errorf("KubeVirt's launch error is %q; want %q", lm.LaunchError, want.launchError)
	}
	switch {
	case want.notMigratable != "":
		if lm.LiveMigratable() || !strings.Contains(lm.Condition.Message, want.notMigratable) {
			t.Errorf("KubeVirt says LiveMigratable=%s %q; want False with %q", lm.Condition.Status, lm.Condition.Message, want.notMigratable)
		}
	case lm.LiveMigratable() != g.doc.LiveMigratable:
		t.Errorf("KubeVirt says the VM's instance is LiveMigratable=%s (%s: %s); imagectl recorded live-migratable=%v (%s)",
			lm.Condition.Status, lm.Condition.Reason, lm.Condition.Message, g.doc.LiveMigratable, strings.Join(g.doc.Reasons, "; "))
	}

	// imagectl's vm stop and vm start update the VM through the same admission.
	run := kubevirtv1.RunStrategyAlways
	if meant.Spec.RunStrategy != nil && *meant.Spec.RunStrategy == kubevirtv1.RunStrategyAlways {
		run = kubevirtv1.RunStrategyHalted
	}
	for _, rs := range []kubevirtv1.VirtualMachineRunStrategy{run, *meant.Spec.RunStrategy} {
		if _, err := vmlaunch.SetRunStrategy(ctx, kc, ns, stored.Name, rs); err != nil {
			t.Errorf("setting run strategy %s: %v", rs, err)
		}
	}
}

// checkLayer2Launch renders a VM for a namespace on a layer-2 primary user defined network with
// the bindings imagectl read from the hub: imagectl renders it exactly when KubeVirt registers
// the l2bridge binding, and what it renders KubeVirt admits, launches and calls live-migratable.
func checkLayer2Launch(t *testing.T, adm *harness.KubeVirtAdmission, kc *kube.Client, bindings vmlaunch.KubeVirtConfig) {
	ctx := t.Context()
	ns := "layer2-udn"
	r, err := renderOnUDN(t, ns, vmlaunch.PrimaryUDNLayer2, bindings)
	registered := slices.Contains(adm.Config.NetworkBindings, vmlaunch.BindingL2Bridge)
	switch {
	case !registered && err == nil:
		t.Fatalf("imagectl rendered a VM with the l2bridge binding, which KubeVirt's configuration does not register (%v)", adm.Config.NetworkBindings)
	case !registered:
		if !strings.Contains(err.Error(), vmlaunch.BindingL2Bridge) {
			t.Errorf("imagectl refuses, but without naming the missing binding: %v", err)
		}
		return
	case err != nil:
		t.Fatalf("imagectl refuses although KubeVirt registers l2bridge: %v", err)
	}
	if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := vmlaunch.Create(ctx, kc, r); err != nil {
		t.Fatalf("KubeVirt refused the VM: %v", err)
	}
	lm := adm.LiveMigration(t, ns, r.VM.Name)
	if lm.LaunchError != "" || !lm.LiveMigratable() || !r.LiveMigratable {
		t.Errorf("launch error %q, KubeVirt LiveMigratable=%s %q, imagectl live-migratable=%v; want it launchable and live-migratable for both",
			lm.LaunchError, lm.Condition.Status, lm.Condition.Message, r.LiveMigratable)
	}
}

// checkMeaningKept fails the test where KubeVirt's mutation changed what imagectl rendered on
// purpose. KubeVirt may add fields (firmware IDs, machine type, defaults); it may not change
// these.
func checkMeaningKept(t *testing.T, meant, stored *kubevirtv1.VirtualMachine) {
	t.Helper()
	m, s := meant.Spec, stored.Spec
	if m.Template == nil || s.Template == nil {
		t.Fatalf("template lost: rendered %v, stored %v", m.Template != nil, s.Template != nil)
	}
	mt, st := m.Template.Spec, s.Template.Spec
	mc, sc := mt.Domain.CPU, st.Domain.CPU
	for _, f := range []struct {
		what          string
		rendered, got any
	}{
		{"run strategy", m.RunStrategy, s.RunStrategy},
		{"data volume templates", m.DataVolumeTemplates, s.DataVolumeTemplates},
		{"instancetype", m.Instancetype, s.Instancetype},
		{"preference", m.Preference, s.Preference},
		{"disks", mt.Domain.Devices.Disks, st.Domain.Devices.Disks},
		{"interfaces (network bindings)", mt.Domain.Devices.Interfaces, st.Domain.Devices.Interfaces},
		{"networks", mt.Networks, st.Networks},
		{"volumes", mt.Volumes, st.Volumes},
		{"GPUs", mt.Domain.Devices.GPUs, st.Domain.Devices.GPUs},
		{"host devices", mt.Domain.Devices.HostDevices, st.Domain.Devices.HostDevices},
		{"access credentials", mt.AccessCredentials, st.AccessCredentials},
		{"eviction strategy", mt.EvictionStrategy, st.EvictionStrategy},
		{"memory", mt.Domain.Memory, st.Domain.Memory},
		{"firmware's bootloader", bootloader(mt.Domain.Firmware), bootloader(st.Domain.Firmware)},
		{"SMM", smm(mt.Domain.Features), smm(st.Domain.Features)},
		{"CPU cores", cpuCores(mc), cpuCores(sc)},
		{"labels", meant.Labels, stored.Labels},
		{"template labels", m.Template.ObjectMeta.Labels, s.Template.ObjectMeta.Labels},
	} {
		if !equality.Semantic.DeepEqual(f.rendered, f.got) {
			t.Errorf("KubeVirt changed the %s:\nrendered %s\nstored   %s", f.what, toJSON(t, f.rendered), toJSON(t, f.got))
		}
	}
	for k, v := range meant.Annotations {
		if stored.Annotations[k] != v {
			t.Errorf("KubeVirt changed annotation %s from %q to %q", k, v, stored.Annotations[k])
		}
	}
}

// bootloader is the firmware's bootloader, which KubeVirt must keep as
// rendered (it may add a serial number and UUID to the firmware).
func bootloader(fw *kubevirtv1.Firmware) *kubevirtv1.Bootloader {
	if fw == nil {
		return nil
	}
	return fw.Bootloader
}

func smm(f *kubevirtv1.Features) *kubevirtv1.FeatureState {
	if f == nil {
		return nil
	}
	return f.SMM
}

func cpuCores(c *kubevirtv1.CPU) uint32 {
	if c == nil {
		return 0
	}
	return c.Cores
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// jsonChanges lists the JSON paths whose values differ between a and b, as "+path=value" (only
// in b), "-path" (only in a) and "path: x -> y".
func jsonChanges(t *testing.T, a, b any) []string {
	t.Helper()
	flat := func(v any) map[string]string {
		var doc any
		if err := json.Unmarshal([]byte(toJSON(t, v)), &doc); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch x := v.(type) {
			case map[string]any:
				if len(x) == 0 {
					out[path] = "{}"
				}
				for k, e := range x {
					walk(path+"."+k, e)
				}
			case []any:
				if len(x) == 0 {
					out[path] = "[]"
				}
				for i, e := range x {
					walk(fmt.Sprintf("%s[%d]", path, i), e)
				}
			default:
				data, _ := json.Marshal(x)
				out[path] = string(data)
			}
		}
		walk("", doc)
		return out
	}
	fa, fb := flat(a), flat(b)
	var changes []string
	for p, vb := range fb {
		va, ok := fa[p]
		switch {
		case !ok:
			changes = append(changes, "+"+p+"="+vb)
		case !reflect.DeepEqual(va, vb):
			changes = append(changes, p+": "+va+" -> "+vb)
		}
	}
	for p := range fa {
		if _, ok := fb[p]; !ok {
			changes = append(changes, "-"+p)
		}
	}
	sort.Strings(changes)
	return changes
}

// TestLayer3UDNVMFollowsTheRegisteredBindings renders a VM for a namespace on a layer-3 primary
// user defined network, where only the passt binding plugs a VM in, on a hub whose KubeVirt is
// configured as a default OpenShift Virtualization install (l2bridge only) and as one with
// passt deployed. Without passt imagectl refuses, naming the binding and the HCO annotation that
// registers it (KubeVirt's admission would admit the VM, and virt-controller could not launch
// it). With passt, KubeVirt admits and can launch what imagectl renders. KubeVirt then calls
// the VM live-migratable, because HCO's passt binding declares migration; imagectl does not,
// because on layer 3 the VM's address changes with its node, and says so: a deliberate, stricter
// verdict, checked here so that a change on either side shows.
func TestLayer3UDNVMFollowsTheRegisteredBindings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cr    harness.KubeVirtCR
		passt bool
	}{
		{"openshift-virtualization", harness.OpenShiftVirtualizationCR(), false},
		{"openshift-virtualization-with-passt", harness.OpenShiftVirtualizationWithPasstCR(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			hub := harness.StartHub(t, "hub-"+tc.name)
			adm := hub.StartKubeVirtAdmission(t, tc.cr)
			kc, err := kube.New(hub.RestConfig, harness.NewScheme(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := vmlaunch.ReadKubeVirtConfig(ctx, kc)
			if err != nil {
				t.Fatal(err)
			}
			ns := "layer3-udn"
			r, err := renderOnUDN(t, ns, vmlaunch.PrimaryUDNLayer3, cfg)
			if !tc.passt {
				if err == nil || !strings.Contains(err.Error(), `"passt" network binding`) || !strings.Contains(err.Error(), "deployPasstNetworkBinding=true") {
					t.Fatalf("imagectl rendered or refused without naming passt and how to register it: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("imagectl refuses although KubeVirt registers passt: %v", err)
			}
			if iface := r.VM.Spec.Template.Spec.Domain.Devices.Interfaces; len(iface) != 1 || iface[0].Binding == nil || iface[0].Binding.Name != vmlaunch.BindingPasst {
				t.Fatalf("interfaces %+v, want one bound by passt", iface)
			}
			if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			if err := vmlaunch.Create(ctx, kc, r); err != nil {
				t.Fatalf("KubeVirt refused the VM: %v", err)
			}
			lm := adm.LiveMigration(t, ns, r.VM.Name)
			if lm.LaunchError != "" {
				t.Errorf("virt-controller could not launch it: %s", lm.LaunchError)
			}
			if !lm.LiveMigratable() || r.LiveMigratable || !strings.Contains(strings.Join(r.Reasons, "; "), "layer 3") {
				t.Errorf("KubeVirt LiveMigratable=%s (%s), imagectl live-migratable=%v %v; want KubeVirt true and imagectl false, saying why",
					lm.Condition.Status, lm.Condition.Message, r.LiveMigratable, r.Reasons)
			}
		})
	}
}

// renderOnUDN renders a simple VM from a synced image for namespace ns on a primary user
// defined network of the given topology, with the KubeVirt configuration imagectl read, onto
// ReadWriteMany Block storage.
func renderOnUDN(t *testing.T, ns string, network vmlaunch.PrimaryNetwork, kv vmlaunch.KubeVirtConfig) (*vmlaunch.Rendered, error) {
	t.Helper()
	tmpl, values := simpleTemplate(t)
	return vmlaunch.Render(vmlaunch.Request{
		Name: "web", Namespace: ns, Template: tmpl, Values: values,
		Image: vmlaunch.Image{
			Tenant: "acme", Name: "rhel", Tag: "9", Namespace: ns, DataSource: "rhel",
			Digest: "sha256:" + strings.Repeat("cd", 32), VirtualSize: 10 << 30,
		},
		Storage:  cdi.Storage{StorageClass: "shared", AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock},
		Network:  network,
		KubeVirt: kv,
	})
}
