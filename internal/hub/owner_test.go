package hub

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// TestOwnership: objects of the right name that record another owner, or
// none, are not the BaseImage's; forged copies with another source are not
// followed.
func TestOwnership(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	im := cdi.Import{Namespace: "acme", Tenant: "acme", Image: "rhel", Registry: "reg.example.com", Repository: "acme/rhel", Tag: "9", Digest: digest, Canonical: digest,
		Storage: cdi.Storage{AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock}}
	bi := &v1alpha1.BaseImage{ObjectMeta: metav1.ObjectMeta{Name: "rhel--9", Namespace: "acme"},
		Spec: v1alpha1.BaseImageSpec{Tenant: "acme", Repository: "reg.example.com/acme/rhel", Tag: "9", Digest: digest}}

	ds := im.DataSource(bi.Name, "pvc")
	ds.Labels[cdi.LabelBaseImage] = bi.Name
	if !ownsDataSource(bi, ds) {
		t.Fatal("the BaseImage's own DataSource is not its")
	}
	for what, change := range map[string]func(*cdiv1.DataSource){
		"no labels":       func(d *cdiv1.DataSource) { d.Labels = nil },
		"other tag":       func(d *cdiv1.DataSource) { d.Annotations[cdi.AnnotationTag] = "v9" },
		"other repo":      func(d *cdiv1.DataSource) { d.Annotations[cdi.AnnotationRepository] = "reg.example.com/acme/rhel9" },
		"other baseimage": func(d *cdiv1.DataSource) { d.Labels[cdi.LabelBaseImage] = "rhel--10" },
		"no annotations":  func(d *cdiv1.DataSource) { d.Annotations = nil },
	} {
		c := ds.DeepCopy()
		change(c)
		if ownsDataSource(bi, c) {
			t.Errorf("a DataSource with %s is taken for the BaseImage's", what)
		}
		if ownerOf(c) == "" {
			t.Errorf("no owner described for a DataSource with %s", what)
		}
	}

	want := dataVolume(t, im)
	if !importsFor(want.DeepCopy(), want) {
		t.Fatal("the syncer's own DataVolume is not followed")
	}
	evil, other := "tenant-secret", "docker://reg.example.com/acme/rhel@sha256:"+strings.Repeat("cd", 32)
	for what, change := range map[string]func(*cdiv1.DataVolume){
		"another URL":    func(d *cdiv1.DataVolume) { d.Spec.Source.Registry.URL = &other },
		"another secret": func(d *cdiv1.DataVolume) { d.Spec.Source.Registry.SecretRef = &evil },
		"another CA":     func(d *cdiv1.DataVolume) { d.Spec.Source.Registry.CertConfigMap = &evil },
		"an HTTP source": func(d *cdiv1.DataVolume) {
			d.Spec.Source = &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://x"}}
		},
		"another digest":    func(d *cdiv1.DataVolume) { d.Annotations[cdi.AnnotationDigest] = "sha256:" + strings.Repeat("cd", 32) },
		"no syncer's label": func(d *cdiv1.DataVolume) { delete(d.Labels, cdi.LabelManagedBy) },
	} {
		c := want.DeepCopy()
		change(c)
		if importsFor(c, want) {
			t.Errorf("a DataVolume with %s is followed", what)
		}
	}

	dv := want.DeepCopy()
	dv.Labels[cdi.LabelBaseImage] = bi.Name
	if !madeFor(bi, dv) {
		t.Error("the BaseImage's DataVolume is not its")
	}
	dv.Annotations[cdi.AnnotationRepository] = "reg.example.com/acme/other"
	if madeFor(bi, dv) {
		t.Error("a DataVolume of another repository is taken for the BaseImage's")
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: dv.Name, Labels: map[string]string{"team": "x"}}}
	if volumeOf(pvc, dv.Name, "acme", "rhel") {
		t.Error("a PVC neither owned by the DataVolume nor labelled by the syncer is taken for its volume")
	}
	pvc.OwnerReferences = []metav1.OwnerReference{{Kind: "DataVolume", Name: dv.Name}}
	if !volumeOf(pvc, dv.Name, "acme", "rhel") {
		t.Error("CDI's PVC of the DataVolume is not its volume")
	}
}

// TestImportsForOnlyItsPlatform: a DataVolume that picks another platform
// from an index imports another image's bytes, so the syncer does not
// follow it as its import, whether the import it wants names a platform or
// not (the gate's canonical image needs none). One that names no platform
// picks the node's, as DataVolumes made before platforms were set did.
func TestImportsForOnlyItsPlatform(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	im := cdi.Import{Namespace: "acme", Tenant: "acme", Image: "rhel", Registry: "reg.example.com", Repository: "acme/rhel", Tag: "9", Digest: digest, Canonical: digest,
		Storage: cdi.Storage{AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock}}
	for _, tc := range []struct {
		want, existing string // architectures; "" names none
		follows        bool
	}{
		{"", "", true},
		{"", "arm64", false},
		{"amd64", "amd64", true},
		{"amd64", "arm64", false},
		{"amd64", "", true},
	} {
		t.Run(fmt.Sprintf("want %q, existing %q", tc.want, tc.existing), func(t *testing.T) {
			wim, eim := im, im
			wim.Architecture, eim.Architecture = tc.want, tc.existing
			want, existing := dataVolume(t, wim), dataVolume(t, eim)
			if got := existing.Spec.Source.Registry.Platform; (got != nil) != (tc.existing != "") {
				t.Fatalf("the existing DataVolume's platform is %+v, want %q", got, tc.existing)
			}
			if got := importsFor(existing, want); got != tc.follows {
				t.Errorf("followed %v, want %v", got, tc.follows)
			}
		})
	}
}

func dataVolume(t *testing.T, im cdi.Import) *cdiv1.DataVolume {
	t.Helper()
	dv, err := im.DataVolume()
	if err != nil {
		t.Fatal(err)
	}
	return dv
}
