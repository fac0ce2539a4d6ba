// Package v1alpha1 holds the imagepipe.io/v1alpha1 API: the BaseImage
// resource that the image-syncer keeps on each hub, one per tenant image
// tag, and reports the state of its replication in; and the PrivateNetwork
// a tenant creates and the image-syncer provisions as an OVN-Kubernetes
// network with a namespace of its own.
//
// +kubebuilder:object:generate=true
// +groupName=imagepipe.io
package v1alpha1
