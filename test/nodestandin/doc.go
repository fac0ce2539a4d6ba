// Package nodestandin plays the one part of a Kubernetes cluster that cannot run on imagepipe's
// test machines, a node, so that CDI's real controller and importer can import DataVolumes on a
// test hub (etcd + kube-apiserver + kube-controller-manager). It is test code only; nothing in
// cmd/ or internal/ imports it.
//
// A Node plays exactly these roles, and nothing else:
//
//   - the storage provisioner of one StorageClass provisioner name (storage.go): each claim
//     becomes a sparse file of the requested size (ext4 for Filesystem claims, raw for Block)
//     and a PersistentVolume pre-bound to it; a released volume is deleted with its file;
//   - the scheduler's one decision on a one-node cluster: a pending pod whose claims are all
//     bound is bound to this node;
//   - the kubelet (kubelet.go): it runs a pod's single container as a local process of the
//     binary its image names (Config.Images), with its environment and volumes, in a sandbox of
//     private mount and PID namespaces (sandbox.go), as its runAsUser and never as root, and
//     reports the pod's status, restarts and termination message as kubelet does.
//
// The sandbox shares the host's network namespace and applies no cgroup limits, seccomp profile
// or capability set beyond dropping root. A pod with init containers or more than one container
// is marked Failed with a message saying the stand-in does not run it. docs/security.md ("What
// the tests run, and the node stand-in") says how closely each role follows the real one.
package nodestandin
