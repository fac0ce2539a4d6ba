package vmlaunch

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// binding is one VM field a template may set (api.VMBindings): its name in
// the template's vm section, the type its value takes, how its text is
// read from the bindings, and how a value is applied to the VM being
// built. This table drives both template validation (validateBindings) and
// rendering (Render): a new field is one entry here and one in
// api.VMBindings.
type binding struct {
	field string
	typ   api.ParameterType
	text  func(*api.VMBindings) string
	// fromImage is the image's hint used when the template leaves the
	// field unset (instancetype and preference), if any.
	fromImage func(Image) string
	// longText is set for a string field bounded where it is used (user
	// data: MaxUserData) rather than by maxStringParam.
	longText bool
	// apply sets the field on the VM; ok is false when neither the
	// template nor the image sets it. Entries are applied in table order,
	// so an entry may read what an earlier one set.
	apply func(b *vmBuild, v Value, ok bool) error
}

// vmBindings lists every bindable scalar field. Device lists (GPUs, host
// devices) bind one deviceName per entry: vmDeviceLists.
var vmBindings = []binding{
	{field: "instancetype", typ: api.TypeString,
		text:      func(b *api.VMBindings) string { return b.Instancetype },
		fromImage: func(im Image) string { return im.Instancetype },
		apply:     applyInstancetype},
	{field: "memory", typ: api.TypeQuantity,
		text:  func(b *api.VMBindings) string { return b.Memory },
		apply: applyMemory},
	{field: "cpuCores", typ: api.TypeInteger,
		text:  func(b *api.VMBindings) string { return b.CPUCores },
		apply: applyCPUCores},
	{field: "preference", typ: api.TypeString,
		text:      func(b *api.VMBindings) string { return b.Preference },
		fromImage: func(im Image) string { return im.Preference },
		apply:     applyPreference},
	{field: "diskSize", typ: api.TypeQuantity,
		text:  func(b *api.VMBindings) string { return b.DiskSize },
		apply: func(b *vmBuild, v Value, ok bool) error { b.diskSize, b.hasDiskSize = v.Quantity, ok; return nil }},
	{field: "network", typ: api.TypeString,
		text:  func(b *api.VMBindings) string { return b.Network },
		apply: func(b *vmBuild, v Value, ok bool) error { b.network = v.Str; return nil }},
	{field: "userData", typ: api.TypeString, longText: true,
		text:  func(b *api.VMBindings) string { return b.UserData },
		apply: func(b *vmBuild, v Value, ok bool) error { b.userData = v.Str; return nil }},
}

// longTextParams names the parameters that bind a longText field.
func longTextParams(t *api.VMTemplate) map[string]bool {
	b, _ := bindings(t)
	long := map[string]bool{}
	for _, vb := range vmBindings {
		if m := referencePattern.FindStringSubmatch(vb.text(&b)); vb.longText && m != nil {
			long[m[1]] = true
		}
	}
	return long
}

// deviceNameType is the type of a device binding's deviceName.
const deviceNameType = api.TypeString

// deviceList is one list of devices a template may pass through: its
// name in the template's vm section, the kind of device for messages, how
// it is read from the bindings, and how one device is added to the VM.
// Like vmBindings, this table drives both validation and rendering
// (renderDevices).
type deviceList struct {
	field string
	kind  string
	// gate is the KubeVirt feature gate the list needs, if any (KubeVirt
	// v1.8: GPUs are GA, host devices need HostDevices).
	gate string
	list func(*api.VMBindings) []api.DeviceBinding
	add  func(d *kubevirtv1.Devices, name, device string)
}

// vmDeviceLists lists the device lists, in the order they are rendered.
var vmDeviceLists = []deviceList{
	{field: "gpus", kind: "GPU",
		list: func(b *api.VMBindings) []api.DeviceBinding { return b.GPUs },
		add: func(d *kubevirtv1.Devices, name, device string) {
			d.GPUs = append(d.GPUs, kubevirtv1.GPU{Name: name, DeviceName: device})
		}},
	{field: "hostDevices", kind: "host device", gate: "HostDevices",
		list: func(b *api.VMBindings) []api.DeviceBinding { return b.HostDevices },
		add: func(d *kubevirtv1.Devices, name, device string) {
			d.HostDevices = append(d.HostDevices, kubevirtv1.HostDevice{Name: name, DeviceName: device})
		}},
}

// eachBinding calls fn for every field the bindings set: its name, its
// type and the binding text.
func eachBinding(b api.VMBindings, fn func(field string, typ api.ParameterType, text string)) {
	for _, vb := range vmBindings {
		if text := vb.text(&b); text != "" {
			fn(vb.field, vb.typ, text)
		}
	}
	for _, dl := range vmDeviceLists {
		for i, d := range dl.list(&b) {
			fn(fmt.Sprintf("%s[%d].deviceName", dl.field, i), deviceNameType, d.DeviceName)
		}
	}
	for i, ln := range b.Localnets {
		fn(fmt.Sprintf("localnets[%d]", i), api.TypeString, ln)
	}
}

// resolveBindings reads every scalar binding against the parameter values
// (the image's hint where the template sets none). Unparsable values are
// reported together, each naming its field.
func resolveBindings(b *api.VMBindings, values map[string]Value, im Image) ([]Value, []bool, error) {
	vals := make([]Value, len(vmBindings))
	oks := make([]bool, len(vmBindings))
	var errs []error
	for i, vb := range vmBindings {
		v, ok, err := bound(vb.text(b), vb.typ, values)
		if err != nil {
			errs = append(errs, fmt.Errorf("vm.%s: %w", vb.field, err))
			continue
		}
		if !ok && vb.fromImage != nil {
			if hint := vb.fromImage(im); hint != "" {
				v, ok = Value{Type: vb.typ, Str: hint}, true
			}
		}
		vals[i], oks[i] = v, ok
	}
	return vals, oks, errors.Join(errs...)
}

func applyInstancetype(b *vmBuild, v Value, ok bool) error {
	if !ok {
		return nil
	}
	if !isDNSSubdomain(v.Str) {
		return fmt.Errorf("instancetype %q is not a valid name", v.Str)
	}
	b.vm.Spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Name: v.Str, Kind: "VirtualMachineClusterInstancetype"}
	return nil
}

// applyMemory sets the guest memory, unless an instancetype does.
func applyMemory(b *vmBuild, v Value, ok bool) error {
	if it := b.vm.Spec.Instancetype; it != nil {
		b.computeIgnored = b.computeIgnored || ok
		return nil
	}
	if !ok {
		return errors.New("the template sets neither memory (vm_memory) nor an instancetype, and the image suggests no instancetype")
	}
	if v.Quantity.Cmp(resource.MustParse("64Mi")) < 0 {
		return fmt.Errorf("memory %s: want at least 64Mi", v.Quantity.String())
	}
	q := v.Quantity
	b.domain().Memory = &kubevirtv1.Memory{Guest: &q}
	return nil
}

// applyCPUCores sets the guest's cores, unless an instancetype does.
func applyCPUCores(b *vmBuild, v Value, ok bool) error {
	if b.vm.Spec.Instancetype != nil {
		b.computeIgnored = b.computeIgnored || ok
		return nil
	}
	if !ok {
		return nil
	}
	if v.Int < 1 || v.Int > 1024 {
		return fmt.Errorf("cpu cores %d: want 1 to 1024", v.Int)
	}
	b.domain().CPU = &kubevirtv1.CPU{Cores: uint32(v.Int)}
	return nil
}

func applyPreference(b *vmBuild, v Value, ok bool) error {
	if !ok {
		return nil
	}
	if !isDNSSubdomain(v.Str) {
		return fmt.Errorf("preference %q is not a valid name", v.Str)
	}
	b.vm.Spec.Preference = &kubevirtv1.PreferenceMatcher{Name: v.Str, Kind: "VirtualMachineClusterPreference"}
	return nil
}
