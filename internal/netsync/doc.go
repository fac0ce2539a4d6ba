// Package netsync provisions tenants' private networks on a hub, as part
// of image-syncer. For each PrivateNetwork it keeps, in the namespace
// tenantnet.Namespace names:
//
//   - the namespace itself, created with OVN-Kubernetes' primary-network
//     label and an annotation naming the network (a namespace of that name
//     made for anything else is reported, never used);
//   - the UserDefinedNetwork tenantnet.UDN describes;
//   - a RoleBinding of the tenant ClusterRole to every subject the
//     PrivateNetwork's own namespace binds it to, so that the tenant acts in
//     the network's namespace as at home and nobody else does.
//
// A subnet that overlaps a Reserved range or an older network of the same
// tenant gets nothing, and says so in the Ready condition.
//
// The status counts the VirtualMachines in the namespace (condition InUse).
// A PrivateNetwork being deleted keeps its finalizer while any VM is
// there; then its namespace is deleted, and once that is gone the
// finalizer goes. The status is written only when it changes.
//
// LoadBalancers (the type of that name) exposes VMs: for each LoadBalancer
// it keeps a Service of type LoadBalancer without a selector and an
// EndpointSlice on the addresses of the hosts' VirtualMachineInstances,
// in the form OVN-Kubernetes reads in a namespace whose primary network is
// user-defined. A Service of the same name it does not own is reported
// (ServiceUsed), never changed; hosts resolve in the LoadBalancer's own
// namespace only.
package netsync
