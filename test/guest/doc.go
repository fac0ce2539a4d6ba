// Package guest boots real guests under QEMU: the disks test/guests.sh
// builds from Debian packages (make tools), on throwaway overlays. Its
// test gives a real Debian guest's cloud-init the NoCloud seed KubeVirt
// would make from a VirtualMachine `imagectl vm create --ssh-key` created
// on a real kube-apiserver, and logs in with the tenant's key over SSH: the
// VM half of imagepipe meeting a real guest; the guest's agent answers on
// the port KubeVirt gives every VM. KubeVirt's virt-launcher is played by
// a few lines that make its seed and that port; QEMU, cloud-init, OpenSSH
// and the guest agent are real. The gate's boot check (internal/bootcheck,
// image-gate --boot-check) boots the same guest. `make integration` runs
// this package alone, after the others: under TCG a guest's pace is the
// CPU QEMU gets.
package guest
