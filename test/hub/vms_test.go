package hub

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/test/harness"
)

// TestRenderedVMsFitKubeVirtSchema creates every VM in the renderer's
// golden files (internal/vmlaunch/testdata/golden, which TestRenderGolden
// keeps equal to what Render produces) and its Secrets on a real apiserver
// with KubeVirt's CRDs, with strict field validation: every field we render
// exists in KubeVirt's schema and keeps its value.
func TestRenderedVMsFitKubeVirtSchema(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "..", "internal", "vmlaunch", "testdata", "golden", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	hub := harness.StartHub(t, "hub-a")
	client, err := dynamic.NewForConfig(hub.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	nsRes := client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"})
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "acme"}}}
	if _, err := nsRes.Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vms := schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				VM      map[string]any   `json:"vm"`
				Secrets []map[string]any `json:"secrets"`
			}
			if err := yaml.Unmarshal(data, &doc); err != nil {
				t.Fatal(err)
			}
			vm := &unstructured.Unstructured{Object: doc.VM}
			vm.SetName(name) // one namespace, one VM per case
			unstructured.RemoveNestedField(vm.Object, "status")
			got, err := client.Resource(vms).Namespace("acme").Create(t.Context(), vm, metav1.CreateOptions{FieldValidation: "Strict"})
			if err != nil {
				t.Fatalf("KubeVirt's schema refuses the VM: %v", err)
			}
			tmpls, _, _ := unstructured.NestedSlice(got.Object, "spec", "dataVolumeTemplates")
			if len(tmpls) != 1 {
				t.Fatalf("stored VM has %d data volume templates", len(tmpls))
			}
			if kind, _, _ := unstructured.NestedString(tmpls[0].(map[string]any), "spec", "sourceRef", "kind"); kind != "DataSource" {
				t.Errorf("stored root disk clones from %q, want a DataSource", kind)
			}
			for _, s := range doc.Secrets {
				sec := &unstructured.Unstructured{Object: s}
				sec.SetName(name + "-" + sec.GetName())
				if _, err := client.Resource(secrets).Namespace("acme").Create(t.Context(), sec, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
					t.Errorf("Secret %s refused: %v", sec.GetName(), err)
				}
			}
		})
	}
}
