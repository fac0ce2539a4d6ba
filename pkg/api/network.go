package api

// Network is one private network as `imagectl network list|get -o
// json|yaml` prints it: a PrivateNetwork and what the hub made of it.
type Network struct {
	// Name is the network's name.
	Name string `json:"name"`
	// Namespace is the tenant's namespace, where the PrivateNetwork is.
	Namespace string `json:"namespace"`
	// Subnet is its IPv4 subnet, e.g. "10.10.0.0/24".
	Subnet string `json:"subnet"`
	// VMNamespace is where its VMs live (vm create --network puts them
	// there); empty until the hub made it.
	VMNamespace string `json:"vmNamespace,omitempty"`
	// Ready is "True" once the hub provisioned the network, "False" when
	// it could not (Reason and Message say why), "Unknown" before.
	Ready string `json:"ready"`
	// Reason and Message are those of the Ready condition.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// VMs names the VMs on the network (at most 50; VMCount counts all).
	VMs     []string `json:"vms,omitempty"`
	VMCount int32    `json:"vmCount"`
	// Deleting is true once deletion was asked; the network goes when no
	// VM uses it.
	Deleting bool `json:"deleting,omitempty"`
}

// Exposure is a load balancer that exposes ports of VMs outside their
// network, as imagectl vm expose and vm get -o json|yaml print it.
type Exposure struct {
	// Name is the LoadBalancer's name; Namespace is the VMs'.
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Network is the tenant's private network the load balancer's VMs are
	// on, empty on the pod network of the tenant's namespace.
	Network string `json:"network,omitempty"`
	// Hosts names the VMs that serve the ports.
	Hosts []string `json:"hosts"`
	// Ports are the mappings, EXTERNAL:INTERNAL/PROTOCOL, e.g. "80:8080/TCP".
	Ports []string `json:"ports"`
	// Addresses are the external addresses, once the hub assigned them.
	Addresses []string `json:"addresses,omitempty"`
	// Ready is "True" once an address serves ready hosts, "False" with
	// Reason and Message when not, "Unknown" before the hub looked.
	Ready   string `json:"ready"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}
