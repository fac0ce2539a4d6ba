// Package netsync provisions tenants' private networks and load balancers
// on a hub, as part of image-syncer.
//
// For each PrivateNetwork it keeps, in the namespace tenantnet.Namespace
// names: the namespace (created with OVN-Kubernetes' primary-network label
// and an annotation naming the network; one made for anything else is
// reported, never used), the UserDefinedNetwork tenantnet.UDN describes,
// the network's share of the tenant's quota (quota.go), and last, once that
// quota is in force, a RoleBinding of the tenant ClusterRole to whoever the
// network's home binds it to. A network with a bad subnet, past its
// tenant's Bounds or whose share does not fit gets nothing and says why in
// its Ready condition. One being deleted keeps its finalizer while any VM
// is on it, then goes with its namespace.
//
// For each LoadBalancer it keeps a Service of type LoadBalancer without a
// selector (and without NodePorts unless the provider allows them) and an
// EndpointSlice on its hosts' addresses, only while a host it names exists
// and within its tenant's Bounds. An address is used only if the host's
// own virt-launcher pod holds it (pod network) or it is in the network's
// subnet (private network). Hosts resolve in the LoadBalancer's own
// namespace; a Service of the same name it does not own is never changed.
package netsync
