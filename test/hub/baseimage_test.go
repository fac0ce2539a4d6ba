package hub

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/imagepipe/imagepipe/test/harness"
)

// crdDir is config/crd, found from this file so tests run from any directory.
func crdDir(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "config", "crd")
}

var baseImages = schema.GroupVersionResource{Group: "imagepipe.io", Version: "v1alpha1", Resource: "baseimages"}

func baseImage(name, digest string) *unstructured.Unstructured {
	spec := map[string]any{"tenant": "acme", "repository": "registry.example.com/acme/rhel", "tag": "10"}
	if digest != "" {
		spec["digest"] = digest
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "imagepipe.io/v1alpha1", "kind": "BaseImage",
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec":     spec,
	}}
}

// TestBaseImageCRD installs config/crd on a real apiserver: a valid
// BaseImage is stored with its defaults, and invalid digests and tenants are
// refused by the schema.
func TestBaseImageCRD(t *testing.T) {
	t.Parallel()
	hub := harness.StartHub(t, "hub-a", crdDir(t))
	client, err := dynamic.NewForConfig(hub.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	bi := client.Resource(baseImages).Namespace("default")
	ok := baseImage("rhel-10", "sha256:"+strings.Repeat("ab", 32))
	ok.Object["spec"].(map[string]any)["retention"] = map[string]any{}
	got, err := bi.Create(t.Context(), ok, metav1.CreateOptions{FieldValidation: "Strict"})
	if err != nil {
		t.Fatal(err)
	}
	keep, _, _ := unstructured.NestedInt64(got.Object, "spec", "retention", "keep")
	policy, _, _ := unstructured.NestedString(got.Object, "spec", "retention", "onDelete")
	if keep != 2 || policy != "retain" {
		t.Errorf("retention defaults: keep %d, onDelete %q; want 2 and retain", keep, policy)
	}
	for name, bad := range map[string]*unstructured.Unstructured{
		"bad-digest": baseImage("bad-digest", "md5:1234"),
		"bad-tenant": func() *unstructured.Unstructured {
			u := baseImage("bad-tenant", "")
			u.Object["spec"].(map[string]any)["tenant"] = "Acme_Corp"
			return u
		}(),
	} {
		if _, err := bi.Create(t.Context(), bad, metav1.CreateOptions{}); err == nil {
			t.Errorf("%s was accepted", name)
		}
	}
}
