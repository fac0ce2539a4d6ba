package hub

import (
	"bytes"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// TestDeployManifestsAreAcceptedByTheAPIServer renders config/default (a
// hub) and config/gate (beside the registry) with kubectl kustomize, as
// `kubectl apply -k` would, and creates every object on a real apiserver
// with strict field validation: the Deployments, Services, RBAC and
// PodDisruptionBudgets the docs tell providers to apply are valid as
// shipped.
func TestDeployManifestsAreAcceptedByTheAPIServer(t *testing.T) {
	t.Parallel()
	hub := harness.StartHub(t, "hub-a") // without the BaseImage CRD: the manifests install it
	for _, dir := range []string{"default", "gate"} {
		t.Run(dir, func(t *testing.T) { applyKustomization(t, hub, dir) })
	}
}

// applyKustomization creates what config/DIR renders on hub and checks
// that it holds the kinds a deployment needs.
func applyKustomization(t *testing.T, hub *harness.Hub, dir string) {
	kubectl := harness.Binary(t, "kubectl")
	out, err := exec.Command(kubectl, "kustomize", filepath.Join("..", "..", "config", dir)).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize config/%s: %v", dir, err)
	}
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
		if _, err := res.Create(t.Context(), &obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil && !(gvk.Kind == "Namespace" && apierrors.IsAlreadyExists(err)) {
			t.Errorf("%s %s/%s refused: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		kinds[gvk.Kind] = true
	}
	want := map[string][]string{
		"default": {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "CustomResourceDefinition"},
		"gate":    {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim"},
	}
	for _, kind := range want[dir] {
		if !kinds[kind] {
			t.Errorf("config/%s renders no %s (got %v)", dir, kind, strings.Join(mapKeys(kinds), ", "))
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
