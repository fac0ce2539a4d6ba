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
// StorageClass), BindTenant applies config/tenant's RBAC to a hub user, and Syncer runs the
// image-syncer binary against a hub. CDI's controllers cannot run on a hub without nodes; the
// SyncerHub methods named PlayCDI* stand in for them, setting exactly the status image-syncer
// reads (a StorageProfile's claim property sets, a DataVolume's phase and its bound PVC), and
// nothing else.
//
// StartCutProxy adds a TCP proxy that cuts connections at chosen byte offsets, for tests of
// interrupted transfers.
package harness
