package cdi

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestNoDataVolumeWithoutACanonicalDigest: an import the gate's verdict
// names no canonical image for has no DataVolume; the pushed digest is
// never the fallback.
func TestNoDataVolumeWithoutACanonicalDigest(t *testing.T) {
	for _, canonical := range []string{"", "latest", "sha256:" + strings.Repeat("a", 63)} {
		im := Import{Namespace: "acme", Tenant: "acme", Image: "rhel", Registry: "registry.example.com", Repository: "acme/rhel",
			Digest: "sha256:" + strings.Repeat("ab", 32), Canonical: canonical, VirtualSize: 1 << 30}
		if dv, err := im.DataVolume(); !errors.Is(err, ErrUnverified) {
			t.Errorf("canonical %q: DataVolume %v, error %v; want ErrUnverified", canonical, dv, err)
		}
	}
}

func TestImportObjects(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	canonical := "sha256:" + strings.Repeat("cd", 32)
	im := Import{
		Namespace: "acme", Tenant: "acme", Image: "rhel", Registry: "registry.example.com:5000",
		Repository: "acme/rhel", Digest: digest, Canonical: canonical, VirtualSize: 10 << 30,
		Storage:      Storage{StorageClass: "ceph-rbd", AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock},
		Instancetype: "u1.medium",
	}
	dv, err := im.DataVolume()
	if err != nil {
		t.Fatal(err)
	}
	if got := *dv.Spec.Source.Registry.URL; got != "docker://registry.example.com:5000/acme/rhel@"+canonical {
		t.Errorf("URL %q is not pinned to the canonical digest", got)
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

// TestImportVolumeHoldsQcow2LargerThanItsVirtualSize: a qcow2 file can be
// larger than its virtual size (preallocated, with small clusters' many
// tables, or a small virtual size); CDI's scratch claim copies the
// DataVolume's request and must hold the whole file in a filesystem, in
// Block and Filesystem mode alike, or the importer restarts on "no space
// left on device". The sizes are those of the files `qemu-img create -f
// qcow2 -o preallocation=full[,cluster_size=512] FILE SIZE` writes.
func TestImportVolumeHoldsQcow2LargerThanItsVirtualSize(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name              string
		virtual, diskFile int64
	}{
		{"64 MiB in 512-byte clusters", 64 * mib, 68446720},
		{"1 MiB", 1 * mib, 1376256},
	} {
		for _, mode := range []corev1.PersistentVolumeMode{corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem} {
			t.Run(tc.name+" "+string(mode), func(t *testing.T) {
				im := Import{
					Namespace: "acme", Tenant: "acme", Image: "rhel", Registry: "registry.example.com", Repository: "acme/rhel",
					Digest: "sha256:" + strings.Repeat("ab", 32), Canonical: "sha256:" + strings.Repeat("ab", 32), VirtualSize: tc.virtual, DiskSize: tc.diskFile,
					Storage: Storage{AccessMode: corev1.ReadWriteMany, VolumeMode: mode},
				}
				dv, err := im.DataVolume()
				if err != nil {
					t.Fatal(err)
				}
				q := dv.Spec.Storage.Resources.Requests[corev1.ResourceStorage]
				room := float64(q.Value()) * (1 - DefaultFilesystemOverhead)
				if room < float64(tc.diskFile) {
					t.Errorf("request %s leaves %.0f bytes in the scratch filesystem for a %d-byte qcow2 file", q.String(), room, tc.diskFile)
				}
				if q.Value()%mib != 0 || room >= float64(tc.diskFile+mib) {
					t.Errorf("request %s for a %d-byte qcow2 file: want the least whole MiB that holds it", q.String(), tc.diskFile)
				}
			})
		}
	}
}

// TestImportVolumeCountsTheDiskFileOnlyUpToItsBound: the DataVolume's
// storage request makes room for the disk file as stored in the layer only
// up to the largest file a valid disk of its virtual size can be (the
// virtual size, an eighth more, and 1 MiB of headers): a file of exactly
// that size gets room in the scratch filesystem, and a file padded beyond
// it, by a byte or to a pebibyte, gets the same request, in Block and
// Filesystem mode alike.
func TestImportVolumeCountsTheDiskFileOnlyUpToItsBound(t *testing.T) {
	const mib = 1 << 20
	request := func(t *testing.T, im Import) int64 {
		t.Helper()
		dv, err := im.DataVolume()
		if err != nil {
			t.Fatal(err)
		}
		q := dv.Spec.Storage.Resources.Requests[corev1.ResourceStorage]
		return q.Value()
	}
	for _, virtual := range []int64{1 * mib, 64 * mib, 10 << 30} {
		for _, mode := range []corev1.PersistentVolumeMode{corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem} {
			t.Run(fmt.Sprintf("%d bytes %s", virtual, mode), func(t *testing.T) {
				bound := virtual + virtual/8 + mib
				im := Import{
					Namespace: "acme", Tenant: "acme", Image: "rhel", Registry: "registry.example.com", Repository: "acme/rhel",
					Digest: "sha256:" + strings.Repeat("ab", 32), Canonical: "sha256:" + strings.Repeat("ab", 32), VirtualSize: virtual, DiskSize: bound,
					Storage: Storage{AccessMode: corev1.ReadWriteMany, VolumeMode: mode},
				}
				atBound := request(t, im)
				if room := float64(atBound) * (1 - DefaultFilesystemOverhead); room < float64(bound) {
					t.Errorf("request %d for a %d-byte file at the bound leaves the scratch filesystem %.0f bytes", atBound, bound, room)
				}
				for _, padded := range []int64{bound + 1, bound + 64*mib, 1 << 50} {
					im.DiskSize = padded
					if got := request(t, im); got != atBound {
						t.Errorf("request %d for a %d-byte file, %d for one at the bound (%d bytes): the padding was counted", got, padded, atBound, bound)
					}
				}
			})
		}
	}
}
