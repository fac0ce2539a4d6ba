// Package harness starts real components — the CNCF distribution registry, MinIO, and Kubernetes
// "hubs" (etcd + kube-apiserver with the real CDI, KubeVirt and instancetype CRDs) — on 127.0.0.1
// for imagepipe's integration tests, and stops them when the test ends.
//
// The binaries come from test/buildtools.sh (run by `make tools`); a test whose binary is missing
// is skipped with a message saying so. Every process runs with its output in a log file under
// t.TempDir(), printed with t.Logf only when the test failed, and is stopped in t.Cleanup:
// SIGTERM, then SIGKILL after 5 s.
//
// Each component runs in a process group of its own, so that a Ctrl-C on a terminal reaches only
// the test binary or the demo (test/demo), which then stops the components in order.
//
// StartSyncerHub prepares a hub as a provider prepares a real one for image-syncer (the BaseImage
// CRD, config/syncer's RBAC bound to the hub user "syncer", tenant namespaces, a default
// StorageClass whose CDI StorageProfile names its access and volume modes), BindTenant applies
// config/tenant's RBAC to a hub user, and Syncer runs the image-syncer binary against a hub.
//
// Every SyncerHub runs CDI for real (Hub.StartCDI, cdi.go): kube-controller-manager (garbage
// collection, persistent-volume binding, PVC protection), CDI's own controller (cdi-controller
// v1.64.0, in private mount and network namespaces), and a node stand-in (test/nodestandin) that
// plays the only part of a cluster that cannot run on these machines, a node: the storage
// provisioner of the hub's StorageClass (claims become sparse files, ext4 for Filesystem, loop
// devices for Block), the scheduler's one decision, and the kubelet, which runs each importer pod
// as a local process of CDI's real cdi-importer in private mount and PID namespaces and reports
// its phase, restarts and termination message. No test plays CDI's controller or importer.
// KubeVirt's controllers do not run, but Hub.StartKubeVirtAdmission (kubevirt.go) makes KubeVirt
// v1.8.0's own VirtualMachine admission code (kubevirt-admission, test/kubevirt) the hub's mutating
// and validating webhook, configured by a KubeVirt object shaped as a default OpenShift
// Virtualization install's or vanilla KubeVirt's, and asks it for the live-migration condition
// virt-handler would compute for a stored VM's instance.
//
// StartCutProxy adds a TCP proxy that cuts connections at chosen byte offsets, for tests of
// interrupted transfers.
package harness
