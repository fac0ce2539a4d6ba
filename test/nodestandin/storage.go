package nodestandin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// annProvisioner is how kube-controller-manager's persistent-volume controller hands a
	// claim to an external provisioner (and its older, beta spelling).
	annProvisioner     = "volume.kubernetes.io/storage-provisioner"
	annProvisionerBeta = "volume.beta.kubernetes.io/storage-provisioner"
	// annProvisionedBy marks the volumes a provisioner made, as external-provisioner does.
	annProvisionedBy = "pv.kubernetes.io/provisioned-by"
	// maxVolumeBytes bounds one claim's sparse backing file.
	maxVolumeBytes = 1 << 40
)

// wantsVolume reports whether claim waits for this node's provisioner.
func (n *Node) wantsVolume(claim *corev1.PersistentVolumeClaim) bool {
	if claim.Spec.VolumeName != "" || claim.Status.Phase != corev1.ClaimPending || claim.DeletionTimestamp != nil {
		return false
	}
	p := claim.Annotations[annProvisioner]
	if p == "" {
		p = claim.Annotations[annProvisionerBeta]
	}
	return p == n.cfg.Provisioner
}

// volumeName is the PersistentVolume made for a claim: pvc-UID, as external-provisioner names it.
func volumeName(claim *corev1.PersistentVolumeClaim) string { return "pvc-" + string(claim.UID) }

// provision makes claim's backing file and a PersistentVolume pre-bound to it.
func (n *Node) provision(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	name := volumeName(claim)
	if _, err := n.volumes.Get(name); err == nil {
		return nil // made already; the persistent-volume controller binds it
	}
	size, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok || size.Value() <= 0 || size.Value() > maxVolumeBytes {
		return fmt.Errorf("claim %s/%s requests %v of storage; the stand-in provisions 1 byte to 1 TiB", claim.Namespace, claim.Name, size.String())
	}
	mode := corev1.PersistentVolumeFilesystem
	if claim.Spec.VolumeMode != nil {
		mode = *claim.Spec.VolumeMode
	}
	file := filepath.Join(n.cfg.Dir, "volumes", name+".img")
	if err := makeBackingFile(ctx, file, size.Value(), mode); err != nil {
		return fmt.Errorf("provisioning %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annProvisionedBy: n.cfg.Provisioner}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   claim.Spec.AccessModes,
			VolumeMode:                    &mode,
			StorageClassName:              ptrValue(claim.Spec.StorageClassName),
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID,
			},
			// The backing file, which only this node's sandboxes open (through a loop device).
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: file}},
		},
	}
	if _, err := n.cfg.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		os.Remove(file)
		return fmt.Errorf("creating PersistentVolume %s: %w", name, err)
	}
	n.logf("provisioned %s (%s, %s) for claim %s/%s", name, mode, size.String(), claim.Namespace, claim.Name)
	return nil
}

// makeBackingFile makes a sparse file of size bytes: raw for Block, an ext4 filesystem for
// Filesystem, so that what runs on it sees the claim's capacity.
func makeBackingFile(ctx context.Context, file string, size int64, mode corev1.PersistentVolumeMode) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil // a previous attempt made it; the PersistentVolume create failed
	}
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && mode == corev1.PersistentVolumeFilesystem {
		// No journal, no reserved blocks and few inodes: a test's claims are MiBs, and this
		// leaves them about the share of usable space (96% at 1 MiB, over 99% from 4 MiB) that
		// ext4 leaves on a real volume of GiBs, which CDI's 5.5% filesystem overhead covers.
		err = run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", "-N", "16", "-O", "^has_journal,^resize_inode", file)
	}
	if err != nil {
		os.Remove(file)
	}
	return err
}

// reclaim deletes a released volume this node provisioned, file first, as the Delete reclaim
// policy says.
func (n *Node) reclaim(ctx context.Context, pv *corev1.PersistentVolume) error {
	if err := os.Remove(pv.Spec.HostPath.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	err := n.cfg.Client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pv.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PersistentVolume %s: %w", pv.Name, err)
	}
	n.logf("deleted released volume %s", pv.Name)
	return nil
}

// released reports whether pv is one of this node's volumes waiting to be deleted.
func (n *Node) released(pv *corev1.PersistentVolume) bool {
	return pv.Annotations[annProvisionedBy] == n.cfg.Provisioner && pv.Spec.HostPath != nil &&
		pv.Status.Phase == corev1.VolumeReleased && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete
}

// claimFile returns the backing file and volume mode of a bound claim on this node.
func (n *Node) claimFile(ctx context.Context, namespace, claim string) (string, corev1.PersistentVolumeMode, error) {
	c, err := n.cfg.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	if c.Status.Phase != corev1.ClaimBound || c.Spec.VolumeName == "" {
		return "", "", fmt.Errorf("claim %s/%s is %s, not bound", namespace, claim, c.Status.Phase)
	}
	pv, err := n.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	if pv.Annotations[annProvisionedBy] != n.cfg.Provisioner || pv.Spec.HostPath == nil {
		return "", "", fmt.Errorf("volume %s of claim %s/%s was not made by this node", pv.Name, namespace, claim)
	}
	mode := corev1.PersistentVolumeFilesystem
	if pv.Spec.VolumeMode != nil {
		mode = *pv.Spec.VolumeMode
	}
	return pv.Spec.HostPath.Path, mode, nil
}

// CopyClaimDisk copies the disk that CDI wrote to a bound claim into dst, sparse: the claim's
// whole device for a Block claim, its filesystem's disk.img for a Filesystem claim (CDI's
// layout). It is how a test compares an imported volume with its source.
func (n *Node) CopyClaimDisk(ctx context.Context, namespace, claim, dst string) error {
	file, mode, err := n.claimFile(ctx, namespace, claim)
	if err != nil {
		return err
	}
	if mode == corev1.PersistentVolumeBlock {
		return run(ctx, "cp", "--sparse=always", file, dst)
	}
	mnt, err := os.MkdirTemp(n.cfg.Dir, "mnt-")
	if err != nil {
		return err
	}
	defer os.Remove(mnt)
	// Mounted read-only in a mount namespace of its own, so the host never sees it.
	return run(ctx, "unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
		`mount -o ro,loop -t ext4 "$1" "$2" && cp --sparse=always "$2/disk.img" "$3"`, "copy", file, mnt, dst)
}

// loopDevice attaches file to a free loop device and returns its path.
func loopDevice(ctx context.Context, file string) (string, error) {
	out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", file).Output()
	if err != nil {
		return "", fmt.Errorf("attaching %s to a loop device: %w", file, exitDetail(err))
	}
	return strings.TrimSpace(string(out)), nil
}

// detachLoop detaches a loop device; once the sandbox's namespace is gone nothing holds it.
func detachLoop(dev string) error {
	if err := exec.Command("losetup", "--detach", dev).Run(); err != nil {
		return fmt.Errorf("detaching %s: %w", dev, exitDetail(err))
	}
	return nil
}

// run runs a command, returning its error output in the error when it fails.
func run(ctx context.Context, name string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// exitDetail adds a failed command's error output to its error.
func exitDetail(err error) error {
	var exit *exec.ExitError
	if errors.As(err, &exit) && len(exit.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(exit.Stderr))
	}
	return err
}

func ptrValue(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
