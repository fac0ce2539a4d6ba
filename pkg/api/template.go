package api

// VM templates: documents a provider publishes (imagectl template publish)
// and tenants render into KubeVirt VirtualMachines (imagectl vm create).

// TemplateArtifactType is the OCI artifact type of a published template;
// its single layer is the template as JSON (TemplateMediaType).
const (
	TemplateArtifactType = "application/vnd.imagepipe.vmtemplate.v1+json"
	TemplateMediaType    = "application/vnd.imagepipe.vmtemplate.v1+json"
	// DefaultTemplateRepository is the catalog repository under the registry.
	DefaultTemplateRepository = "templates"
	// MaxTemplateSize bounds a template document, in bytes.
	MaxTemplateSize = 256 << 10
	// MaxTemplateParameters bounds the parameters of one template.
	MaxTemplateParameters = 64
)

// VMTemplate is a provider's recipe for a VM: parameters a tenant may set,
// and where each one goes in the VM. The shape follows the VM-fulfilment
// catalogs providers already keep (id, title, description, parameters with
// defaults), plus an optional vm section binding parameters to fields.
type VMTemplate struct {
	// ID names the template in the catalog: lower-case letters, digits,
	// '_' and '-', at most 63 characters.
	ID          string `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description,omitempty"`
	// Parameters are what a tenant may set with --set NAME=VALUE.
	Parameters []Parameter `json:"parameters,omitempty"`
	// VM binds parameters and fixed values to the VM's fields. Without it,
	// parameters bind by their conventional names (DefaultBindings).
	VM *VMBindings `json:"vm,omitempty"`
}

// ParameterType is the type of a parameter's value.
type ParameterType string

// Parameter types. A parameter without a type takes the type of its default.
const (
	TypeInteger  ParameterType = "integer"
	TypeString   ParameterType = "string"
	TypeQuantity ParameterType = "quantity" // a Kubernetes quantity: 2Gi, 500M
	TypeBoolean  ParameterType = "boolean"
)

// Parameter is one value a tenant may set.
type Parameter struct {
	Name        string        `json:"name"`
	Description string        `json:"description,omitempty"`
	Type        ParameterType `json:"type,omitempty"`
	Default     *Default      `json:"default,omitempty"`
	// Required parameters have no default and must be set.
	Required bool `json:"required,omitempty"`
	// Enum lists the allowed values.
	Enum []any `json:"enum,omitempty"`
	// Min and Max bound integers and quantities (inclusive).
	Min any `json:"min,omitempty"`
	Max any `json:"max,omitempty"`
}

// Default holds a parameter's default value.
type Default struct {
	Value any `json:"value"`
}

// VMBindings are the VM fields a template may set. Every field is a
// literal value or a reference "${NAME}" to one parameter, never free-form
// KubeVirt YAML: a template can only fill the places listed here.
type VMBindings struct {
	CPUCores     string `json:"cpuCores,omitempty"`     // integer
	Memory       string `json:"memory,omitempty"`       // quantity
	DiskSize     string `json:"diskSize,omitempty"`     // quantity: the root disk's minimum size
	Instancetype string `json:"instancetype,omitempty"` // a VirtualMachineClusterInstancetype
	Preference   string `json:"preference,omitempty"`   // a VirtualMachineClusterPreference
	// Network names a Multus NetworkAttachmentDefinition in the VM's
	// namespace for the VM's only interface; empty means the pod network.
	Network string `json:"network,omitempty"`
	// Localnets names provider-defined localnets the VM attaches to as
	// secondary interfaces: OVN-Kubernetes ClusterUserDefinedNetworks of
	// topology Localnet, by name. An entry may be a parameter; one that
	// resolves to "" attaches nothing.
	Localnets []string `json:"localnets,omitempty"`
	// GPUs and HostDevices pass devices through; a VM with any cannot
	// live-migrate.
	GPUs        []DeviceBinding `json:"gpus,omitempty"`
	HostDevices []DeviceBinding `json:"hostDevices,omitempty"`
	// UserData is the default cloud-init user data; --user-data replaces it.
	UserData string `json:"userData,omitempty"`
	// Firmware pins the VM's firmware: FirmwareBIOS, FirmwareEFI (Secure
	// Boot off) or FirmwareEFISecureBoot (Secure Boot on, with SMM). Unset
	// or empty, vm create boots the disk with the firmware image-syncer
	// found it needs; a firmware the disk cannot boot with is refused.
	Firmware string `json:"firmware,omitempty"`
	// DiskBus pins the bus of the VM's disks: virtio, sata or scsi. Unset
	// or empty, vm create uses virtio, or sata for an image whose guest is
	// known to lack virtio block drivers.
	DiskBus string `json:"diskBus,omitempty"`
}

// Firmware values of VMBindings.Firmware.
const (
	FirmwareBIOS          = "bios"
	FirmwareEFI           = "efi"
	FirmwareEFISecureBoot = "efi-secureboot"
)

// DeviceBinding is one passed-through device.
type DeviceBinding struct {
	Name       string `json:"name"`
	DeviceName string `json:"deviceName"` // resource name, e.g. nvidia.com/GA102GL_A10
}

// DefaultBindings binds parameters by conventional name when a template
// has no vm section; the parameters present decide which fields are set.
var DefaultBindings = VMBindings{
	CPUCores:     "${vm_cpu_cores}",
	Memory:       "${vm_memory}",
	DiskSize:     "${vm_disk_size}",
	Instancetype: "${vm_instancetype}",
	Preference:   "${vm_preference}",
	Network:      "${vm_network}",
	GPUs:         []DeviceBinding{{Name: "gpu0", DeviceName: "${vm_gpu}"}},
	UserData:     "${vm_user_data}",
	Firmware:     "${vm_firmware}",
	DiskBus:      "${vm_disk_bus}",
}

// TemplateSummary is one line of `imagectl template list -o json`.
type TemplateSummary struct {
	ID          string `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description,omitempty"`
	Parameters  int    `json:"parameters"`
	Digest      string `json:"digest"`
	// Reference is the template's catalog entry, REGISTRY/REPO:ID.
	Reference string `json:"reference,omitempty"`
}

// PublishResult is one template of `imagectl template publish -o json`.
type PublishResult struct {
	ID     string `json:"id"`
	File   string `json:"file"`
	Digest string `json:"digest"`
	// Unchanged is true when the catalog already held this exact template.
	Unchanged bool `json:"unchanged"`
	// Reference is the template's catalog entry, REGISTRY/REPO:ID.
	Reference string `json:"reference,omitempty"`
}

// TemplateDeleteResult is what `imagectl template delete -o json` prints.
type TemplateDeleteResult struct {
	ID string `json:"id"`
	// Reference is the catalog entry deleted, REGISTRY/REPO:ID.
	Reference string `json:"reference"`
	// Digest is the digest of the template's manifest, which the registry
	// deleted.
	Digest string `json:"digest"`
}

// VMSummary is one VM in `imagectl vm list -o json` and `vm get -o json`.
type VMSummary struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Network is the tenant's private network the VM is on (its namespace
	// is the network's), empty on the pod network of the tenant's namespace.
	Network string `json:"network,omitempty"`
	// Status is KubeVirt's printable status (Running, Stopped, ...).
	Status   string `json:"status"`
	Image    string `json:"image,omitempty"`
	Digest   string `json:"digest,omitempty"`
	Template string `json:"template,omitempty"`
	// OS is the operating system of the image the VM was made from, as
	// the gate found it (os-release's PRETTY_NAME), when known.
	OS string `json:"os,omitempty"`
	// IP and Node come from the running instance, when KubeVirt reports them.
	IP   string `json:"ip,omitempty"`
	Node string `json:"node,omitempty"`
	// ExternalIPs are the external addresses of the load balancers that
	// expose the VM (imagectl vm expose).
	ExternalIPs []string `json:"externalIPs,omitempty"`
	// LiveMigratable is KubeVirt's verdict on the running instance, else
	// the one vm create made: true or false, and null (the key is always
	// there) when neither is known, e.g. for a VM made by another tool
	// that has no running instance, or while KubeVirt's own verdict is
	// Unknown.
	LiveMigratable *bool    `json:"liveMigratable"`
	Reasons        []string `json:"reasons,omitempty"`
	// Volumes are the attached data volumes (root disk excluded).
	Volumes []string `json:"volumes,omitempty"`
	// Conditions are the VM's state as the service shows it: Ready,
	// Progressing, Failed and Degraded, in that order (docs/vm.md).
	Conditions []VMCondition `json:"conditions"`
}

// VM condition types, the values of VMCondition.Type.
const (
	VMConditionReady       = "Ready"
	VMConditionProgressing = "Progressing"
	VMConditionFailed      = "Failed"
	VMConditionDegraded    = "Degraded"
)

// VMCondition is one of a VM's conditions: Status is "True" or "False",
// Reason a CamelCase word (KubeVirt's status or condition reason) and
// Message, when there is one, what KubeVirt says.
type VMCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// LastTransitionTime is when KubeVirt last saw the condition change
	// (RFC 3339), when KubeVirt's own condition behind it says.
	LastTransitionTime string `json:"lastTransitionTime,omitempty"`
}

// VM actions, the values of VMResult.Action.
const (
	VMActionStart   = "start"
	VMActionStop    = "stop"
	VMActionRestart = "restart"
	VMActionDelete  = "delete"
	VMActionMigrate = "migrate"
	// VMActionCancelMigration: vm migrate --cancel.
	VMActionCancelMigration = "cancel-migration"
	VMActionUpdate          = "update"
	VMActionAttachVolume    = "attach-volume"
	VMActionDetachVolume    = "detach-volume"
)

// VMChange is one field vm update changed, as JSON, and when it applies.
type VMChange struct {
	Field string `json:"field"`
	From  string `json:"from"`
	To    string `json:"to"`
	// When is VMChangeLive, VMChangeAtRestart or VMChangeAtStart.
	When string `json:"when"`
}

// When a change vm update made applies.
const (
	VMChangeLive      = "live"    // KubeVirt applies it to the running VM
	VMChangeAtRestart = "restart" // at the running VM's next restart
	VMChangeAtStart   = "start"   // the VM is not running: when it starts
)

// VMResult is what the vm commands that act on one VM print under -o json
// or yaml: vm start, stop, restart, delete, migrate, attach-volume and
// detach-volume. The fields after Changed are set by the commands they
// name.
type VMResult struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Action is the command, one of the VMAction constants.
	Action string `json:"action"`
	// Changed is false when the VM already was as asked and nothing was
	// written: vm start of a VM set to run, vm stop of one halted,
	// attaching a volume already attached or detaching one that is not.
	Changed bool `json:"changed"`
	// RunStrategy is the VM's run strategy after vm start or vm stop
	// (Always or Halted).
	RunStrategy string `json:"runStrategy,omitempty"`
	// Volume is the data volume attach-volume or detach-volume named.
	Volume string `json:"volume,omitempty"`
	// Pending is true when a volume change takes effect only when the VM
	// next starts, because it may be running.
	Pending bool `json:"pending,omitempty"`
	// Changes are what vm update changed.
	Changes []VMChange `json:"changes,omitempty"`
	// Migration is the VirtualMachineInstanceMigration vm migrate created,
	// or with --cancel the first it cancelled.
	Migration string `json:"migration,omitempty"`
	// KeptVolumes are the data volumes attached to a VM vm delete deleted;
	// they stay.
	KeptVolumes []string `json:"keptVolumes,omitempty"`
}

// VolumeSummary is one data volume in `imagectl volume list -o json`, and
// what `imagectl volume create -o json` prints.
type VolumeSummary struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Size is the requested size, e.g. "50Gi".
	Size        string   `json:"size"`
	AccessModes []string `json:"accessModes,omitempty"`
	// Phase is CDI's phase of the volume (empty until CDI reports one).
	Phase string `json:"phase,omitempty"`
	// VolumeMode is Block or Filesystem, when the volume names one.
	VolumeMode string `json:"volumeMode,omitempty"`
	// StorageClass is the volume's StorageClass, when it names one.
	StorageClass string `json:"storageClass,omitempty"`
}

// VolumeDeleteResult is what `imagectl volume delete -o json` prints.
type VolumeDeleteResult struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// AttachedTo are the VMs that still list the volume, which --force
	// deleted anyway: they cannot start until it is detached.
	AttachedTo []string `json:"attachedTo,omitempty"`
}
