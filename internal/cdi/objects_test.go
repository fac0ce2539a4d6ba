package cdi

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestImportObjects(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	im := Import{
		Namespace: "acme", Tenant: "acme", Image: "rhel", Registry: "registry.example.com:5000",
		Repository: "acme/rhel", Digest: digest, VirtualSize: 10 << 30,
		Storage:      Storage{StorageClass: "ceph-rbd", AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock},
		Instancetype: "u1.medium",
	}
	dv := im.DataVolume()
	if got := *dv.Spec.Source.Registry.URL; got != "docker://registry.example.com:5000/acme/rhel@"+digest {
		t.Errorf("URL %q is not digest-pinned", got)
	}
	if dv.Name != "rhel--"+strings.Repeat("ab", 16) || dv.Labels[LabelTenant] != "acme" || dv.Labels[instancetypeKey] != "u1.medium" {
		t.Errorf("DataVolume meta: %s %v", dv.Name, dv.Labels)
	}
	if q := dv.Spec.Storage.Resources.Requests[corev1.ResourceStorage]; q.Value() != 10<<30 {
		t.Errorf("Block volume size %s, want exactly the virtual size", q.String())
	}
	// A fully allocated raw disk: CDI's scratch claim copies the request and
	// must hold the whole file in a filesystem.
	raw := im
	raw.DiskSize = raw.VirtualSize
	if q := raw.VolumeSize(); float64(q.Value())*(1-DefaultFilesystemOverhead) < float64(raw.DiskSize) || q.Value()%(1<<20) != 0 {
		t.Errorf("Block volume size %s for a %d-byte raw disk file leaves the scratch claim no room for it", q.String(), raw.DiskSize)
	}
	// A file padded far beyond any valid disk of its virtual size (its layer
	// may compress to almost nothing) does not inflate the request.
	padded := im
	padded.DiskSize = 1 << 50
	if q := padded.VolumeSize(); q.Value() > 12<<30 {
		t.Errorf("Block volume size %s for a 10 GiB disk in a 1 PiB file: the file's size was trusted", q.String())
	}
	// A qcow2 file much smaller than its virtual size changes nothing.
	small := im
	small.DiskSize = 1 << 30
	if q := small.VolumeSize(); q.Value() != 10<<30 {
		t.Errorf("Block volume size %s for a 1 GiB qcow2 of 10 GiB, want the virtual size", q.String())
	}
	im.Storage.VolumeMode = corev1.PersistentVolumeFilesystem
	if q := im.VolumeSize(); q.Value() <= 10<<30 || q.Value()%(1<<20) != 0 {
		t.Errorf("Filesystem volume size %s: want room for the filesystem, in whole MiB", q.String())
	}
	if dv.Annotations[AnnotationRepository] != "registry.example.com:5000/acme/rhel" || dv.Annotations[AnnotationDigest] != digest {
		t.Errorf("DataVolume does not record its exact repository and digest: %v", dv.Annotations)
	}
	im.Tag = "9"
	ds := im.DataSource("rhel--9", dv.Name)
	if ds.Annotations[AnnotationRepository] != "registry.example.com:5000/acme/rhel" || ds.Annotations[AnnotationTag] != "9" {
		t.Errorf("DataSource does not record its exact repository and tag: %v", ds.Annotations)
	}
	if ds.Spec.Source.PVC == nil || ds.Spec.Source.PVC.Name != dv.Name || ds.Spec.Source.PVC.Namespace != "acme" {
		t.Errorf("DataSource source %+v", ds.Spec.Source)
	}
}
