package vmlaunch

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
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

// MaxLocalnets bounds the localnets one VM attaches to.
const MaxLocalnets = 8

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
	// Guest is what the image's DataSource says of its guest: the
	// firmware and disk bus it boots with, its OS.
	Guest cdi.GuestFacts
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
	// ImageNamespace is where the image's BaseImage and DataSource are, when
	// not in Namespace (a VM on a private network clones across).
	ImageNamespace string
	Template       *api.VMTemplate
	// Values are the resolved parameters (ResolveParameters).
	Values map[string]Value
	Image  Image
	// Storage is the volume shape (cdi.ChooseStorage on the class's
	// StorageProfile); StorageNote says why it cannot live-migrate, if so.
	Storage     cdi.Storage
	StorageNote string
	Network     PrimaryNetwork
	// Bindings are the network binding plugins the cluster registers
	// KubeVirt is the cluster's KubeVirt configuration (ReadKubeVirtConfig):
	// the network bindings that matter on a primary user defined network,
	// and the feature gates and permitted devices that passed-through
	// devices need.
	KubeVirt KubeVirtConfig
	// Localnets are localnets to attach besides the template's (vm create
	// --localnet).
	Localnets []string
	// IP, when valid, is the address the VM asks for on its layer-2
	// primary user defined network, with the network's prefix length
	// (vm create --ip; OVN-Kubernetes' static IP request).
	IP      netip.Prefix
	SSHKeys []string
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
	// Image and Storage are what the VM was rendered from: the image its
	// root disk clones and the root disk's volume shape.
	Image   Image
	Storage cdi.Storage
	// Localnets are the localnets the VM attaches to, which the hub must
	// offer its namespace (CheckLocalnets).
	Localnets []string
}

// vmBuild is a VirtualMachine being rendered: the request, the result so
// far, and what the bindings set for the parts built after them.
type vmBuild struct {
	req  Request
	out  *Rendered
	vm   *kubevirtv1.VirtualMachine
	tmpl *kubevirtv1.VirtualMachineInstanceTemplateSpec

	diskSize    resource.Quantity // the template's minimum root disk size
	hasDiskSize bool
	network     string // a Multus network name, or "" for the primary one
	userData    string // the template's cloud-init user data
	diskBus     kubevirtv1.DiskBus
	// computeIgnored is set when an instancetype overrides CPU or memory
	// values the template gave.
	computeIgnored bool
}

func (b *vmBuild) domain() *kubevirtv1.DomainSpec { return &b.tmpl.Spec.Domain }

// Render builds the VirtualMachine. It fails, naming the field or
// parameter, when the template and values do not make a bootable VM.
func Render(req Request) (*Rendered, error) {
	if !isDNSLabel(req.Name) || len(req.Name) > 50 {
		return nil, fmt.Errorf("VM name %q: want a DNS label of at most 50 characters", req.Name)
	}
	b := newVMBuild(req)
	for _, step := range []func(*vmBuild) error{renderCompute, renderRootDisk, renderNetwork, renderLocalnets, renderDevices, renderCloudInit} {
		if err := step(b); err != nil {
			return nil, err
		}
	}
	eviction := kubevirtv1.EvictionStrategyLiveMigrate
	if !b.out.LiveMigratable {
		// Draining a node stops such a VM; runStrategy starts it elsewhere.
		eviction = kubevirtv1.EvictionStrategyNone
	}
	b.tmpl.Spec.EvictionStrategy = &eviction
	b.out.VM = b.vm
	return b.out, nil
}

// newVMBuild starts the VM: its labels, the image digest it boots, and its
// run strategy.
func newVMBuild(req Request) *vmBuild {
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
	if os := req.Image.Guest.OSName; os != "" {
		vm.Annotations[api.AnnotationGuestOS] = os
	}
	run := kubevirtv1.RunStrategyAlways
	if req.Stopped {
		run = kubevirtv1.RunStrategyHalted
	}
	vm.Spec.RunStrategy = &run
	tmpl := &kubevirtv1.VirtualMachineInstanceTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelVM: req.Name}},
	}
	vm.Spec.Template = tmpl
	out := &Rendered{LiveMigratable: true, Image: req.Image, Storage: req.Storage}
	return &vmBuild{req: req, out: out, vm: vm, tmpl: tmpl}
}

// renderCompute applies the template's bindings in table order:
// instancetype, memory and CPU, preference, and what later parts read.
func renderCompute(b *vmBuild) error {
	bs, _ := bindings(b.req.Template)
	vals, oks, err := resolveBindings(&bs, b.req.Values, b.req.Image)
	if err != nil {
		return err
	}
	for i, vb := range vmBindings {
		if err := vb.apply(b, vals[i], oks[i]); err != nil {
			return err
		}
	}
	if b.computeIgnored {
		b.out.Notes = append(b.out.Notes, fmt.Sprintf("instancetype %s sets CPU and memory; the template's CPU and memory values are not used", b.vm.Spec.Instancetype.Name))
	}
	return nil
}

// renderRootDisk adds the root disk: a clone of the image's DataSource, at
// least the image's virtual size (plus the filesystem overhead) and the
// template's size.
func renderRootDisk(b *vmBuild) error {
	req := b.req
	size := cdi.Import{VirtualSize: req.Image.VirtualSize, Storage: req.Storage}.VolumeSize()
	if b.hasDiskSize && b.diskSize.Cmp(size) > 0 {
		size = b.diskSize
	}
	rootDV := req.Name + "-" + rootDiskName
	ns := req.Image.Namespace
	b.vm.Spec.DataVolumeTemplates = []kubevirtv1.DataVolumeTemplateSpec{{
		ObjectMeta: metav1.ObjectMeta{Name: rootDV, Labels: map[string]string{LabelVM: req.Name}},
		Spec: cdiv1.DataVolumeSpec{
			SourceRef: &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: req.Image.DataSource, Namespace: &ns},
			Storage:   req.Storage.Spec(size),
		},
	}}
	b.domain().Devices.Disks = []kubevirtv1.Disk{{Name: rootDiskName, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: b.diskBus}}}}
	b.tmpl.Spec.Volumes = []kubevirtv1.Volume{{Name: rootDiskName, VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: rootDV}}}}
	if req.Storage.AccessMode != corev1.ReadWriteMany {
		note := req.StorageNote
		if note == "" {
			note = fmt.Sprintf("the root disk is %s, not ReadWriteMany", req.Storage.AccessMode)
		}
		b.out.notMigratable(note)
	}
	return nil
}

// AnnotationIPRequest, on a VM's instance template, asks OVN-Kubernetes
// (through KubeVirt's IPAM extension) for given addresses on a primary
// user defined network: JSON of interface name to CIDR addresses.
const AnnotationIPRequest = "network.kubevirt.io/addresses"

// ipRequest is AnnotationIPRequest's value asking for ip on iface.
func ipRequest(iface string, ip netip.Prefix) string {
	b, _ := json.Marshal(map[string][]string{iface: {ip.String()}})
	return string(b)
}

// renderNetwork adds the VM's one interface: on a Multus network the
// template names, else on the namespace's primary network with the binding
// that keeps it migratable where one exists.
func renderNetwork(b *vmBuild) error {
	iface := kubevirtv1.Interface{Name: networkName}
	net := kubevirtv1.Network{Name: networkName}
	switch {
	case b.network != "":
		if !isDNSLabel(b.network) {
			return fmt.Errorf("network %q is not a valid NetworkAttachmentDefinition name", b.network)
		}
		iface.Bridge = &kubevirtv1.InterfaceBridge{}
		net.Multus = &kubevirtv1.MultusNetwork{NetworkName: b.network, Default: true}
	case b.req.Network == PrimaryUDNLayer2:
		// OVN-Kubernetes keeps the VM's address across nodes on a layer-2
		// primary network; KubeVirt's l2bridge binding plugs into it.
		if err := b.requireBinding(BindingL2Bridge, "the namespace's layer-2 primary user defined network",
			"the provider registers it in the KubeVirt configuration (OpenShift Virtualization does by default)"); err != nil {
			return err
		}
		iface.Binding = &kubevirtv1.PluginBinding{Name: BindingL2Bridge}
		net.Pod = &kubevirtv1.PodNetwork{}
		if b.req.IP.IsValid() {
			if b.tmpl.ObjectMeta.Annotations == nil {
				b.tmpl.ObjectMeta.Annotations = map[string]string{}
			}
			b.tmpl.ObjectMeta.Annotations[AnnotationIPRequest] = ipRequest(networkName, b.req.IP)
		}
	case b.req.IP.IsValid():
		return errors.New("an address (--ip) can be asked for only on a private network (--network), whose layer-2 network keeps it")
	case b.req.Network == PrimaryUDNLayer3:
		if err := b.requireBinding(BindingPasst, "the namespace's layer-3 primary user defined network",
			"on OpenShift Virtualization the provider enables it with the HyperConverged annotation deployPasstNetworkBinding=true; or use a layer-2 primary network, where VMs also live-migrate"); err != nil {
			return err
		}
		iface.Binding = &kubevirtv1.PluginBinding{Name: BindingPasst}
		net.Pod = &kubevirtv1.PodNetwork{}
		b.out.notMigratable("the namespace's primary network is layer 3, where a VM's address changes with its node")
	default:
		iface.Masquerade = &kubevirtv1.InterfaceMasquerade{}
		net.Pod = &kubevirtv1.PodNetwork{}
	}
	b.domain().Devices.Interfaces = []kubevirtv1.Interface{iface}
	b.tmpl.Spec.Networks = []kubevirtv1.Network{net}
	return nil
}

// renderLocalnets adds a bridged secondary interface on each localnet the
// template's bindings and the request name: a Multus network of the
// NetworkAttachmentDefinition OVN-Kubernetes writes, under the localnet's
// name, in each namespace its ClusterUserDefinedNetwork selects. KubeVirt
// live-migrates VMs with bridged interfaces off the pod network.
func renderLocalnets(b *vmBuild) error {
	bs, _ := bindings(b.req.Template)
	var names []string
	for i, text := range bs.Localnets {
		v, _, err := bound(text, api.TypeString, b.req.Values)
		if err != nil {
			return fmt.Errorf("vm.localnets[%d]: %w", i, err)
		}
		if v.Str != "" {
			names = append(names, v.Str)
		}
	}
	names = append(names, b.req.Localnets...)
	if len(names) > MaxLocalnets {
		return fmt.Errorf("%d localnets: a VM attaches to at most %d", len(names), MaxLocalnets)
	}
	for _, name := range names {
		switch {
		case !isDNSLabel(name):
			return fmt.Errorf("localnet %q: want a DNS label, the name of a ClusterUserDefinedNetwork", name)
		case name == networkName:
			return fmt.Errorf("localnet %q: the name of the VM's primary interface; the provider must rename it", name)
		case slices.Contains(b.out.Localnets, name):
			return fmt.Errorf("localnet %s is named twice", name)
		}
		b.out.Localnets = append(b.out.Localnets, name)
		b.domain().Devices.Interfaces = append(b.domain().Devices.Interfaces, kubevirtv1.Interface{
			Name: name, InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
		})
		b.tmpl.Spec.Networks = append(b.tmpl.Spec.Networks, kubevirtv1.Network{
			Name: name, NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: name}},
		})
	}
	return nil
}

// renderDevices passes GPUs and host devices through; each pins the VM to
// its node.
func renderDevices(b *vmBuild) error {
	bs, _ := bindings(b.req.Template)
	for _, dl := range vmDeviceLists {
		if err := b.passThrough(dl, dl.list(&bs)); err != nil {
			return err
		}
	}
	return nil
}

// passThrough adds the devices of list whose deviceName is set.
func (b *vmBuild) passThrough(dl deviceList, list []api.DeviceBinding) error {
	kind := dl.kind
	for _, d := range list {
		v, ok, err := bound(d.DeviceName, deviceNameType, b.req.Values)
		if err != nil {
			return fmt.Errorf("vm.deviceName: %w", err)
		}
		if !ok || v.Str == "" {
			continue
		}
		if !resourceName.MatchString(v.Str) {
			return fmt.Errorf("%s device name %q is not a resource name", kind, v.Str)
		}
		if err := b.requireDevice(dl, d.Name, v.Str); err != nil {
			return err
		}
		dl.add(&b.domain().Devices, d.Name, v.Str)
		b.out.notMigratable(fmt.Sprintf("%s %s (%s) is passed through", kind, d.Name, v.Str))
	}
	return nil
}

// renderCloudInit adds cloud-init NoCloud: user data in a Secret, SSH keys
// propagated by KubeVirt from another.
func renderCloudInit(b *vmBuild) error {
	req := b.req
	ud := req.UserData
	if ud == "" {
		ud = b.userData
	}
	if len(ud) > MaxUserData {
		return fmt.Errorf("user data is %d bytes, over the limit of %d", len(ud), MaxUserData)
	}
	if ud == "" && len(req.SSHKeys) > 0 {
		ud = "#cloud-config\n"
	}
	if ud != "" {
		secret := req.Name + "-cloudinit"
		b.out.Secrets = append(b.out.Secrets, vmSecret(req, secret, map[string][]byte{"userdata": []byte(ud)}))
		b.domain().Devices.Disks = append(b.domain().Devices.Disks, kubevirtv1.Disk{Name: cloudInitDiskName, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: b.diskBus}}})
		b.tmpl.Spec.Volumes = append(b.tmpl.Spec.Volumes, kubevirtv1.Volume{Name: cloudInitDiskName, VolumeSource: kubevirtv1.VolumeSource{
			CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: secret}},
		}})
	}
	if len(req.SSHKeys) > 0 && req.Image.Guest.IgnoresNoCloud() {
		found := "neither cloud-init nor cloudbase-init"
		if req.Image.Guest.Init == cdi.InitIgnition {
			found = "Ignition, not cloud-init"
		}
		return fmt.Errorf("image %s/%s:%s would never see the SSH keys: KubeVirt gives them through cloud-init's NoCloud data, and the gate found %s in it; leave the keys out, or use an image with cloud-init",
			req.Image.Tenant, req.Image.Name, req.Image.Tag, found)
	}
	if len(req.SSHKeys) > 0 {
		secret := req.Name + "-ssh"
		data := map[string][]byte{}
		for i, k := range req.SSHKeys {
			data[fmt.Sprintf("key%d", i+1)] = []byte(strings.TrimSpace(k))
		}
		b.out.Secrets = append(b.out.Secrets, vmSecret(req, secret, data))
		b.tmpl.Spec.AccessCredentials = []kubevirtv1.AccessCredential{{SSHPublicKey: &kubevirtv1.SSHPublicKeyAccessCredential{
			Source:            kubevirtv1.SSHPublicKeyAccessCredentialSource{Secret: &kubevirtv1.AccessCredentialSecretSource{SecretName: secret}},
			PropagationMethod: kubevirtv1.SSHPublicKeyAccessCredentialPropagationMethod{NoCloud: &kubevirtv1.NoCloudSSHPublicKeyAccessCredentialPropagation{}},
		}}}
	}
	return nil
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
