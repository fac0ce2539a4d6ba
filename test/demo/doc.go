// Command demo runs imagepipe's whole pipeline on one machine, on 127.0.0.1 only, and explains
// each step as it goes: `make demo`.
//
// It starts the CNCF distribution registry (notifying image-gate and one image-syncer per hub),
// MinIO, and two hubs (etcd and kube-apiserver with the CDI, KubeVirt and BaseImage CRDs);
// uploads a real ext4 disk to MinIO as compressed qcow2 and imports it with imagectl import
// s3://... as tenant acme; shows the BaseImage, its digest-pinned ReadWriteMany DataVolume and its
// DataSource on both hubs; pushes with crane a containerDisk whose qcow2 names /etc/passwd and
// shows both hubs refusing it on the gate's signed verdict, which cosign then checks; publishes a
// VM template and creates a VM on hub-1; pushes a new version (the DataSource switches) and
// deletes the tag (hub-1 retains, hub-2 deletes); and stops everything. Every command it shows
// runs for real.
//
// CDI is real: every hub runs CDI's own controller, and its importer pods run CDI's own
// importer, as local processes of a node stand-in (test/nodestandin) that plays the one thing
// that cannot run here, a node. The demo says where the stand-in acts, and checks with qemu-img
// compare that the volume CDI imported holds the uploaded disk. KubeVirt's controllers do not
// run: VMs are stored, not booted.
//
// runDemo, on a harness.T, runs two ways: as this program, which owns the terminal (so imagectl
// draws its progress bars) and keeps the components' logs in $IMAGEPIPE_CACHE/demo/logs
// (~/.cache/imagepipe/demo/logs by default; the newest 10 runs); and as TestDemo in the short
// mode (a 32 MiB disk instead of 256 MiB), which make test runs. Both check every outcome the
// tour shows.
package main
