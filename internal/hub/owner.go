package hub

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Ownership. A name says where an object would be, not whose it is: the
// syncer changes or deletes a DataSource, DataVolume or PVC only when the
// object records the exact BaseImage, repository and tag (or digest) the
// syncer is acting for. Anything else is a conflict, reported on the
// BaseImage (Ready=False, reason Conflict, the other owner in the message)
// and left as it is.

// ErrConflict is returned (wrapped in a *ConflictError) when an object of
// the computed name belongs to someone else.
var ErrConflict = errors.New("object belongs to someone else")

// ConflictError names the object a BaseImage cannot take over.
type ConflictError struct {
	Kind, Namespace, Name string
	// Owner says whose the object is, as far as it records.
	Owner string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s %s/%s belongs to %s; image-syncer does not modify or delete it", e.Kind, e.Namespace, e.Name, e.Owner)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// ownerOf describes whose obj is, from what it records, for messages.
func ownerOf(obj client.Object) string {
	l, a := obj.GetLabels(), obj.GetAnnotations()
	switch {
	case l[cdi.LabelManagedBy] != cdi.ManagedByValue:
		return "someone other than image-syncer (no " + cdi.LabelManagedBy + "=" + cdi.ManagedByValue + " label)"
	case a[cdi.AnnotationRepository] == "":
		return "someone other than image-syncer (no " + cdi.AnnotationRepository + " annotation)"
	case a[cdi.AnnotationTag] != "":
		return fmt.Sprintf("BaseImage %q of %s:%s", l[cdi.LabelBaseImage], a[cdi.AnnotationRepository], a[cdi.AnnotationTag])
	}
	return fmt.Sprintf("BaseImage %q of %s@%s", l[cdi.LabelBaseImage], a[cdi.AnnotationRepository], a[cdi.AnnotationDigest])
}

// ownsDataSource reports whether ds was made for bi: the syncer's label,
// bi's name, and bi's exact repository and tag.
func ownsDataSource(bi *v1alpha1.BaseImage, ds *cdiv1.DataSource) bool {
	return ds.Labels[cdi.LabelManagedBy] == cdi.ManagedByValue && ds.Labels[cdi.LabelBaseImage] == bi.Name &&
		ds.Annotations[cdi.AnnotationRepository] == bi.Spec.Repository && ds.Annotations[cdi.AnnotationTag] == bi.Spec.Tag
}

// importsFor reports whether dv is the syncer's import want (two tags of
// one repository share it): the syncer's label, want's exact repository
// and digest, want's digest-pinned URL, and no pull secret or CA but the
// syncer's own copies. A DataVolume someone else created under the name (a
// tenant may create DataVolumes) with another source is not followed.
func importsFor(dv, want *cdiv1.DataVolume) bool {
	if dv.Labels[cdi.LabelManagedBy] != cdi.ManagedByValue || dv.Annotations[cdi.AnnotationRepository] != want.Annotations[cdi.AnnotationRepository] ||
		dv.Annotations[cdi.AnnotationDigest] != want.Annotations[cdi.AnnotationDigest] {
		return false
	}
	src, wsrc := dv.Spec.Source, want.Spec.Source
	if !importsFrom(dv, *wsrc.Registry.URL) {
		return false
	}
	if ref := src.Registry.SecretRef; ref != nil && *ref != cdi.PullSecretName {
		return false
	}
	if cm := src.Registry.CertConfigMap; cm != nil && *cm != cdi.CAConfigMapName {
		return false
	}
	// A DataVolume that picks another platform from an index imports other
	// bytes; one made before platforms were set picks the node's.
	if p, wp := src.Registry.Platform, wsrc.Registry.Platform; p != nil && (wp == nil || p.Architecture != wp.Architecture) {
		return false
	}
	return true
}

// importsFrom reports whether dv imports from exactly url.
func importsFrom(dv *cdiv1.DataVolume, url string) bool {
	return url != "" && importURL(dv) == url
}

// importURL is the registry URL dv imports from, "" if it names none.
func importURL(dv *cdiv1.DataVolume) string {
	if src := dv.Spec.Source; src != nil && src.Registry != nil && src.Registry.URL != nil {
		return *src.Registry.URL
	}
	return ""
}

// madeFor reports whether dv was created for bi: the syncer's label, bi's
// name, and bi's exact repository.
func madeFor(bi *v1alpha1.BaseImage, dv *cdiv1.DataVolume) bool {
	return dv.Labels[cdi.LabelManagedBy] == cdi.ManagedByValue && dv.Labels[cdi.LabelBaseImage] == bi.Name &&
		dv.Annotations[cdi.AnnotationRepository] == bi.Spec.Repository
}

// volumeOf reports whether pvc is the volume of the syncer's DataVolume
// dvName for image: CDI's owner reference to that DataVolume, or the
// syncer's labels CDI copies from the DataVolume.
func volumeOf(pvc *corev1.PersistentVolumeClaim, dvName, tenant, image string) bool {
	for _, ref := range pvc.OwnerReferences {
		if ref.Kind == "DataVolume" && ref.Name == dvName {
			return true
		}
	}
	l := pvc.Labels
	return l[cdi.LabelManagedBy] == cdi.ManagedByValue && l[cdi.LabelTenant] == tenant && l[cdi.LabelImage] == image
}
