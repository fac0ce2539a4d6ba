package cdi

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

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
