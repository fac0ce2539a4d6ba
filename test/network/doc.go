// Package network tests the OVN-Kubernetes network CRDs that imagepipe's
// tests load as fixtures (test/crds/ovn-kubernetes: UserDefinedNetwork and
// ClusterUserDefinedNetwork, k8s.ovn.org/v1) on a real hub: the API server
// installs them, stores well-formed networks with their fields, and enforces
// upstream's CEL rules with upstream's messages.
package network
