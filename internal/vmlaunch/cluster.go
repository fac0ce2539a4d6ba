package vmlaunch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/imageref"
	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Annotations recording vm create's live-migration verdict.
const (
	AnnotationLiveMigratable = "imagepipe.io/live-migratable"
	AnnotationNotMigratable  = "imagepipe.io/not-migratable-reasons"
	// LabelPrimaryUDN is OVN-Kubernetes' label on a namespace whose
	// primary network is a user defined network.
	LabelPrimaryUDN = tenantnet.LabelPrimaryUDN
)

// Cluster is what vmlaunch needs of a hub: reading, creating, patching
// and deleting typed objects. imagectl's kube.Client implements it.
type Cluster interface {
	cdi.Reader
	// Create creates obj and reads the created object back into it.
	Create(ctx context.Context, obj runtime.Object) error
	// MergePatch sends the merge patch from before to after and reads the
	// result into after.
	MergePatch(ctx context.Context, before, after runtime.Object) error
	// Delete deletes obj, its dependents first when foreground is set.
	Delete(ctx context.Context, obj runtime.Object, foreground bool) error
}

// ParseImageRef splits "TENANT/IMAGE[:TAG]" (tag default "latest").
func ParseImageRef(s string) (tenant, repository, tag string, err error) {
	tenant, repository, tag, err = imageref.ParseTenantImage(s)
	if err != nil {
		return "", "", "", fmt.Errorf("image %q: want TENANT/IMAGE[:TAG]: %w", s, err)
	}
	if tag == "" {
		tag = "latest"
	}
	return tenant, repository, tag, nil
}

// ErrNotSynced is what SyncedImage returns for an image that has no
// BaseImage of its own in the namespace.
var ErrNotSynced = errors.New("not synced")

// SyncedImage reads the BaseImage of ref ("TENANT/IMAGE[:TAG]") in ns. A
// BaseImage by that name made for another tenant, repository or tag (by
// hand) is not ref's: that, and no BaseImage at all, is ErrNotSynced.
func SyncedImage(ctx context.Context, c cdi.Reader, ns, ref string) (*v1alpha1.BaseImage, error) {
	tenant, repo, tag, err := ParseImageRef(ref)
	if err != nil {
		return nil, err
	}
	var bi v1alpha1.BaseImage
	err = c.Get(ctx, ns, cdi.BaseImageName(repo, tag), &bi)
	if apierrors.IsNotFound(err) || (err == nil && (bi.Spec.Tenant != tenant || !strings.HasSuffix(bi.Spec.Repository, "/"+repo) || bi.Spec.Tag != tag)) {
		return nil, ErrNotSynced
	}
	if err != nil {
		return nil, fmt.Errorf("reading the BaseImage of %s:%s: %w", repo, tag, err)
	}
	return &bi, nil
}

// FindImage returns the synced image ref ("TENANT/IMAGE[:TAG]") in
// namespace ns, from its BaseImage. Only images image-syncer placed in ns
// are found, so a tenant cannot boot another tenant's image; an image not
// synced, rejected or not yet imported is a clear error.
func FindImage(ctx context.Context, c cdi.Reader, ns, ref string) (Image, error) {
	tenant, repo, tag, err := ParseImageRef(ref)
	if err != nil {
		return Image{}, err
	}
	bi, err := SyncedImage(ctx, c, ns, ref)
	if errors.Is(err, ErrNotSynced) {
		return Image{}, fmt.Errorf("image %s:%s is not synced into namespace %s: VMs here boot only from images image-syncer synced into it, which are the namespace's tenant's own (kubectl get bi -n %s lists them)", repo, tag, ns, ns)
	}
	if err != nil {
		return Image{}, err
	}
	if c := meta.FindStatusCondition(bi.Status.Conditions, v1alpha1.ConditionRejected); c != nil && c.Status == metav1.ConditionTrue && bi.Status.ImportedDigest == "" {
		return Image{}, fmt.Errorf("image %s:%s was rejected: %s", repo, tag, c.Message)
	}
	if bi.Status.ImportedDigest == "" || bi.Status.DataSourceName == "" {
		progress := ""
		if bi.Status.Progress != "" {
			progress = ", " + bi.Status.Progress
		}
		return Image{}, fmt.Errorf("image %s:%s is not ready yet (phase %s%s); try again once kubectl get bi -n %s %s shows Ready", repo, tag, orUnknown(string(bi.Status.Phase)), progress, ns, bi.Name)
	}
	guest, err := guestOf(ctx, c, bi)
	if err != nil {
		return Image{}, err
	}
	return Image{
		Tenant: tenant, Name: cdi.ImageName(repo), Tag: tag, Namespace: ns,
		DataSource: bi.Status.DataSourceName, Digest: bi.Status.ImportedDigest, VirtualSize: bi.Status.VirtualSize,
		Instancetype: bi.Status.Instancetype, Preference: bi.Status.Preference, Guest: guest,
	}, nil
}

// guestOf reads what bi's DataSource says of its guest. Only a DataSource
// image-syncer made for bi's repository speaks for the image; any other,
// and one that is gone, says nothing (every fact unknown).
func guestOf(ctx context.Context, c cdi.Reader, bi *v1alpha1.BaseImage) (cdi.GuestFacts, error) {
	var ds cdiv1.DataSource
	err := c.Get(ctx, bi.Namespace, bi.Status.DataSourceName, &ds)
	switch {
	case apierrors.IsNotFound(err):
		return cdi.GuestFacts{}, nil
	case err != nil:
		return cdi.GuestFacts{}, fmt.Errorf("reading the DataSource %s/%s: %w", bi.Namespace, bi.Status.DataSourceName, err)
	case ds.Labels[cdi.LabelManagedBy] != cdi.ManagedByValue || ds.Annotations[cdi.AnnotationRepository] != bi.Spec.Repository:
		return cdi.GuestFacts{}, nil
	}
	return cdi.ParseGuestFacts(ds.Annotations), nil
}

func orUnknown(s string) string {
	if s == "" {
		return "Pending"
	}
	return s
}

var udnGVK = schema.GroupVersionKind{Group: "k8s.ovn.org", Version: "v1", Kind: "UserDefinedNetworkList"}

// PrimaryNetworkOf finds ns's primary network: an OVN-Kubernetes primary
// user defined network (its topology) or the pod network. A namespace
// without OVN-Kubernetes' primary-network label has the pod network; when
// the user may not read the namespace (a tenant, usually), its primary
// UserDefinedNetwork decides. A hub without OVN-Kubernetes' CRDs, or a
// user who may read neither, gets the pod network.
func PrimaryNetworkOf(ctx context.Context, c cdi.Reader, ns string) (PrimaryNetwork, error) {
	var n corev1.Namespace
	if err := c.Get(ctx, "", ns, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return PrimaryPod, nil
		}
		if !apierrors.IsForbidden(err) {
			return PrimaryPod, fmt.Errorf("reading namespace %s: %w", ns, err)
		}
	} else if _, ok := n.Labels[LabelPrimaryUDN]; !ok {
		return PrimaryPod, nil
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(udnGVK)
	if err := c.List(ctx, ns, "", list); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return PrimaryPod, nil
		}
		return PrimaryPod, fmt.Errorf("listing the user defined networks of %s: %w", ns, err)
	}
	for _, u := range list.Items {
		role, _, _ := unstructured.NestedString(u.Object, "spec", "layer2", "role")
		if role == "Primary" {
			return PrimaryUDNLayer2, nil
		}
		role, _, _ = unstructured.NestedString(u.Object, "spec", "layer3", "role")
		if role == "Primary" {
			return PrimaryUDNLayer3, nil
		}
	}
	return PrimaryPod, nil
}

// Create creates the rendered VM, then its Secrets owned by it, so that
// they go when it goes. When a Secret cannot be created the VM is removed
// again.
func Create(ctx context.Context, c Cluster, r *Rendered) error {
	vm := r.VM.DeepCopy()
	if vm.Annotations == nil {
		vm.Annotations = map[string]string{}
	}
	vm.Annotations[AnnotationLiveMigratable] = fmt.Sprint(r.LiveMigratable)
	if len(r.Reasons) > 0 {
		vm.Annotations[AnnotationNotMigratable] = strings.Join(r.Reasons, "; ")
	}
	if err := c.Create(ctx, vm); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("a VM named %s already exists in %s", vm.Name, vm.Namespace)
		}
		return fmt.Errorf("creating VM %s/%s: %w", vm.Namespace, vm.Name, err)
	}
	owner := metav1.OwnerReference{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID}
	for _, s := range r.Secrets {
		s := s.DeepCopy()
		s.OwnerReferences = []metav1.OwnerReference{owner}
		if err := c.Create(ctx, s); err != nil {
			cleanup := context.WithoutCancel(ctx)
			_ = c.Delete(cleanup, vm, false)
			return fmt.Errorf("creating Secret %s/%s for the VM (the VM was removed again): %w", s.Namespace, s.Name, err)
		}
	}
	r.VM = vm
	return nil
}

// notFoundError is an object that does not exist, said in a sentence;
// the API server's NotFound error stays underneath, so that
// apierrors.IsNotFound and errors.As still see it.
type notFoundError struct {
	msg string
	err error
}

func (e *notFoundError) Error() string { return e.msg }
func (e *notFoundError) Unwrap() error { return e.err }

// getVM reads a VM, with a clear error when it does not exist.
func getVM(ctx context.Context, c cdi.Reader, ns, name string) (*kubevirtv1.VirtualMachine, error) {
	var vm kubevirtv1.VirtualMachine
	if err := c.Get(ctx, ns, name, &vm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &notFoundError{fmt.Sprintf("no VM %s in namespace %s", name, ns), err}
		}
		return nil, fmt.Errorf("reading VM %s/%s: %w", ns, name, err)
	}
	return &vm, nil
}

// SetRunStrategy starts (Always) or stops (Halted) a VM, as virtctl does
// by editing spec.runStrategy; changed is false when it already had it.
func SetRunStrategy(ctx context.Context, c Cluster, ns, name string, rs kubevirtv1.VirtualMachineRunStrategy) (changed bool, err error) {
	vm, err := getVM(ctx, c, ns, name)
	if err != nil {
		return false, err
	}
	if vm.Spec.RunStrategy != nil && *vm.Spec.RunStrategy == rs {
		return false, nil
	}
	before := vm.DeepCopy()
	vm.Spec.RunStrategy = &rs
	vm.Spec.Running = nil //nolint:staticcheck // a VM made elsewhere may still use it; both cannot be set
	if err := c.MergePatch(ctx, before, vm); err != nil {
		return false, fmt.Errorf("setting the run strategy of VM %s/%s: %w", ns, name, err)
	}
	return true, nil
}

// Restart restarts a running VM by deleting its instance; with run
// strategy Always, KubeVirt starts a new one at once.
func Restart(ctx context.Context, c Cluster, ns, name string) error {
	vm, err := getVM(ctx, c, ns, name)
	if err != nil {
		return err
	}
	if vm.Spec.RunStrategy == nil || *vm.Spec.RunStrategy != kubevirtv1.RunStrategyAlways {
		return fmt.Errorf("VM %s is not set to run (run strategy %v); start it with imagectl vm start", name, runStrategy(vm))
	}
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := c.Delete(ctx, vmi, false); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("VM %s has no running instance yet; it starts on its own", name)
		}
		return fmt.Errorf("restarting VM %s/%s: %w", ns, name, err)
	}
	return nil
}

func runStrategy(vm *kubevirtv1.VirtualMachine) string {
	if vm.Spec.RunStrategy == nil {
		return "unset"
	}
	return string(*vm.Spec.RunStrategy)
}

// Migrate asks KubeVirt to live-migrate a running VM to another node, by
// creating a VirtualMachineInstanceMigration. It refuses when the
// instance is not running or KubeVirt says it cannot migrate.
func Migrate(ctx context.Context, c Cluster, ns, name string) (*kubevirtv1.VirtualMachineInstanceMigration, error) {
	if _, err := getVM(ctx, c, ns, name); err != nil {
		return nil, err
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := c.Get(ctx, ns, name, &vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("VM %s is not running; only a running VM migrates", name)
		}
		return nil, fmt.Errorf("reading the instance of VM %s/%s: %w", ns, name, err)
	}
	for _, cond := range vmi.Status.Conditions {
		if cond.Type == kubevirtv1.VirtualMachineInstanceIsMigratable && cond.Status == corev1.ConditionFalse {
			return nil, fmt.Errorf("KubeVirt says VM %s cannot live-migrate (%s): %s", name, cond.Reason, cond.Message)
		}
	}
	m := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-migration-", Namespace: ns, Labels: map[string]string{LabelVM: name, cdi.LabelManagedBy: "imagectl"}},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: name},
	}
	if err := c.Create(ctx, m); err != nil {
		return nil, fmt.Errorf("creating the migration of VM %s/%s: %w", ns, name, err)
	}
	return m, nil
}

// CancelMigration cancels the live migrations of a VM that have not ended,
// as KubeVirt cancels one: by deleting its VirtualMachineInstanceMigration
// (the VM stays where it ran). It returns their names, and refuses when
// there is none, whoever created it.
func CancelMigration(ctx context.Context, c Cluster, ns, name string) ([]string, error) {
	if _, err := getVM(ctx, c, ns, name); err != nil {
		return nil, err
	}
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := c.List(ctx, ns, "", &list); err != nil {
		return nil, fmt.Errorf("listing the migrations in %s: %w", ns, err)
	}
	var cancelled []string
	for i := range list.Items {
		m := &list.Items[i]
		if m.Spec.VMIName != name || !m.DeletionTimestamp.IsZero() || m.Status.Phase == kubevirtv1.MigrationSucceeded || m.Status.Phase == kubevirtv1.MigrationFailed {
			continue
		}
		if err := c.Delete(ctx, m, false); err != nil && !apierrors.IsNotFound(err) {
			return cancelled, fmt.Errorf("cancelling migration %s/%s: %w", ns, m.Name, err)
		}
		cancelled = append(cancelled, m.Name)
	}
	if len(cancelled) == 0 {
		return nil, fmt.Errorf("VM %s has no migration in progress to cancel", name)
	}
	return cancelled, nil
}

// Delete deletes a VM and returns the data volumes attached to it, which
// stay. Its root disk, a DataVolume template of the VM, and its
// cloud-init Secrets go with it.
func Delete(ctx context.Context, c Cluster, ns, name string) (kept []string, err error) {
	vm, err := getVM(ctx, c, ns, name)
	if err != nil {
		return nil, err
	}
	if err := c.Delete(ctx, vm, true); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("deleting VM %s/%s: %w", ns, name, err)
	}
	return dataVolumes(vm), nil
}

// dataVolumes names the data volumes attached to vm: its DataVolumes but
// the root disk.
func dataVolumes(vm *kubevirtv1.VirtualMachine) []string {
	if vm.Spec.Template == nil {
		return nil
	}
	var names []string
	for _, v := range vm.Spec.Template.Spec.Volumes {
		if v.DataVolume != nil && v.Name != rootDiskName {
			names = append(names, v.DataVolume.Name)
		}
	}
	return names
}

// Volume is a blank data volume CreateVolume made.
type Volume struct {
	DataVolume *cdiv1.DataVolume
	// Storage is the volume's shape; Note says why VMs using it cannot
	// live-migrate, if so.
	Storage cdi.Storage
	Note    string
}

// CreateVolume creates a blank data volume whose life is independent of
// any VM, of storage from storageClass (the default class when empty).
func CreateVolume(ctx context.Context, c Cluster, ns, name string, size resource.Quantity, storageClass string) (*Volume, error) {
	if !isDNSLabel(name) {
		return nil, fmt.Errorf("volume name %q is not a valid name", name)
	}
	if size.Sign() <= 0 {
		return nil, errors.New("--size must be positive")
	}
	st, _, note, err := cdi.StorageForClass(ctx, c, storageClass)
	if err != nil {
		return nil, fmt.Errorf("choosing the volume's storage: %w", err)
	}
	dv := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelVolume: name, cdi.LabelManagedBy: "imagectl"}},
		Spec:       cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, Storage: st.Spec(size)},
	}
	if err := c.Create(ctx, dv); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("a volume named %s already exists in %s", name, ns)
		}
		return nil, fmt.Errorf("creating volume %s/%s: %w", ns, name, err)
	}
	return &Volume{DataVolume: dv, Storage: st, Note: note}, nil
}

// Volumes lists the data volumes `imagectl volume create` made in ns.
func Volumes(ctx context.Context, c cdi.Reader, ns string) ([]api.VolumeSummary, error) {
	var list cdiv1.DataVolumeList
	if err := c.List(ctx, ns, LabelVolume, &list); err != nil {
		return nil, fmt.Errorf("listing volumes: %w", err)
	}
	out := []api.VolumeSummary{}
	for i := range list.Items {
		out = append(out, VolumeSummary(&list.Items[i]))
	}
	return out, nil
}

// VolumeSummary describes a data volume as volume list and volume create
// print it.
func VolumeSummary(dv *cdiv1.DataVolume) api.VolumeSummary {
	v := api.VolumeSummary{Name: dv.Name, Namespace: dv.Namespace, Phase: string(dv.Status.Phase)}
	if st := dv.Spec.Storage; st != nil {
		v.Size = st.Resources.Requests.Storage().String()
		for _, m := range st.AccessModes {
			v.AccessModes = append(v.AccessModes, string(m))
		}
		if st.VolumeMode != nil {
			v.VolumeMode = string(*st.VolumeMode)
		}
		if st.StorageClassName != nil {
			v.StorageClass = *st.StorageClassName
		}
	}
	return v
}

// VolumeInUseError is DeleteVolume's refusal to delete a data volume that
// VMs still list among their volumes.
type VolumeInUseError struct {
	Namespace, Volume string
	// VMs are the VMs whose spec uses the volume, sorted.
	VMs []string
}

func (e *VolumeInUseError) Error() string {
	return fmt.Sprintf("volume %s/%s is attached to VM %s", e.Namespace, e.Volume, strings.Join(e.VMs, ", "))
}

// DeleteVolumeOptions say what DeleteVolume may delete. The zero value
// refuses a volume that a VM uses.
type DeleteVolumeOptions struct {
	// Force deletes a volume that VMs still list. They then cannot start
	// until it is detached; a running one keeps the disk until it stops
	// (Kubernetes' PVC protection).
	Force bool
}

// DeleteVolume deletes a data volume `imagectl volume create` made, and
// its PersistentVolumeClaim with it (owned by the DataVolume). It refuses
// any other DataVolume (a VM's root disk, an image import), and, unless
// opts.Force, a volume VMs in ns list (*VolumeInUseError). It returns the
// VMs that list it.
//
// A VM may attach the volume between the check and the deletion; nothing
// on the hub can lock it.
func DeleteVolume(ctx context.Context, c Cluster, ns, name string, opts DeleteVolumeOptions) (users []string, err error) {
	if !isDNSLabel(name) {
		return nil, fmt.Errorf("volume name %q is not a valid name", name)
	}
	var dv cdiv1.DataVolume
	if err := c.Get(ctx, ns, name, &dv); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &notFoundError{fmt.Sprintf("no volume %s in namespace %s (imagectl volume list lists them)", name, ns), err}
		}
		return nil, fmt.Errorf("reading volume %s/%s: %w", ns, name, err)
	}
	if dv.Labels[LabelVolume] == "" {
		return nil, fmt.Errorf("DataVolume %s/%s is not a data volume made by imagectl volume create (it has no label %s); imagectl does not delete it", ns, name, LabelVolume)
	}
	if users, err = volumeUsers(ctx, c, ns, name); err != nil {
		return nil, err
	}
	if len(users) > 0 && !opts.Force {
		return users, &VolumeInUseError{Namespace: ns, Volume: name, VMs: users}
	}
	if err := c.Delete(ctx, &dv, false); err != nil && !apierrors.IsNotFound(err) {
		return users, fmt.Errorf("deleting volume %s/%s: %w", ns, name, err)
	}
	return users, nil
}

// volumeUsers names the VMs of ns whose template uses the DataVolume or
// PersistentVolumeClaim vol (a DataVolume's claim has its name).
func volumeUsers(ctx context.Context, c cdi.Reader, ns, vol string) ([]string, error) {
	var list kubevirtv1.VirtualMachineList
	if err := c.List(ctx, ns, "", &list); err != nil {
		return nil, fmt.Errorf("listing the VMs of %s that may use volume %s: %w", ns, vol, err)
	}
	var users []string
	for _, vm := range list.Items {
		if vm.Spec.Template == nil {
			continue
		}
		if slices.ContainsFunc(vm.Spec.Template.Spec.Volumes, func(v kubevirtv1.Volume) bool {
			return (v.DataVolume != nil && v.DataVolume.Name == vol) ||
				(v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == vol)
		}) {
			users = append(users, vm.Name)
		}
	}
	slices.Sort(users)
	return users, nil
}

// VolumeChange is what AttachVolume or DetachVolume did.
type VolumeChange struct {
	// Changed is false when there was nothing to do.
	Changed bool
	// Pending is true when the VM may be running: the change applies when
	// it next starts.
	Pending bool
}

// changed reports a change to vm, pending unless vm is known stopped.
func changed(vm *kubevirtv1.VirtualMachine) VolumeChange {
	status := vm.Status.PrintableStatus
	return VolumeChange{Changed: true, Pending: status != kubevirtv1.VirtualMachineStatusStopped && status != ""}
}

// AttachVolume declares data volume vol as a disk of VM name. A running VM
// gets it at its next start.
func AttachVolume(ctx context.Context, c Cluster, ns, name, vol string) (VolumeChange, error) {
	var dv cdiv1.DataVolume
	if err := c.Get(ctx, ns, vol, &dv); err != nil {
		if apierrors.IsNotFound(err) {
			return VolumeChange{}, &notFoundError{fmt.Sprintf("no volume %s in namespace %s; create it with imagectl volume create", vol, ns), err}
		}
		return VolumeChange{}, fmt.Errorf("reading volume %s/%s: %w", ns, vol, err)
	}
	if dv.Labels[LabelVolume] == "" {
		return VolumeChange{}, fmt.Errorf("DataVolume %s is not a data volume made by imagectl volume create", vol)
	}
	vm, err := getVM(ctx, c, ns, name)
	if err != nil {
		return VolumeChange{}, err
	}
	spec := vm.Spec.Template
	if slices.ContainsFunc(spec.Spec.Volumes, func(v kubevirtv1.Volume) bool { return v.DataVolume != nil && v.DataVolume.Name == vol }) {
		return VolumeChange{}, nil
	}
	diskName := "vol-" + vol
	if len(diskName) > 63 {
		diskName = diskName[:63]
	}
	before := vm.DeepCopy()
	spec.Spec.Domain.Devices.Disks = append(spec.Spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: diskName, DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}})
	spec.Spec.Volumes = append(spec.Spec.Volumes, kubevirtv1.Volume{Name: diskName, VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: vol}}})
	if err := c.MergePatch(ctx, before, vm); err != nil {
		return VolumeChange{}, fmt.Errorf("attaching volume %s to VM %s: %w", vol, name, err)
	}
	return changed(vm), nil
}

// DetachVolume removes data volume vol from VM name; the volume stays.
func DetachVolume(ctx context.Context, c Cluster, ns, name, vol string) (VolumeChange, error) {
	vm, err := getVM(ctx, c, ns, name)
	if err != nil {
		return VolumeChange{}, err
	}
	spec := &vm.Spec.Template.Spec
	i := slices.IndexFunc(spec.Volumes, func(v kubevirtv1.Volume) bool { return v.DataVolume != nil && v.DataVolume.Name == vol })
	if i < 0 {
		return VolumeChange{}, nil
	}
	if spec.Volumes[i].Name == rootDiskName {
		return VolumeChange{}, fmt.Errorf("%s is VM %s's root disk, not an attached volume", vol, name)
	}
	before := vm.DeepCopy()
	diskName := spec.Volumes[i].Name
	spec.Volumes = slices.Delete(spec.Volumes, i, i+1)
	spec.Domain.Devices.Disks = slices.DeleteFunc(spec.Domain.Devices.Disks, func(d kubevirtv1.Disk) bool { return d.Name == diskName })
	if err := c.MergePatch(ctx, before, vm); err != nil {
		return VolumeChange{}, fmt.Errorf("detaching volume %s from VM %s: %w", vol, name, err)
	}
	return changed(vm), nil
}

// Summaries describes the VMs of ns, or the one named name. With name
// empty and ns empty, it describes the VMs of every namespace (kubectl's
// --all-namespaces), which needs the right to list VMs cluster-wide.
func Summaries(ctx context.Context, c cdi.Reader, ns, name string) ([]api.VMSummary, error) {
	if name != "" {
		vm, err := getVM(ctx, c, ns, name)
		if err != nil {
			return nil, err
		}
		s := summary(vm)
		var vmi kubevirtv1.VirtualMachineInstance
		err = c.Get(ctx, vm.Namespace, vm.Name, &vmi)
		switch {
		case err == nil:
			addInstance(&s, &vmi)
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("reading the instance of VM %s: %w", vm.Name, err)
		}
		s.Conditions = conditions(vm, &s)
		out := []api.VMSummary{s}
		return out, addExternalIPs(ctx, c, vm.Namespace, out)
	}
	where := "in " + ns
	if ns == "" {
		where = "in all namespaces"
	}
	var list kubevirtv1.VirtualMachineList
	if err := c.List(ctx, ns, "", &list); err != nil {
		return nil, fmt.Errorf("listing VMs %s: %w", where, err)
	}
	// One list of instances, not one read per VM.
	var vmis kubevirtv1.VirtualMachineInstanceList
	if len(list.Items) > 0 {
		if err := c.List(ctx, ns, "", &vmis); err != nil {
			return nil, fmt.Errorf("listing VM instances %s: %w", where, err)
		}
	}
	instances := map[[2]string]*kubevirtv1.VirtualMachineInstance{}
	for i := range vmis.Items {
		vmi := &vmis.Items[i]
		instances[[2]string{vmi.Namespace, vmi.Name}] = vmi
	}
	slices.SortFunc(list.Items, func(a, b kubevirtv1.VirtualMachine) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	out := []api.VMSummary{}
	for i := range list.Items {
		vm := &list.Items[i]
		s := summary(vm)
		if vmi := instances[[2]string{vm.Namespace, vm.Name}]; vmi != nil {
			addInstance(&s, vmi)
		}
		s.Conditions = conditions(vm, &s)
		out = append(out, s)
	}
	return out, addExternalIPs(ctx, c, ns, out)
}

// addExternalIPs gives each VM of vms the external addresses of the load
// balancers of ns (every namespace when empty) that name it as a host. A
// hub that serves no LoadBalancers exposes nothing.
func addExternalIPs(ctx context.Context, c cdi.Reader, ns string, vms []api.VMSummary) error {
	if len(vms) == 0 {
		return nil
	}
	var lbs v1alpha1.LoadBalancerList
	if err := c.List(ctx, ns, "", &lbs); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("listing the load balancers: %w", err)
	}
	for i := range vms {
		for _, lb := range lbs.Items {
			if lb.Namespace == vms[i].Namespace && slices.Contains(lb.Spec.Hosts, vms[i].Name) {
				vms[i].ExternalIPs = append(vms[i].ExternalIPs, lb.Status.Addresses...)
			}
		}
	}
	return nil
}

// summary describes a VM from its object alone: what vm create recorded
// on it and the volumes attached.
func summary(vm *kubevirtv1.VirtualMachine) api.VMSummary {
	s := api.VMSummary{
		Name: vm.Name, Namespace: vm.Namespace, Status: string(vm.Status.PrintableStatus),
		Image: vm.Labels[cdi.LabelTenant] + "/" + vm.Labels[cdi.LabelImage], Digest: vm.Annotations[AnnotationDigest],
		Template: vm.Labels[LabelTemplate], OS: cdi.ParseGuestFacts(vm.Annotations).OSName,
		Volumes: dataVolumes(vm),
	}
	if vm.Labels[cdi.LabelImage] == "" {
		s.Image = ""
	}
	if s.Status == "" {
		s.Status = "Unknown"
	}
	if v, err := strconv.ParseBool(vm.Annotations[AnnotationLiveMigratable]); err == nil {
		s.LiveMigratable = &v
		if r := vm.Annotations[AnnotationNotMigratable]; r != "" {
			s.Reasons = strings.Split(r, "; ")
		}
	}
	return s
}

// addInstance completes s from the VM's running instance: its node, its
// address and KubeVirt's own live-migration verdict, which wins over the
// one vm create recorded (an Unknown one leaves it unknown).
func addInstance(s *api.VMSummary, vmi *kubevirtv1.VirtualMachineInstance) {
	s.Node = vmi.Status.NodeName
	if len(vmi.Status.Interfaces) > 0 {
		s.IP = vmi.Status.Interfaces[0].IP
	}
	for _, cond := range vmi.Status.Conditions {
		if cond.Type == kubevirtv1.VirtualMachineInstanceIsMigratable {
			s.LiveMigratable, s.Reasons = nil, nil
			switch cond.Status {
			case corev1.ConditionTrue:
				s.LiveMigratable = ptr(true)
			case corev1.ConditionFalse:
				s.LiveMigratable = ptr(false)
				if cond.Message != "" {
					s.Reasons = []string{cond.Message}
				}
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// KubeVirt's printable statuses by what they say of the VM.
var (
	progressingStatuses = []kubevirtv1.VirtualMachinePrintableStatus{
		kubevirtv1.VirtualMachineStatusProvisioning, kubevirtv1.VirtualMachineStatusStarting,
		kubevirtv1.VirtualMachineStatusMigrating, kubevirtv1.VirtualMachineStatusStopping,
		kubevirtv1.VirtualMachineStatusTerminating, kubevirtv1.VirtualMachineStatusWaitingForVolumeBinding,
		kubevirtv1.VirtualMachineStatusWaitingForReceiver,
	}
	failedStatuses = []kubevirtv1.VirtualMachinePrintableStatus{
		kubevirtv1.VirtualMachineStatusCrashLoopBackOff, kubevirtv1.VirtualMachineStatusUnschedulable,
		kubevirtv1.VirtualMachineStatusErrImagePull, kubevirtv1.VirtualMachineStatusImagePullBackOff,
		kubevirtv1.VirtualMachineStatusPvcNotFound, kubevirtv1.VirtualMachineStatusDataVolumeError,
	}
)

// conditions are vm's Ready, Progressing, Failed and Degraded conditions,
// from KubeVirt's status of it and s, its summary with the instance's
// live-migration verdict: Ready is KubeVirt's Ready condition; Progressing
// and Failed follow the printable status; a Ready VM is Degraded while it
// is paused or cannot live-migrate, which the service promises.
func conditions(vm *kubevirtv1.VirtualMachine, s *api.VMSummary) []api.VMCondition {
	status := vm.Status.PrintableStatus
	cond := func(t string, ok bool, reason, msg string) api.VMCondition {
		c := api.VMCondition{Type: t, Status: "False", Reason: reason, Message: msg}
		if ok {
			c.Status = "True"
		}
		return c
	}
	ready := cond(api.VMConditionReady, false, string(cmp.Or(status, "Unknown")), "")
	var failure, paused string
	var failedAt, pausedAt string
	for _, c := range vm.Status.Conditions {
		switch c.Type {
		case kubevirtv1.VirtualMachineReady:
			ready = cond(api.VMConditionReady, c.Status == corev1.ConditionTrue, cmp.Or(c.Reason, string(status)), c.Message)
			ready.LastTransitionTime = transitionTime(c.LastTransitionTime)
		case kubevirtv1.VirtualMachineFailure:
			if c.Status == corev1.ConditionTrue {
				failure, failedAt = cmp.Or(c.Message, c.Reason), transitionTime(c.LastTransitionTime)
			}
		case kubevirtv1.VirtualMachinePaused:
			if c.Status == corev1.ConditionTrue {
				paused, pausedAt = cmp.Or(c.Message, "the VM is paused"), transitionTime(c.LastTransitionTime)
			}
		}
	}
	failed := cond(api.VMConditionFailed, slices.Contains(failedStatuses, status) || failure != "", string(status), failure)
	failed.LastTransitionTime = failedAt
	degraded := cond(api.VMConditionDegraded, false, "", "")
	switch {
	case ready.Status != "True":
	case paused != "":
		degraded = cond(api.VMConditionDegraded, true, "Paused", paused)
		degraded.LastTransitionTime = pausedAt
	case s.LiveMigratable != nil && !*s.LiveMigratable:
		degraded = cond(api.VMConditionDegraded, true, "NotLiveMigratable", strings.Join(s.Reasons, "; "))
	}
	return []api.VMCondition{
		ready,
		cond(api.VMConditionProgressing, slices.Contains(progressingStatuses, status), string(status), ""),
		failed,
		degraded,
	}
}

// transitionTime is a condition's last transition in RFC 3339, "" when
// unset.
func transitionTime(t metav1.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
