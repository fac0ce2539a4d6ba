// Package kube is the small Kubernetes client imagectl uses on a hub: get,
// list, create, merge-patch and delete typed objects (VMs, DataVolumes,
// BaseImages, StorageProfiles, ...) through client-go's dynamic client,
// converting to and from the types registered in a scheme.
//
// It exists so that the tenant CLI links client-go only, not
// controller-runtime and the Prometheus client it brings: the hub side
// (internal/hub) keeps controller-runtime for its manager and caches.
// Callers define the interface they need (vmlaunch.Cluster,
// cdi.Reader); *Client satisfies them.
package kube
