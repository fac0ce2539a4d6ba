package hub

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// collect deletes this BaseImage's DataVolumes and PVCs that are neither
// kept by the retention nor the import in progress (inFlight), unless
// another BaseImage of the namespace uses them (two tags, one digest).
func (r *Reconciler) collect(ctx context.Context, bi *v1alpha1.BaseImage, image, inFlight string) error {
	keep := int(r.keep(bi))
	if len(bi.Status.Imports) > keep {
		bi.Status.Imports = bi.Status.Imports[:keep]
	}
	wanted := map[string]bool{inFlight: inFlight != ""}
	for _, rec := range bi.Status.Imports {
		wanted[rec.DataVolume] = true
	}
	var dvs cdiv1.DataVolumeList
	if err := r.Client.List(ctx, &dvs, client.InNamespace(bi.Namespace), client.MatchingLabels{cdi.LabelImage: image, cdi.LabelTenant: bi.Spec.Tenant}); err != nil {
		return fmt.Errorf("listing DataVolumes of %s: %w", image, err)
	}
	var doomed []string
	for _, dv := range dvs.Items {
		if madeFor(bi, &dv) && !wanted[dv.Name] {
			doomed = append(doomed, dv.Name)
		}
	}
	if len(doomed) == 0 {
		return nil
	}
	used, err := r.usedElsewhere(ctx, bi, image)
	if err != nil {
		return err
	}
	for _, n := range doomed {
		if used[n] {
			continue
		}
		if err := r.deleteImport(ctx, bi, image, n); err != nil {
			return err
		}
		log.FromContext(ctx).Info("old import deleted", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", n)
	}
	return nil
}

// usedElsewhere returns the DataVolumes other BaseImages of the image rely on.
func (r *Reconciler) usedElsewhere(ctx context.Context, bi *v1alpha1.BaseImage, image string) (map[string]bool, error) {
	var list v1alpha1.BaseImageList
	if err := r.Client.List(ctx, &list, client.InNamespace(bi.Namespace), client.MatchingLabels{cdi.LabelImage: image, cdi.LabelTenant: bi.Spec.Tenant}); err != nil {
		return nil, fmt.Errorf("listing BaseImages of %s: %w", image, err)
	}
	used := map[string]bool{}
	for _, o := range list.Items {
		if o.Name == bi.Name {
			continue
		}
		if o.Spec.Digest != "" {
			used[cdi.DataVolumeName(image, o.Spec.Digest)] = true
		}
		for _, rec := range o.Status.Imports {
			used[rec.DataVolume] = true
		}
	}
	return used, nil
}

// deleteImport deletes a DataVolume bi made and its PVC (CDI would delete
// the PVC with its DataVolume; deleting both also covers a DataVolume CDI
// already garbage-collected). Either is left alone unless it is bi's
// import: a DataVolume bi created for its repository, and that import's
// volume.
func (r *Reconciler) deleteImport(ctx context.Context, bi *v1alpha1.BaseImage, image, name string) error {
	ns := bi.Namespace
	bg := client.PropagationPolicy(metav1.DeletePropagationBackground)
	var dv cdiv1.DataVolume
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dv)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading DataVolume %s/%s: %w", ns, name, err)
	case !madeFor(bi, &dv):
		log.FromContext(ctx).Info("import not deleted: it is not this BaseImage's", "baseimage", client.ObjectKeyFromObject(bi), "datavolume", name, "owner", ownerOf(&dv))
		return nil
	default:
		if err := r.Client.Delete(ctx, &dv, bg, client.Preconditions{UID: &dv.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting DataVolume %s/%s: %w", ns, name, err)
		}
	}
	var pvc corev1.PersistentVolumeClaim
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading PVC %s/%s: %w", ns, name, err)
	}
	if !volumeOf(&pvc, name, bi.Spec.Tenant, image) {
		log.FromContext(ctx).Info("volume not deleted: it is not this BaseImage's import", "baseimage", client.ObjectKeyFromObject(bi), "pvc", name)
		return nil
	}
	if err := r.Client.Delete(ctx, &pvc, bg, client.Preconditions{UID: &pvc.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PVC %s/%s: %w", ns, name, err)
	}
	return nil
}

// deleteAll applies the delete policy: the DataSource, every import not
// used by another tag, then the BaseImage itself.
func (r *Reconciler) deleteAll(ctx context.Context, bi *v1alpha1.BaseImage, image string) error {
	if n := bi.Status.DataSourceName; n != "" {
		var ds cdiv1.DataSource
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: bi.Namespace, Name: n}, &ds)
		if err == nil && ownsDataSource(bi, &ds) {
			err = r.Client.Delete(ctx, &ds, client.Preconditions{UID: &ds.UID})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting DataSource %s/%s: %w", bi.Namespace, n, err)
		}
	}
	if err := r.collectAll(ctx, bi, image); err != nil {
		return err
	}
	// Only the version that was marked removed: a push since then wins.
	rv := bi.ResourceVersion
	if err := r.Client.Delete(ctx, bi, client.Preconditions{UID: &bi.UID, ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting BaseImage %s/%s: %w", bi.Namespace, bi.Name, err)
	}
	log.FromContext(ctx).Info("tag removed from the registry; its imports deleted (deletion policy delete)", "baseimage", client.ObjectKeyFromObject(bi))
	return nil
}

// collectAll deletes every import of bi not used by another tag.
func (r *Reconciler) collectAll(ctx context.Context, bi *v1alpha1.BaseImage, image string) error {
	used, err := r.usedElsewhere(ctx, bi, image)
	if err != nil {
		return err
	}
	var dvs cdiv1.DataVolumeList
	if err := r.Client.List(ctx, &dvs, client.InNamespace(bi.Namespace), client.MatchingLabels{cdi.LabelBaseImage: bi.Name}); err != nil {
		return fmt.Errorf("listing DataVolumes of %s: %w", image, err)
	}
	names := map[string]bool{}
	for _, dv := range dvs.Items {
		if madeFor(bi, &dv) {
			names[dv.Name] = true
		}
	}
	if bi.Status.PVCName != "" {
		names[bi.Status.PVCName] = true
	}
	for n := range names {
		if used[n] {
			continue
		}
		if err := r.deleteImport(ctx, bi, image, n); err != nil {
			return err
		}
	}
	return nil
}
