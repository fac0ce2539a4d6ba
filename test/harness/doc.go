// Package harness starts real components — the CNCF distribution registry, MinIO, and Kubernetes
// "hubs" (etcd + kube-apiserver with the real CDI, KubeVirt and instancetype CRDs) — on 127.0.0.1
// for imagepipe's integration tests, and stops them when the test ends.
//
// The binaries come from test/buildtools.sh (run by `make tools`); a test whose binary is missing
// is skipped with a message saying so. Every process runs with its output in a log file under
// t.TempDir(), printed with t.Logf only when the test failed, and is stopped in t.Cleanup:
// SIGTERM, then SIGKILL after 5 s.
//
// StartCutProxy adds a TCP proxy that cuts connections at chosen byte offsets, for tests of
// interrupted transfers.
package harness
