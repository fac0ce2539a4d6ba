// Command demo runs imagepipe's whole pipeline on one machine, on 127.0.0.1 only, and explains
// each step as it goes: `make demo`.
//
// It starts the CNCF distribution registry (notifying image-gate and one image-syncer per hub), MinIO, and two
// hubs (etcd and kube-apiserver with the CDI, KubeVirt and BaseImage CRDs); makes a sample
// disk with mkfs.ext4 -d from real files and uploads it, as compressed qcow2, to MinIO; runs
// image-syncer on each hub; imports the disk with imagectl import s3://... as tenant acme;
// shows the BaseImage, its digest-pinned ReadWriteMany DataVolume and its DataSource on both
// hubs with kubectl; pushes with crane a containerDisk whose qcow2 names /etc/passwd and shows
// both hubs refusing it on the gate's signed verdict, which cosign then checks; publishes a VM template and creates a VM on hub-1 with imagectl vm
// create; pushes a new version (the DataSource switches) and deletes the tag (hub-1 retains,
// hub-2 deletes); and stops everything. Every command it shows runs for real.
//
// CDI is real: every hub runs CDI's own controller, and its importer pods run CDI's own
// importer, as local processes of a node stand-in (test/nodestandin) that plays the one thing
// that cannot run here, a node: it provisions claims as sparse files and runs pods in private
// namespaces. The demo says where the stand-in acts, and checks with qemu-img compare that the
// volume CDI imported holds the uploaded disk. KubeVirt's controllers do not run: VMs are stored,
// not booted.
//
// # Design
//
// The demo is one function, runDemo, that takes a harness.T, so that it can use test/harness
// as the integration tests do, and run two ways:
//
//   - As this program (make demo: go build -o bin/demo ./test/demo, then bin/demo). It owns
//     the terminal, so imagectl, which draws its progress bars only when stderr is a
//     terminal, shows them. A minimal harness.T (runner.go) carries the harness's cleanups
//     and failures. SIGINT and SIGTERM cancel the demo's context: the step under way stops,
//     the cleanups stop every server newest first (SIGTERM, then SIGKILL after 5 s), the logs
//     are kept, and the program exits with 128+signal. The servers run in process groups of
//     their own, so a Ctrl-C on the terminal reaches only the demo, which stops them in
//     order; and with a parent-death signal, so that even a SIGKILL of the demo takes them
//     along. The components' logs are copied to ~/.cache/imagepipe/demo/logs/TIME/
//     ($IMAGEPIPE_CACHE/demo/logs/TIME when set; the newest 10 runs are kept).
//   - As TestDemo, in the short mode (a 32 MiB disk instead of 256 MiB), with go test, so that
//     make test runs it and CI catches the demo rotting. Every outcome the tour shows is also
//     checked, in both modes.
//
// A compiled test binary would own the terminal as well, but it would end with the testing
// package's PASS or FAIL, print the servers' log tails on an interrupt, and exit 0 when a
// tool is missing (a skip); the program says what happened instead, and exits 1 when it
// cannot run.
package main
