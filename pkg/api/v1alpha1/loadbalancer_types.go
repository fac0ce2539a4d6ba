package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons of a LoadBalancer's Ready condition.
const (
	ReasonExposed        = "Exposed"        // an external address serves ready hosts
	ReasonAddressPending = "AddressPending" // the hub has not assigned an external address yet
	ReasonNoReadyHosts   = "NoReadyHosts"   // no host runs with an address
	ReasonHostsMissing   = "HostsMissing"   // a named host is no VM of this namespace
	ReasonServiceUsed    = "ServiceUsed"    // a Service of that name exists and is not this load balancer's
	ReasonTenantLimit    = "TenantLimit"    // the tenant's older objects take its bound on this hub
)

// LoadBalancerPort maps one external port to a port of the hosts.
type LoadBalancerPort struct {
	// Port is the external port.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
	// TargetPort is the port on the hosts; it defaults to Port.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	TargetPort int32 `json:"targetPort,omitempty"`
	// Protocol is TCP (the default), UDP or SCTP.
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP
	// +kubebuilder:default=TCP
	Protocol string `json:"protocol"`
}

// Target is the port on the hosts: TargetPort, or Port when unset.
func (p LoadBalancerPort) Target() int32 {
	if p.TargetPort == 0 {
		return p.Port
	}
	return p.TargetPort
}

// LoadBalancerSpec is what the tenant asks for.
type LoadBalancerSpec struct {
	// Hosts names the VirtualMachines that serve the ports, in the load
	// balancer's namespace (so all on one network).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	Hosts []string `json:"hosts"`
	// Ports are the exposed ports; an external port is exposed once per
	// protocol.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=port
	// +listMapKey=protocol
	Ports []LoadBalancerPort `json:"ports"`
}

// LoadBalancerHost is one host as image-syncer last saw it.
type LoadBalancerHost struct {
	// Name is the VirtualMachine's.
	Name string `json:"name"`
	// IP is its address on its network, empty while it has none.
	// +optional
	IP string `json:"ip,omitempty"`
	// Ready is whether traffic goes to it: it runs, is ready and has an
	// address.
	Ready bool `json:"ready"`
}

// LoadBalancerStatus is what image-syncer made of it on this hub.
type LoadBalancerStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Addresses are the external addresses (IPs or host names) the hub
	// assigned to the load balancer's Service.
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// Hosts are the hosts, in spec order.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Hosts []LoadBalancerHost `json:"hosts,omitempty"`
	// Conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LoadBalancer exposes ports of a tenant's VMs outside their network.
// image-syncer keeps, of the same name and namespace, a Service of type
// LoadBalancer with no selector and an EndpointSlice holding the hosts'
// addresses; the hub's load-balancer implementation assigns the external
// address, which status.addresses reports. Tenants get no write access to
// Services, whose other fields (externalIPs, NodePorts, selectors) could
// take traffic meant for others.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lb,categories=imagepipe
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z]([a-z0-9-]*[a-z0-9])?$')",message="a load balancer's name is a DNS label of at most 63 characters that starts with a letter"
// +kubebuilder:printcolumn:name="Hosts",type=string,JSONPath=`.spec.hosts`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.addresses[0]`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LoadBalancer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LoadBalancerSpec   `json:"spec"`
	Status LoadBalancerStatus `json:"status,omitempty"`
}

// LoadBalancerList is a list of LoadBalancers.
//
// +kubebuilder:object:root=true
type LoadBalancerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LoadBalancer `json:"items"`
}
