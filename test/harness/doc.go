// Package harness starts real components — the CNCF distribution registry, MinIO, and Kubernetes
// "hubs" (etcd + kube-apiserver with the real CDI, KubeVirt and instancetype CRDs) — on 127.0.0.1
// for imagepipe's integration tests, and stops them when the test ends.
//
// The binaries come from test/buildtools.sh (run by `make tools`); a test whose binary is missing
// is skipped with a message saying so. Every process runs with its output in a log file under
// t.TempDir(), printed with t.Logf only when the test failed, in a process group of its own (so
// that a Ctrl-C on a terminal reaches only the test binary or test/demo, which stop the
// components in order), and is stopped in t.Cleanup: SIGTERM, then SIGKILL after 5 s.
//
// StartSyncerHub prepares a hub as a provider prepares a real one for image-syncer, BindTenant
// applies config/tenant's RBAC to a hub user, and Syncer runs the image-syncer binary against a
// hub. A SyncerHub runs CDI for real (Hub.StartCDI; not with SyncerHubOptions.NoCDI):
// kube-controller-manager, CDI's own controller and importer, and a node stand-in
// (test/nodestandin) for the one part of a cluster that cannot run here, a node. No test plays
// CDI. KubeVirt's controllers do not run: its own
// admission code does (Hub.StartKubeVirtAdmission), and virtcontroller.go plays virt-controller
// and virt-handler's live-migration condition. docs/security.md ("What the tests run, and the
// node stand-in") says what each plays and how closely.
//
// StartCutProxy adds a TCP proxy that cuts connections at chosen byte offsets, for tests of
// interrupted transfers.
package harness
