package cdi

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// Reader reads typed objects from a hub. imagectl's kube.Client implements
// it; the hub adapts its controller-runtime client.
type Reader interface {
	// Get reads namespace/name (namespace empty for cluster-scoped kinds)
	// into obj.
	Get(ctx context.Context, namespace, name string, obj runtime.Object) error
	// List reads the objects of list's kind in namespace (all when empty)
	// matching the label selector (all when empty) into list.
	List(ctx context.Context, namespace, selector string, list runtime.Object) error
}

// StorageForClass reads the CDI StorageProfile of class (the cluster's
// default StorageClass when class is empty) and chooses the volume shape
// with ChooseStorage. image-syncer uses it for imports and imagectl vm for
// the disks it clones from them.
func StorageForClass(ctx context.Context, c Reader, class string) (st Storage, liveMigratable bool, reason string, err error) {
	if class == "" {
		var classes storagev1.StorageClassList
		if err := c.List(ctx, "", "", &classes); err != nil {
			return Storage{}, false, "", fmt.Errorf("listing StorageClasses: %w", err)
		}
		for _, sc := range classes.Items {
			if sc.Annotations["storageclass.kubernetes.io/is-default-class"] == "true" {
				class = sc.Name
				break
			}
		}
		if class == "" {
			return Storage{}, false, "", errors.New("no StorageClass is marked default; name one")
		}
	}
	var sp cdiv1.StorageProfile
	if err := c.Get(ctx, "", class, &sp); err != nil {
		return Storage{}, false, "", fmt.Errorf("reading the StorageProfile of StorageClass %s (is CDI installed?): %w", class, err)
	}
	return ChooseStorage(&sp)
}

// ChooseStorage picks the volume shape for imports from the StorageClass's
// CDI StorageProfile, preferring what lets VMs live-migrate: ReadWriteMany
// with Block, else ReadWriteMany with Filesystem. When the class offers no
// ReadWriteMany, it falls back to the profile's first property set and
// reports why VMs from it cannot live-migrate, so that the BaseImage can
// say so (LiveMigratable=False) instead of refusing to import.
func ChooseStorage(sp *cdiv1.StorageProfile) (st Storage, liveMigratable bool, reason string, err error) {
	sets := sp.Spec.ClaimPropertySets // the provider's override wins
	if len(sets) == 0 {
		sets = sp.Status.ClaimPropertySets
	}
	if len(sets) == 0 {
		return Storage{}, false, "", fmt.Errorf("the StorageProfile %s has no claim property sets; set spec.claimPropertySets", sp.Name)
	}
	st.StorageClass = sp.Name
	if sp.Status.StorageClass != nil {
		st.StorageClass = *sp.Status.StorageClass
	}
	mode := func(s cdiv1.ClaimPropertySet) corev1.PersistentVolumeMode {
		if s.VolumeMode == nil {
			return corev1.PersistentVolumeFilesystem
		}
		return *s.VolumeMode
	}
	for _, want := range []corev1.PersistentVolumeMode{corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem} {
		for _, s := range sets {
			if mode(s) == want && slices.Contains(s.AccessModes, corev1.ReadWriteMany) {
				st.AccessMode, st.VolumeMode = corev1.ReadWriteMany, want
				return st, true, "", nil
			}
		}
	}
	first := sets[0]
	if len(first.AccessModes) == 0 {
		return Storage{}, false, "", fmt.Errorf("the StorageProfile %s lists a property set without access modes", sp.Name)
	}
	st.AccessMode, st.VolumeMode = first.AccessModes[0], mode(first)
	return st, false, fmt.Sprintf("StorageClass %s offers no ReadWriteMany volumes; VMs from this image cannot live-migrate", st.StorageClass), nil
}
