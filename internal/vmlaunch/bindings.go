package vmlaunch

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/cdi"
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
	// values, when set, are the only values the field takes; an empty
	// value is the field unset.
	values []string
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
	{field: "firmware", typ: api.TypeString, values: []string{api.FirmwareBIOS, api.FirmwareEFI, api.FirmwareEFISecureBoot},
		text:  func(b *api.VMBindings) string { return b.Firmware },
		apply: applyFirmware},
	{field: "diskBus", typ: api.TypeString, values: diskBuses,
		text:  func(b *api.VMBindings) string { return b.DiskBus },
		apply: applyDiskBus},
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
		if vb.values != nil && ok && v.Str == "" {
			ok = false // a parameter left empty sets nothing
		}
		if ok && vb.values != nil && !slices.Contains(vb.values, v.Str) {
			errs = append(errs, fmt.Errorf("vm.%s: %q: want one of %s", vb.field, v.Str, strings.Join(vb.values, ", ")))
			continue
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

// diskBuses are the buses a template may pin for the VM's disks.
var diskBuses = []string{string(kubevirtv1.DiskBusVirtio), string(kubevirtv1.DiskBusSATA), string(kubevirtv1.DiskBusSCSI)}

// applyFirmware sets the firmware the template pins, refusing one the
// image's disk cannot boot with; unpinned, the firmware the disk needs
// when it boots with only one. Unknown facts, or a disk that boots with
// both, leave KubeVirt's default (BIOS, or the preference's).
func applyFirmware(b *vmBuild, v Value, ok bool) error {
	disk := b.req.Image.Guest.Firmware
	want := v.Str
	if ok {
		switch {
		case want == api.FirmwareBIOS && disk == cdi.FirmwareEFI, want != api.FirmwareBIOS && disk == cdi.FirmwareBIOS:
			return &FirmwareError{Template: b.req.Template.ID, Firmware: want, Disk: disk, Image: b.req.Image}
		case want == api.FirmwareEFISecureBoot && b.req.Image.Guest.SecureBoot == cdi.SecureBootUnsigned:
			return &FirmwareError{Template: b.req.Template.ID, Firmware: want, Disk: disk, Unsigned: true, Image: b.req.Image}
		}
	} else {
		switch disk {
		case cdi.FirmwareBIOS:
			want = api.FirmwareBIOS
		case cdi.FirmwareEFI:
			// Secure Boot stays off: nothing says the disk's loaders are
			// signed, and an unsigned one would not start under it.
			want = api.FirmwareEFI
		default:
			return nil
		}
	}
	fw := &kubevirtv1.Firmware{Bootloader: &kubevirtv1.Bootloader{}}
	switch want {
	case api.FirmwareBIOS:
		fw.Bootloader.BIOS = &kubevirtv1.BIOS{}
	case api.FirmwareEFI:
		fw.Bootloader.EFI = &kubevirtv1.EFI{SecureBoot: new(false)}
	case api.FirmwareEFISecureBoot:
		fw.Bootloader.EFI = &kubevirtv1.EFI{SecureBoot: new(true)}
		// KubeVirt's admission refuses Secure Boot without SMM.
		if b.domain().Features == nil {
			b.domain().Features = &kubevirtv1.Features{}
		}
		b.domain().Features.SMM = &kubevirtv1.FeatureState{Enabled: new(true)}
	}
	b.domain().Firmware = fw
	return nil
}

// FirmwareError is vm create's refusal of a template that pins a firmware
// the image's disk cannot boot with.
type FirmwareError struct {
	Template, Firmware, Disk string
	// Unsigned: the template asks for Secure Boot and the disk's EFI
	// loader carries no signature.
	Unsigned bool
	Image    Image
}

func (e *FirmwareError) Error() string {
	if e.Unsigned {
		return fmt.Sprintf("template %s sets firmware %s, but image %s/%s:%s has an unsigned EFI loader, which does not start with Secure Boot on; use a template that sets no firmware or sets %s",
			e.Template, e.Firmware, e.Image.Tenant, e.Image.Name, e.Image.Tag, api.FirmwareEFI)
	}
	boots := "BIOS only"
	if e.Disk == cdi.FirmwareEFI {
		boots = "UEFI only"
	}
	return fmt.Sprintf("template %s sets firmware %s, but image %s/%s:%s boots with %s (the gate found no %s boot code on its disk); use a template that sets no firmware or sets %s",
		e.Template, e.Firmware, e.Image.Tenant, e.Image.Name, e.Image.Tag, boots, map[string]string{cdi.FirmwareBIOS: "UEFI", cdi.FirmwareEFI: "BIOS"}[e.Disk], map[string]string{cdi.FirmwareBIOS: api.FirmwareBIOS, cdi.FirmwareEFI: api.FirmwareEFI}[e.Disk])
}

// applyDiskBus sets the bus of the VM's disks: the template's, else sata
// for a guest known to lack virtio block drivers, else virtio.
func applyDiskBus(b *vmBuild, v Value, ok bool) error {
	b.diskBus = kubevirtv1.DiskBusVirtio
	has, known := b.req.Image.Guest.Has(cdi.VirtioBlock)
	switch {
	case ok:
		b.diskBus = kubevirtv1.DiskBus(v.Str)
		if b.diskBus == kubevirtv1.DiskBusVirtio && known && !has {
			b.out.Notes = append(b.out.Notes, fmt.Sprintf("template %s puts the disks on virtio, for which the image's guest has no drivers: it may not find its root disk", b.req.Template.ID))
		}
	case known && !has:
		b.diskBus = kubevirtv1.DiskBusSATA
		b.out.Notes = append(b.out.Notes, "the disks are on SATA: the image's guest has no virtio block drivers")
	}
	return nil
}
