package cdi

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

func set(mode corev1.PersistentVolumeMode, modes ...corev1.PersistentVolumeAccessMode) cdiv1.ClaimPropertySet {
	return cdiv1.ClaimPropertySet{AccessModes: modes, VolumeMode: &mode}
}

func TestChooseStorage(t *testing.T) {
	rwo, rwx := corev1.ReadWriteOnce, corev1.ReadWriteMany
	block, fs := corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem
	tests := []struct {
		name     string
		spec     []cdiv1.ClaimPropertySet
		status   []cdiv1.ClaimPropertySet
		want     Storage
		migrates bool
		fails    bool
	}{
		{"rwx block preferred", nil, []cdiv1.ClaimPropertySet{set(fs, rwx), set(block, rwx), set(block, rwo)}, Storage{StorageClass: "sc", AccessMode: rwx, VolumeMode: block}, true, false},
		{"rwx filesystem next", nil, []cdiv1.ClaimPropertySet{set(block, rwo), set(fs, rwx)}, Storage{StorageClass: "sc", AccessMode: rwx, VolumeMode: fs}, true, false},
		{"no rwx: import anyway", nil, []cdiv1.ClaimPropertySet{set(fs, rwo)}, Storage{StorageClass: "sc", AccessMode: rwo, VolumeMode: fs}, false, false},
		{"spec overrides status", []cdiv1.ClaimPropertySet{set(fs, rwo)}, []cdiv1.ClaimPropertySet{set(block, rwx)}, Storage{StorageClass: "sc", AccessMode: rwo, VolumeMode: fs}, false, false},
		{"empty profile", nil, nil, Storage{}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: "sc"}}
			sp.Spec.ClaimPropertySets, sp.Status.ClaimPropertySets = tt.spec, tt.status
			got, migrates, reason, err := ChooseStorage(sp)
			if (err != nil) != tt.fails {
				t.Fatalf("err = %v", err)
			}
			if got != tt.want || migrates != tt.migrates || (!migrates && !tt.fails && reason == "") {
				t.Errorf("got %+v, live-migratable %v (%q); want %+v, %v", got, migrates, reason, tt.want, tt.migrates)
			}
		})
	}
}
