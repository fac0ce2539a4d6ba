package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types and reasons of a PrivateNetwork.
const (
	// ConditionInUse is True while VirtualMachines run on the network; a
	// network being deleted waits for them to go.
	ConditionInUse = "InUse"

	ReasonProvisioned   = "Provisioned"   // namespace, UDN and access are in place
	ReasonSubnetInvalid = "SubnetInvalid" // the subnet overlaps another or a reserved range
	ReasonNameTooLong   = "NameTooLong"   // the namespace it needs would exceed 63 characters
	ReasonNamespaceUsed = "NamespaceUsed" // the namespace exists and is not this network's
	ReasonNotHome       = "NotHome"       // made in a network's namespace, not the tenant's own
	ReasonNetworkError  = "NetworkError"  // OVN-Kubernetes refused or has not created the UDN
	ReasonQuotaPending  = "QuotaPending"  // the quotas of the network and its home are being set
	ReasonQuotaTooLarge = "QuotaTooLarge" // the network's share does not fit in what its home leaves
	ReasonVMsPresent    = "VMsPresent"    // InUse: VMs run on the network
	ReasonNoVMs         = "NoVMs"         // InUse: none does
)

// FinalizerPrivateNetwork holds a PrivateNetwork being deleted until no
// VirtualMachine uses it and its namespace is gone.
const FinalizerPrivateNetwork = "imagepipe.io/private-network"

// PrivateNetworkSpec is what the tenant asks for.
type PrivateNetworkSpec struct {
	// IPv4CIDR is the network's subnet: an IPv4 network address with a
	// prefix length from 8 to 29, such as 10.10.0.0/24. It cannot change.
	// +kubebuilder:validation:MaxLength=18
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4 && cidr(self).prefixLength() >= 8 && cidr(self).prefixLength() <= 29 && string(cidr(self).masked()) == self",message="ipv4Cidr must be an IPv4 network address with a prefix length from 8 to 29, such as 10.10.0.0/24"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="ipv4Cidr cannot change"
	IPv4CIDR string `json:"ipv4Cidr"`
	// Quota is the share of the tenant's quota the network's namespace may
	// use, by ResourceQuota resource name (count/virtualmachines.kubevirt.io,
	// requests.cpu, requests.memory, ...). Of what the quotas of the home
	// namespace bound, the network gets its share and the home keeps the
	// rest, so that the tenant's VMs over all its namespaces stay within
	// them; a bounded resource the share does not name is 0 on the network.
	// It cannot change.
	// +kubebuilder:validation:XValidation:rule="size(self) <= 16",message="quota names at most 16 resources"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="quota cannot change"
	// +optional
	Quota corev1.ResourceList `json:"quota,omitempty"`
}

// PrivateNetworkStatus is what image-syncer made of it on this hub.
type PrivateNetworkStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Namespace is where the network's VMs live: its primary network is
	// the network.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// VirtualMachines names the VMs on the network, sorted (at most 50;
	// VirtualMachineCount counts them all).
	// +kubebuilder:validation:MaxItems=50
	// +optional
	VirtualMachines []string `json:"virtualMachines,omitempty"`
	// VirtualMachineCount is how many VMs are on the network.
	// +optional
	VirtualMachineCount int32 `json:"virtualMachineCount,omitempty"`
	// Conditions: Ready and InUse.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PrivateNetwork is a tenant's private layer-2 network on a hub. Its
// VirtualMachines live in a namespace of its own (status.namespace), whose
// primary network is an OVN-Kubernetes UserDefinedNetwork of topology
// Layer2 on spec.ipv4Cidr with persistent IP addresses, so that they keep
// their addresses when they live-migrate. image-syncer makes the namespace
// and the network, and grants the tenant there what it has in the
// namespace of the PrivateNetwork.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pnet,categories=imagepipe
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 40 && self.metadata.name.matches('^[a-z]([a-z0-9-]*[a-z0-9])?$')",message="a network's name is a DNS label of at most 40 characters that starts with a letter"
// +kubebuilder:printcolumn:name="Subnet",type=string,JSONPath=`.spec.ipv4Cidr`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.status.namespace`
// +kubebuilder:printcolumn:name="VMs",type=integer,JSONPath=`.status.virtualMachineCount`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PrivateNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PrivateNetworkSpec   `json:"spec"`
	Status PrivateNetworkStatus `json:"status,omitempty"`
}

// PrivateNetworkList is a list of PrivateNetworks.
//
// +kubebuilder:object:root=true
type PrivateNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PrivateNetwork `json:"items"`
}
