package hub

import (
	"bytes"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/imagepipe/imagepipe/test/harness"
)

// TestDeployManifestsAreAcceptedByTheAPIServer renders config/default with
// kubectl kustomize, as `kubectl apply -k config/default` would, and
// creates every object on a real apiserver with strict field validation:
// the Deployment, Service, RBAC and PodDisruptionBudget the docs tell
// providers to apply are valid as shipped.
func TestDeployManifestsAreAcceptedByTheAPIServer(t *testing.T) {
	kubectl := harness.Binary(t, "kubectl")
	out, err := exec.Command(kubectl, "kustomize", filepath.Join("..", "..", "config", "default")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize config/default: %v", err)
	}
	hub := harness.StartHub(t, "hub-a") // without the BaseImage CRD: the manifests install it
	dc, err := discovery.NewDiscoveryClientForConfig(hub.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	client, err := dynamic.NewForConfig(hub.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	kinds := map[string]bool{}
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		var res dynamic.ResourceInterface = client.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			res = client.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := res.Create(t.Context(), &obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Errorf("%s %s/%s refused: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		kinds[gvk.Kind] = true
	}
	for _, want := range []string{"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "CustomResourceDefinition"} {
		if !kinds[want] {
			t.Errorf("config/default renders no %s (got %v)", want, strings.Join(mapKeys(kinds), ", "))
		}
	}
}

func mapKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
