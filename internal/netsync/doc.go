// Package netsync provisions tenants' private networks on a hub, as part
// of image-syncer. For each PrivateNetwork it keeps, in the namespace
// tenantnet.Namespace names:
//
//   - the namespace itself, created with OVN-Kubernetes' primary-network
//     label and an annotation naming the network (a namespace of that name
//     made for anything else is reported, never used);
//   - the UserDefinedNetwork tenantnet.UDN describes;
//   - its share of the tenant's quota (quota.go): the ResourceQuota
//     imagepipe-network-share there, and imagepipe-home-share in the home,
//     so that the tenant's quota holds over all its namespaces;
//   - a RoleBinding of the tenant ClusterRole to every subject the
//     PrivateNetwork's own namespace binds it to, so that the tenant acts in
//     the network's namespace as at home and nobody else does. It comes
//     last: the tenant gets no access before its quota is in force.
//
// A subnet that overlaps a Reserved range or an older network of the same
// tenant gets nothing, and says so in the Ready condition; so does a
// network past its tenant's Bounds, or whose share does not fit.
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
// user-defined: on the pod network only addresses the host's own
// virt-launcher pod holds, on a private network only its subnet's. A
// Service of the same name it does not own is reported (ServiceUsed), never
// changed; hosts resolve in the LoadBalancer's own namespace only. A load
// balancer holds a Service, without NodePorts unless the provider allows
// them, only while a host it names exists and within its tenant's Bounds.
package netsync
