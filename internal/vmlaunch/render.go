package vmlaunch

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api"
)

// Labels and annotations on what vm create makes.
const (
	LabelTemplate    = "imagepipe.io/template"
	LabelVM          = "imagepipe.io/vm"
	AnnotationDigest = "imagepipe.io/image-digest"
	// LabelVolume marks a data volume made by `imagectl volume create`.
	LabelVolume = "imagepipe.io/volume"
)

// Image is the synced base image a VM boots from, as its BaseImage on the
// hub reports it.
type Image struct {
	Tenant, Name, Tag string // repository TENANT/NAME:TAG
	Namespace         string
	DataSource        string
	Digest            string
	VirtualSize       int64
	// Instancetype and Preference are the image's hints, used when the
	// template sets none.
	Instancetype, Preference string
}

// PrimaryNetwork is the kind of primary network of a namespace.
type PrimaryNetwork string

// Primary networks: the pod network, or an OVN-Kubernetes primary user
// defined network of layer 2 or layer 3 topology.
const (
	PrimaryPod        PrimaryNetwork = ""
	PrimaryUDNLayer2  PrimaryNetwork = "Layer2"
	PrimaryUDNLayer3  PrimaryNetwork = "Layer3"
	rootDiskName                     = "rootdisk"
	cloudInitDiskName                = "cloudinitdisk"
	networkName                      = "default"
)

// Request is everything vm create renders a VM from.
type Request struct {
	Name, Namespace string
	Template        *api.VMTemplate
	// Values are the resolved parameters (ResolveParameters).
	Values map[string]Value
	Image  Image
	// Storage is the volume shape (cdi.ChooseStorage on the class's
	// StorageProfile); StorageNote says why it cannot live-migrate, if so.
	Storage     cdi.Storage
	StorageNote string
	Network     PrimaryNetwork
	SSHKeys     []string
	// UserData replaces the template's cloud-init user data when set.
	UserData string
	Stopped  bool
}

// Rendered is a VM and the Secrets it refers to, with its live-migration
// verdict.
type Rendered struct {
	VM      *kubevirtv1.VirtualMachine
	Secrets []*corev1.Secret
	// LiveMigratable is false when any of Reasons holds.
	LiveMigratable bool
	Reasons        []string
	// Notes are remarks for the user (e.g. an instancetype overriding CPU
	// and memory parameters).
	Notes []string
}

// Render builds the VirtualMachine. It fails, naming the field or
// parameter, when the template and values do not make a bootable VM.
func Render(req Request) (*Rendered, error) {
	if !dns1123Label.MatchString(req.Name) || len(req.Name) > 50 {
		return nil, fmt.Errorf("VM name %q: want a DNS label of at most 50 characters", req.Name)
	}
	b, _ := bindings(req.Template)
	out := &Rendered{LiveMigratable: true}
	get := func(field, text string) (Value, bool, error) {
		v, ok, err := bound(text, fieldTypes[field], req.Values)
		if err != nil {
			return v, false, fmt.Errorf("vm.%s: %w", field, err)
		}
		return v, ok, nil
	}
	var errs []error
	must := func(v Value, ok bool, err error) (Value, bool) {
		if err != nil {
			errs = append(errs, err)
		}
		return v, ok && err == nil
	}
	cores, hasCores := must(get("cpuCores", b.CPUCores))
	memory, hasMemory := must(get("memory", b.Memory))
	diskSize, hasDisk := must(get("diskSize", b.DiskSize))
	itype, hasIType := must(get("instancetype", b.Instancetype))
	pref, hasPref := must(get("preference", b.Preference))
	network, hasNetwork := must(get("network", b.Network))
	userData, hasUserData := must(get("userData", b.UserData))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if !hasIType && req.Image.Instancetype != "" {
		itype, hasIType = Value{Type: api.TypeString, Str: req.Image.Instancetype}, true
	}
	if !hasPref && req.Image.Preference != "" {
		pref, hasPref = Value{Type: api.TypeString, Str: req.Image.Preference}, true
	}

	vm := &kubevirtv1.VirtualMachine{
		TypeMeta: metav1.TypeMeta{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{
			Name: req.Name, Namespace: req.Namespace,
			Labels: map[string]string{
				cdi.LabelManagedBy: "imagectl",
				LabelTemplate:      req.Template.ID,
				cdi.LabelTenant:    req.Image.Tenant,
				cdi.LabelImage:     req.Image.Name,
				cdi.LabelDigest:    strings.TrimPrefix(req.Image.Digest, "sha256:")[:12],
			},
			Annotations: map[string]string{AnnotationDigest: req.Image.Digest},
		},
	}
	run := kubevirtv1.RunStrategyAlways
	if req.Stopped {
		run = kubevirtv1.RunStrategyHalted
	}
	spec := &vm.Spec
	spec.RunStrategy = &run
	tmpl := &kubevirtv1.VirtualMachineInstanceTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelVM: req.Name}},
	}
	spec.Template = tmpl
	domain := &tmpl.Spec.Domain

	if hasIType {
		if !dns1123Subdomain.MatchString(itype.Str) {
			return nil, fmt.Errorf("instancetype %q is not a valid name", itype.Str)
		}
		spec.Instancetype = &kubevirtv1.InstancetypeMatcher{Name: itype.Str, Kind: "VirtualMachineClusterInstancetype"}
		if hasCores || hasMemory {
			out.Notes = append(out.Notes, fmt.Sprintf("instancetype %s sets CPU and memory; the template's CPU and memory values are not used", itype.Str))
		}
	} else {
		if !hasMemory {
			return nil, errors.New("the template sets neither memory (vm_memory) nor an instancetype, and the image suggests no instancetype")
		}
		if memory.Quantity.Cmp(resource.MustParse("64Mi")) < 0 {
			return nil, fmt.Errorf("memory %s: want at least 64Mi", memory.Quantity.String())
		}
		q := memory.Quantity
		domain.Memory = &kubevirtv1.Memory{Guest: &q}
		if hasCores {
			if cores.Int < 1 || cores.Int > 1024 {
				return nil, fmt.Errorf("cpu cores %d: want 1 to 1024", cores.Int)
			}
			domain.CPU = &kubevirtv1.CPU{Cores: uint32(cores.Int)}
		}
	}
	if hasPref {
		if !dns1123Subdomain.MatchString(pref.Str) {
			return nil, fmt.Errorf("preference %q is not a valid name", pref.Str)
		}
		spec.Preference = &kubevirtv1.PreferenceMatcher{Name: pref.Str, Kind: "VirtualMachineClusterPreference"}
	}

	// Root disk: a clone of the image's DataSource, at least the image's
	// virtual size (plus the filesystem overhead) and the template's size.
	size := cdi.Import{VirtualSize: req.Image.VirtualSize, Storage: req.Storage}.VolumeSize()
	if hasDisk && diskSize.Quantity.Cmp(size) > 0 {
		size = diskSize.Quantity
	}
	mode := req.Storage.VolumeMode
	storage := &cdiv1.StorageSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{req.Storage.AccessMode},
		VolumeMode:  &mode,
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
	}
	if req.Storage.StorageClass != "" {
		storage.StorageClassName = &req.Storage.StorageClass
	}
	rootDV := req.Name + "-" + rootDiskName
	ns := req.Image.Namespace
	spec.DataVolumeTemplates = []kubevirtv1.DataVolumeTemplateSpec{{
		ObjectMeta: metav1.ObjectMeta{Name: rootDV, Labels: map[string]string{LabelVM: req.Name}},
		Spec: cdiv1.DataVolumeSpec{
			SourceRef: &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: req.Image.DataSource, Namespace: &ns},
			Storage:   storage,
		},
	}}
	domain.Devices.Disks = []kubevirtv1.Disk{{Name: rootDiskName, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}}}
	tmpl.Spec.Volumes = []kubevirtv1.Volume{{Name: rootDiskName, VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: rootDV}}}}
	if req.Storage.AccessMode != corev1.ReadWriteMany {
		note := req.StorageNote
		if note == "" {
			note = fmt.Sprintf("the root disk is %s, not ReadWriteMany", req.Storage.AccessMode)
		}
		out.notMigratable(note)
	}

	// Network: one interface.
	iface := kubevirtv1.Interface{Name: networkName}
	net := kubevirtv1.Network{Name: networkName}
	switch {
	case hasNetwork && network.Str != "":
		if !dns1123Label.MatchString(network.Str) {
			return nil, fmt.Errorf("network %q is not a valid NetworkAttachmentDefinition name", network.Str)
		}
		iface.Bridge = &kubevirtv1.InterfaceBridge{}
		net.Multus = &kubevirtv1.MultusNetwork{NetworkName: network.Str, Default: true}
	case req.Network == PrimaryUDNLayer2:
		// OVN-Kubernetes keeps the VM's address across nodes on a layer-2
		// primary network; KubeVirt's l2bridge binding plugs into it.
		iface.Binding = &kubevirtv1.PluginBinding{Name: "l2bridge"}
		net.Pod = &kubevirtv1.PodNetwork{}
	case req.Network == PrimaryUDNLayer3:
		iface.Binding = &kubevirtv1.PluginBinding{Name: "passt"}
		net.Pod = &kubevirtv1.PodNetwork{}
		out.notMigratable("the namespace's primary network is layer 3, where a VM's address changes with its node")
	default:
		iface.Masquerade = &kubevirtv1.InterfaceMasquerade{}
		net.Pod = &kubevirtv1.PodNetwork{}
	}
	domain.Devices.Interfaces = []kubevirtv1.Interface{iface}
	tmpl.Spec.Networks = []kubevirtv1.Network{net}

	// Devices passed through pin the VM to its node.
	passThrough := func(kind string, list []api.DeviceBinding, add func(name, device string)) error {
		for _, d := range list {
			v, ok, err := get("deviceName", d.DeviceName)
			if err != nil {
				return err
			}
			if !ok || v.Str == "" {
				continue
			}
			if !resourceName.MatchString(v.Str) {
				return fmt.Errorf("%s device name %q is not a resource name", kind, v.Str)
			}
			add(d.Name, v.Str)
			out.notMigratable(fmt.Sprintf("%s %s (%s) is passed through", kind, d.Name, v.Str))
		}
		return nil
	}
	if err := passThrough("GPU", b.GPUs, func(name, device string) {
		domain.Devices.GPUs = append(domain.Devices.GPUs, kubevirtv1.GPU{Name: name, DeviceName: device})
	}); err != nil {
		return nil, err
	}
	if err := passThrough("host device", b.HostDevices, func(name, device string) {
		domain.Devices.HostDevices = append(domain.Devices.HostDevices, kubevirtv1.HostDevice{Name: name, DeviceName: device})
	}); err != nil {
		return nil, err
	}

	// cloud-init NoCloud: user data in a Secret, SSH keys propagated by
	// KubeVirt from another.
	ud := req.UserData
	if ud == "" && hasUserData {
		ud = userData.Str
	}
	if len(ud) > MaxUserData {
		return nil, fmt.Errorf("user data is %d bytes, over the limit of %d", len(ud), MaxUserData)
	}
	if ud == "" && len(req.SSHKeys) > 0 {
		ud = "#cloud-config\n"
	}
	if ud != "" {
		secret := req.Name + "-cloudinit"
		out.Secrets = append(out.Secrets, vmSecret(req, secret, map[string][]byte{"userdata": []byte(ud)}))
		domain.Devices.Disks = append(domain.Devices.Disks, kubevirtv1.Disk{Name: cloudInitDiskName, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}})
		tmpl.Spec.Volumes = append(tmpl.Spec.Volumes, kubevirtv1.Volume{Name: cloudInitDiskName, VolumeSource: kubevirtv1.VolumeSource{
			CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: secret}},
		}})
	}
	if len(req.SSHKeys) > 0 {
		secret := req.Name + "-ssh"
		data := map[string][]byte{}
		for i, k := range req.SSHKeys {
			data[fmt.Sprintf("key%d", i+1)] = []byte(strings.TrimSpace(k))
		}
		out.Secrets = append(out.Secrets, vmSecret(req, secret, data))
		tmpl.Spec.AccessCredentials = []kubevirtv1.AccessCredential{{SSHPublicKey: &kubevirtv1.SSHPublicKeyAccessCredential{
			Source:            kubevirtv1.SSHPublicKeyAccessCredentialSource{Secret: &kubevirtv1.AccessCredentialSecretSource{SecretName: secret}},
			PropagationMethod: kubevirtv1.SSHPublicKeyAccessCredentialPropagationMethod{NoCloud: &kubevirtv1.NoCloudSSHPublicKeyAccessCredentialPropagation{}},
		}}}
	}

	eviction := kubevirtv1.EvictionStrategyLiveMigrate
	if !out.LiveMigratable {
		// Draining a node stops such a VM; runStrategy starts it elsewhere.
		eviction = kubevirtv1.EvictionStrategyNone
	}
	tmpl.Spec.EvictionStrategy = &eviction
	out.VM = vm
	return out, nil
}

func (r *Rendered) notMigratable(reason string) {
	r.LiveMigratable = false
	r.Reasons = append(r.Reasons, reason)
}

func vmSecret(req Request, name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: req.Namespace,
			Labels: map[string]string{cdi.LabelManagedBy: "imagectl", LabelVM: req.Name},
		},
		Data: data,
	}
}
