package hub

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/test/harness"
)

// TestImportObjectsFitTheRealCDISchemas creates the syncer's DataVolume and
// DataSource on a real apiserver with CDI's CRDs, with strict field
// validation: every field the syncer sets exists in CDI's schema and keeps
// its value.
func TestImportObjectsFitTheRealCDISchemas(t *testing.T) {
	t.Parallel()
	hub := harness.StartHub(t, "hub-a")
	client, err := dynamic.NewForConfig(hub.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	im := cdi.Import{
		Namespace: "default", Tenant: "acme", Image: "rhel", Registry: "registry.example.com",
		Repository: "acme/rhel", Digest: "sha256:" + strings.Repeat("cd", 32), Canonical: "sha256:" + strings.Repeat("ef", 32), VirtualSize: 4 << 30,
		SecretRef: "registry-pull", CertConfig: "registry-ca",
		Storage: cdi.Storage{AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeFilesystem},
	}
	dv, err := im.DataVolume()
	if err != nil {
		t.Fatal(err)
	}
	withdrawn := im.DataSource("rhel-withdrawn", "rhel-cdcdcdcdcdcd")
	withdrawn.Spec.Source = cdiv1.DataSourceSource{} // as the syncer leaves a withdrawn image's
	for _, tc := range []struct {
		obj any
		gvr schema.GroupVersionResource
	}{
		{withdrawn, schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datasources"}},
		{dv, schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}},
		{im.DataSource("rhel", "rhel-cdcdcdcdcdcd"), schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datasources"}},
	} {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(tc.obj)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: m}
		unstructured.RemoveNestedField(u.Object, "status")
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		got, err := client.Resource(tc.gvr).Namespace("default").Create(t.Context(), u, metav1.CreateOptions{FieldValidation: "Strict"})
		if err != nil {
			t.Fatalf("%s rejected: %v", tc.gvr.Resource, err)
		}
		if tc.gvr.Resource == "datavolumes" {
			url, _, _ := unstructured.NestedString(got.Object, "spec", "source", "registry", "url")
			size, _, _ := unstructured.NestedString(got.Object, "spec", "storage", "resources", "requests", "storage")
			if !strings.Contains(url, "@sha256:") || size == "" {
				t.Errorf("stored DataVolume lost fields: url %q, size %q", url, size)
			}
		}
	}
}
