package vmlaunch

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// attachedVM is a VM with a root disk and the data volumes vols.
func attachedVM(status kubevirtv1.VirtualMachinePrintableStatus, vols ...string) *kubevirtv1.VirtualMachine {
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "acme"},
		Spec:       kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}},
		Status:     kubevirtv1.VirtualMachineStatus{PrintableStatus: status},
	}
	spec := &vm.Spec.Template.Spec
	spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: rootDiskName, VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "web-rootdisk"}}})
	spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: cloudInitDiskName, VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{}}})
	for _, v := range vols {
		spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: "vol-" + v, VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: v}}})
	}
	return vm
}

// TestDataVolumesLeaveOutTheRootDisk: vm delete reports the volumes kept
// and vm list shows the volumes attached; the root disk, which goes with
// the VM, is neither.
func TestDataVolumesLeaveOutTheRootDisk(t *testing.T) {
	for _, tc := range []struct {
		vm   *kubevirtv1.VirtualMachine
		want []string
	}{
		{attachedVM(kubevirtv1.VirtualMachineStatusRunning), nil},
		{attachedVM(kubevirtv1.VirtualMachineStatusRunning, "data1", "data2"), []string{"data1", "data2"}},
		{&kubevirtv1.VirtualMachine{}, nil},
	} {
		if got := dataVolumes(tc.vm); !slices.Equal(got, tc.want) {
			t.Errorf("dataVolumes = %v, want %v", got, tc.want)
		}
		if got := summary(tc.vm).Volumes; !slices.Equal(got, tc.want) {
			t.Errorf("summary(...).Volumes = %v, want %v", got, tc.want)
		}
	}
}

// TestVolumeChangeWaitsForTheNextStart: attaching or detaching applies at
// the next start unless the VM is known to be stopped.
func TestVolumeChangeWaitsForTheNextStart(t *testing.T) {
	for status, pending := range map[kubevirtv1.VirtualMachinePrintableStatus]bool{
		kubevirtv1.VirtualMachineStatusRunning:      true,
		kubevirtv1.VirtualMachineStatusProvisioning: true,
		kubevirtv1.VirtualMachineStatusStopped:      false,
		"":                                          false,
	} {
		if got := changed(attachedVM(status)); !got.Changed || got.Pending != pending {
			t.Errorf("status %q: %+v, want changed and pending %v", status, got, pending)
		}
	}
}

// TestLiveMigratableIsABooleanOrNull: a VM's live-migration verdict is
// KubeVirt's condition on its instance when there is one, else what vm
// create recorded; in JSON it is true, false, or null when neither says,
// never a string.
func TestLiveMigratableIsABooleanOrNull(t *testing.T) {
	for _, tc := range []struct {
		name       string
		annotation string // "" means none
		condition  corev1.ConditionStatus
		message    string
		want       string
		reasons    []string
	}{
		{"recorded true", "true", "", "", "true", nil},
		{"recorded false", "false", "", "", "false", []string{"GPU gpu1 is passed through"}},
		{"nothing recorded", "", "", "", "null", nil},
		{"garbage recorded", "maybe", "", "", "null", nil},
		{"KubeVirt says true over a recorded false", "false", corev1.ConditionTrue, "", "true", nil},
		{"KubeVirt says false", "true", corev1.ConditionFalse, "cannot migrate VMI: PVC web-rootdisk is not shared", "false", []string{"cannot migrate VMI: PVC web-rootdisk is not shared"}},
		{"KubeVirt says unknown", "true", corev1.ConditionUnknown, "", "null", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm := attachedVM(kubevirtv1.VirtualMachineStatusRunning)
			if tc.annotation != "" {
				vm.Annotations = map[string]string{AnnotationLiveMigratable: tc.annotation}
				if tc.annotation == "false" {
					vm.Annotations[AnnotationNotMigratable] = "GPU gpu1 is passed through"
				}
			}
			s := summary(vm)
			if tc.condition != "" {
				addInstance(&s, &kubevirtv1.VirtualMachineInstance{Status: kubevirtv1.VirtualMachineInstanceStatus{
					Conditions: []kubevirtv1.VirtualMachineInstanceCondition{{Type: kubevirtv1.VirtualMachineInstanceIsMigratable, Status: tc.condition, Message: tc.message}},
				}})
			}
			b, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var doc map[string]any
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatal(err)
			}
			got, present := doc["liveMigratable"]
			if !present {
				t.Fatalf("liveMigratable missing from %s", b)
			}
			if g, _ := json.Marshal(got); string(g) != tc.want {
				t.Errorf("liveMigratable = %s, want %s (%s)", g, tc.want, b)
			}
			if !slices.Equal(s.Reasons, tc.reasons) {
				t.Errorf("reasons = %q, want %q", s.Reasons, tc.reasons)
			}
		})
	}
}

// TestConditionsSayWhatATenantAsks: Ready is KubeVirt's; Progressing and
// Failed follow the printable status (and KubeVirt's Failure condition);
// a Ready VM is Degraded while paused or unable to live-migrate.
func TestConditionsSayWhatATenantAsks(t *testing.T) {
	readyCond := kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachineReady, Status: corev1.ConditionTrue}
	vm := func(status kubevirtv1.VirtualMachinePrintableStatus, conds ...kubevirtv1.VirtualMachineCondition) *kubevirtv1.VirtualMachine {
		return &kubevirtv1.VirtualMachine{Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: status, Conditions: conds}}
	}
	for _, tc := range []struct {
		name       string
		vm         *kubevirtv1.VirtualMachine
		migratable *bool
		want       string // the types that hold
		reason     string // of the first that holds
	}{
		{"running", vm(kubevirtv1.VirtualMachineStatusRunning, readyCond), ptr(true), "Ready", ""},
		{"running, cannot migrate", vm(kubevirtv1.VirtualMachineStatusRunning, readyCond), ptr(false), "Ready,Degraded", ""},
		{"paused", vm(kubevirtv1.VirtualMachineStatusPaused, readyCond, kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachinePaused, Status: corev1.ConditionTrue}), ptr(true), "Ready,Degraded", ""},
		{"starting", vm(kubevirtv1.VirtualMachineStatusStarting), nil, "Progressing", "Starting"},
		{"migrating", vm(kubevirtv1.VirtualMachineStatusMigrating, readyCond), ptr(true), "Ready,Progressing", ""},
		{"crash loop", vm(kubevirtv1.VirtualMachineStatusCrashLoopBackOff), nil, "Failed", "CrashLoopBackOff"},
		{"failure condition", vm(kubevirtv1.VirtualMachineStatusStopped, kubevirtv1.VirtualMachineCondition{Type: kubevirtv1.VirtualMachineFailure, Status: corev1.ConditionTrue, Message: "virt-launcher failed"}), nil, "Failed", "Stopped"},
		{"stopped", vm(kubevirtv1.VirtualMachineStatusStopped), ptr(false), "", ""},
	} {
		s := &api.VMSummary{LiveMigratable: tc.migratable, Reasons: []string{"RWO disk"}}
		got := conditions(tc.vm, s)
		var on []string
		reason := ""
		for i, c := range got {
			if c.Type != []string{"Ready", "Progressing", "Failed", "Degraded"}[i] {
				t.Fatalf("%s: condition %d is %s", tc.name, i, c.Type)
			}
			if c.Status == "True" {
				on = append(on, c.Type)
				if reason == "" && c.Type != "Ready" {
					reason = c.Reason
				}
			}
		}
		if strings.Join(on, ",") != tc.want || tc.reason != "" && reason != tc.reason {
			t.Errorf("%s: %v hold (first reason %q); want %q (%q)", tc.name, on, reason, tc.want, tc.reason)
		}
	}
}
