// Package syncer tests image-syncer as a provider runs it: the built
// binary against the real CNCF distribution registry (and zot where access
// control matters) and real hubs (etcd and kube-apiserver with the CDI and
// KubeVirt CRDs), through webhooks, polling, failures, tenancy, ownership,
// several replicas and VMs launched from the images it serves.
package syncer
