package vmlaunch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Annotations vm create records so that vm update can render the VM again.
const (
	// AnnotationImage is the image reference the VM was created from,
	// TENANT/IMAGE:TAG.
	AnnotationImage = "imagepipe.io/image"
	// AnnotationParameters is the template parameters the VM was created
	// with, as JSON of name to value as given.
	AnnotationParameters = "imagepipe.io/parameters"
)

// Record notes on r's VM the image reference and the --set parameters it
// is rendered from.
func Record(r *Rendered, imageRef string, sets map[string]string) {
	if r.VM.Annotations == nil {
		r.VM.Annotations = map[string]string{}
	}
	r.VM.Annotations[AnnotationImage] = imageRef
	b, _ := json.Marshal(sets)
	r.VM.Annotations[AnnotationParameters] = string(b)
}

// Recorded reads what Record noted on vm: the image reference and the
// parameters; ok is false for a VM vm create did not record.
func Recorded(vm *kubevirtv1.VirtualMachine) (imageRef string, sets map[string]string, ok bool) {
	imageRef = vm.Annotations[AnnotationImage]
	if imageRef == "" || json.Unmarshal([]byte(vm.Annotations[AnnotationParameters]), &sets) != nil {
		return "", nil, false
	}
	return imageRef, sets, true
}

// SetList is sets as NAME=VALUE flags, sorted by name.
func SetList(sets map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(sets)) {
		out = append(out, k+"="+sets[k])
	}
	return out
}

// Update applies to the VM r was rendered for (again, from its template
// with changed parameters) what a template decides of a running VM's
// compute: its instancetype and preference, CPU, memory and resources, and
// its GPUs and host devices. Its root disk, networks and cloud-init are
// the VM's own and stay; a change of the root disk's size is refused, as
// only a new VM gets it. liveUpdate is
// whether the cluster rolls changes out to running VMs (KubeVirt's
// vmRolloutStrategy LiveUpdate), where memory and the instancetype change
// live; everything else applies when the VM next starts.
func Update(ctx context.Context, c Cluster, r *Rendered, liveUpdate bool) ([]api.VMChange, error) {
	vm, err := getVM(ctx, c, r.VM.Namespace, r.VM.Name)
	if err != nil {
		return nil, err
	}
	if vm.Spec.Template == nil {
		return nil, fmt.Errorf("VM %s has no instance template", vm.Name)
	}
	want := r.VM.Spec.Template.Spec
	var kept []string
	if !equality.Semantic.DeepEqual(diskRequests(r.VM), diskRequests(vm)) {
		kept = append(kept, "the root disk's size")
	}
	if len(kept) > 0 {
		return nil, fmt.Errorf("vm update does not change %s of a VM; create a new VM for that", strings.Join(kept, " or "))
	}
	before := vm.DeepCopy()
	running := vm.Status.Ready || vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusRunning
	var changes []api.VMChange
	change := func(field string, from, to any, live bool, apply func()) {
		if equality.Semantic.DeepEqual(from, to) {
			return
		}
		apply()
		when := api.VMChangeAtStart
		switch {
		case running && live && liveUpdate:
			when = api.VMChangeLive
		case running:
			when = api.VMChangeAtRestart
		}
		changes = append(changes, api.VMChange{Field: field, From: describe(from), To: describe(to), When: when})
	}
	spec, tmpl := &vm.Spec, &vm.Spec.Template.Spec
	change("instancetype", spec.Instancetype, r.VM.Spec.Instancetype, true, func() { spec.Instancetype = r.VM.Spec.Instancetype })
	change("preference", spec.Preference, r.VM.Spec.Preference, false, func() { spec.Preference = r.VM.Spec.Preference })
	change("memory", tmpl.Domain.Memory, want.Domain.Memory, true, func() { tmpl.Domain.Memory = want.Domain.Memory })
	change("cpu", tmpl.Domain.CPU, want.Domain.CPU, false, func() { tmpl.Domain.CPU = want.Domain.CPU })
	change("resources", tmpl.Domain.Resources, want.Domain.Resources, false, func() { tmpl.Domain.Resources = want.Domain.Resources })
	change("gpus", tmpl.Domain.Devices.GPUs, want.Domain.Devices.GPUs, false, func() { tmpl.Domain.Devices.GPUs = want.Domain.Devices.GPUs })
	change("hostDevices", tmpl.Domain.Devices.HostDevices, want.Domain.Devices.HostDevices, false, func() { tmpl.Domain.Devices.HostDevices = want.Domain.Devices.HostDevices })
	if len(changes) == 0 {
		return nil, nil
	}
	if vm.Annotations == nil {
		vm.Annotations = map[string]string{}
	}
	vm.Annotations[AnnotationParameters] = r.VM.Annotations[AnnotationParameters]
	if err := c.MergePatch(ctx, before, vm); err != nil {
		return nil, fmt.Errorf("updating VM %s/%s: %w", vm.Namespace, vm.Name, err)
	}
	return changes, nil
}

// ErrNotRecorded: the VM was not made by a vm create that records its
// image and parameters.
var ErrNotRecorded = errors.New("the VM does not record the image and parameters it was created with (made by another tool, or by an imagectl before vm update existed); create it again to update it")

func diskRequests(vm *kubevirtv1.VirtualMachine) []any {
	var out []any
	for _, d := range vm.Spec.DataVolumeTemplates {
		if d.Spec.Storage != nil {
			out = append(out, d.Spec.Storage.Resources.Requests)
		}
	}
	return out
}

// describe is a field's value as one line of JSON, "none" when unset.
func describe(v any) string {
	b, err := json.Marshal(v)
	if err != nil || string(b) == "null" {
		return "none"
	}
	return string(b)
}
