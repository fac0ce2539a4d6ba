// Package nodestandin plays the one part of a Kubernetes cluster that cannot run on imagepipe's
// test machines, a node, so that CDI's real controller and importer can import DataVolumes on a
// test hub (etcd + kube-apiserver + kube-controller-manager). It is test code only; nothing in
// cmd/ or internal/ imports it.
//
// A Node plays exactly these roles, and nothing else:
//
//   - The storage provisioner of one StorageClass provisioner name. For every claim that
//     kube-controller-manager's persistent-volume controller marks for that provisioner, it makes
//     a sparse backing file of the requested size — an ext4 filesystem for Filesystem claims
//     (mkfs.ext4 without a journal, so the importer sees about the capacity a real volume of
//     that size offers), raw for Block claims — and
//     creates a PersistentVolume pre-bound to the claim, as an external provisioner does. The
//     persistent-volume controller then binds them. A released volume (reclaim policy Delete) is
//     deleted with its file.
//   - The scheduler's one decision on a one-node cluster: a pending pod whose claims are all
//     bound is bound to this node.
//   - The kubelet, for pods bound to this node: it runs the pod's single container as a local
//     process of the binary its image names (Config.Images; any other image waits in
//     ErrImagePull), with the container's environment (values and secret or config map keys)
//     and its volumes, and reports the pod's phase, container state, restart count and
//     termination message the way kubelet does (terminationMessagePolicy
//     FallbackToLogsOnError included). restartPolicy OnFailure and Always restart a failed
//     container after a back-off; a pod being deleted has its process killed and is then
//     removed, as kubelet's final delete does.
//
// Each container runs in a sandbox (see sandbox.go): private mount and PID namespaces, chrooted
// into a tmpfs root holding read-only binds of the host's /usr, /etc and /sys, a fresh /proc, a
// /dev with only null, zero, full, random, urandom and the pod's block devices, a private /tmp,
// and the pod's volumes (claims mounted from their loop devices, config maps and secrets written
// as files). It runs as the container's runAsUser, with the pod's fsGroup applied to its volumes
// as kubelet does. It shares the host's network namespace, so that it reaches the test's
// registry on 127.0.0.1; no cgroup limits, seccomp profile or capability set is applied beyond
// dropping root. Pods with init containers or more than one container are marked Failed with a
// message saying the stand-in does not run them.
package nodestandin
