package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clienttesting "k8s.io/client-go/testing"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

var udnGVK = schema.GroupVersionKind{Group: "k8s.ovn.org", Version: "v1", Kind: "UserDefinedNetwork"}

// newFake returns a Client on client-go's fake dynamic client holding
// objs, and the fake, whose actions the tests inspect.
func newFake(t *testing.T, objs ...runtime.Object) (*Client, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, kubevirtv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	for gvk, scope := range map[schema.GroupVersionKind]meta.RESTScope{
		kubevirtv1.VirtualMachineGroupVersionKind:             meta.RESTScopeNamespace,
		kubevirtv1.VirtualMachineInstanceGroupVersionKind:     meta.RESTScopeNamespace,
		corev1.SchemeGroupVersion.WithKind("Secret"):          meta.RESTScopeNamespace,
		corev1.SchemeGroupVersion.WithKind("Namespace"):       meta.RESTScopeRoot,
		storagev1.SchemeGroupVersion.WithKind("StorageClass"): meta.RESTScopeRoot,
		udnGVK: meta.RESTScopeNamespace,
	} {
		mapper.Add(gvk, scope)
	}
	listKinds := map[schema.GroupVersionResource]string{
		udnGVK.GroupVersion().WithResource("userdefinednetworks"): "UserDefinedNetworkList",
	}
	fake := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, listKinds, objs...)
	return &Client{dyn: fake, scheme: scheme, mapper: mapper}, fake
}

func TestGetKeepsTheAPIStatus(t *testing.T) {
	c, _ := newFake(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a", Labels: map[string]string{"team": "a"}}})
	var ns corev1.Namespace
	if err := c.Get(t.Context(), "", "tenant-a", &ns); err != nil {
		t.Fatal(err)
	}
	if ns.Name != "tenant-a" || ns.Labels["team"] != "a" {
		t.Errorf("Get read %s with labels %v, want tenant-a with team=a", ns.Name, ns.Labels)
	}
	var vm kubevirtv1.VirtualMachine
	if err := c.Get(t.Context(), "tenant-a", "missing", &vm); !apierrors.IsNotFound(err) {
		t.Errorf("Get of a missing VM: %v, want a NotFound status error", err)
	}
}

func TestCreateReadsBackAndReportsConflicts(t *testing.T) {
	c, _ := newFake(t)
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "vm1-cloudinit"}, StringData: map[string]string{"userdata": "#cloud-config"}}
	if err := c.Create(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	var got corev1.Secret
	if err := c.Get(t.Context(), "tenant-a", "vm1-cloudinit", &got); err != nil {
		t.Fatalf("reading the created Secret: %v", err)
	}
	if got.StringData["userdata"] != "#cloud-config" {
		t.Errorf("created Secret holds %v", got.StringData)
	}
	if err := c.Create(t.Context(), s.DeepCopy()); !apierrors.IsAlreadyExists(err) {
		t.Errorf("creating it again: %v, want an AlreadyExists status error", err)
	}
}

func TestListSelectsByNamespaceAndLabel(t *testing.T) {
	vm := func(ns, name string, labels map[string]string) *kubevirtv1.VirtualMachine {
		return &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	c, _ := newFake(t,
		vm("tenant-a", "web", map[string]string{"app": "web"}),
		vm("tenant-a", "db", nil),
		vm("tenant-b", "other", map[string]string{"app": "web"}),
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "x"},
	)
	var list kubevirtv1.VirtualMachineList
	if err := c.List(t.Context(), "tenant-a", "app", &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "web" {
		t.Errorf("List in tenant-a with selector app read %d VMs %v, want only web", len(list.Items), list.Items)
	}
	var classes storagev1.StorageClassList
	if err := c.List(t.Context(), "", "", &classes); err != nil {
		t.Fatal(err)
	}
	if len(classes.Items) != 1 || classes.Items[0].Name != "fast" {
		t.Errorf("List of StorageClasses read %v, want fast", classes.Items)
	}
	udns := &unstructured.UnstructuredList{}
	udns.SetGroupVersionKind(udnGVK.GroupVersion().WithKind("UserDefinedNetworkList"))
	if err := c.List(t.Context(), "tenant-a", "", udns); err != nil {
		t.Fatalf("listing an unstructured kind the scheme does not know: %v", err)
	}
}

// TestMergePatchSendsOnlyTheChange checks that MergePatch sends what
// controller-runtime's client.MergeFrom sends: the JSON merge patch from
// the JSON of before to the JSON of after.
func TestMergePatchSendsOnlyTheChange(t *testing.T) {
	running := true
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "vm1", Labels: map[string]string{"app": "web"}},
		Spec:       kubevirtv1.VirtualMachineSpec{Running: &running}, //nolint:staticcheck // a VM made elsewhere may still use it
	}
	c, fake := newFake(t, vm)
	var patches []clienttesting.PatchAction
	fake.PrependReactor("patch", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		patches = append(patches, a.(clienttesting.PatchAction))
		return false, nil, nil
	})
	before := vm.DeepCopy()
	after := vm.DeepCopy()
	rs := kubevirtv1.RunStrategyHalted
	after.Spec.RunStrategy = &rs
	after.Spec.Running = nil //nolint:staticcheck // both cannot be set
	if err := c.MergePatch(t.Context(), before, after); err != nil {
		t.Fatal(err)
	}
	if len(patches) != 1 {
		t.Fatalf("%d patch requests, want 1", len(patches))
	}
	p := patches[0]
	if p.GetPatchType() != "application/merge-patch+json" || p.GetNamespace() != "tenant-a" || p.GetName() != "vm1" {
		t.Errorf("patch %s of %s/%s, want a merge patch of tenant-a/vm1", p.GetPatchType(), p.GetNamespace(), p.GetName())
	}
	if got, want := string(p.GetPatch()), `{"spec":{"runStrategy":"Halted","running":null}}`; got != want {
		t.Errorf("patch %s, want %s", got, want)
	}
	if after.Spec.RunStrategy == nil || *after.Spec.RunStrategy != rs || after.Labels["app"] != "web" {
		t.Errorf("after holds run strategy %v and labels %v; want the patched object read back", after.Spec.RunStrategy, after.Labels)
	}
}

func TestDeletePropagation(t *testing.T) {
	for _, foreground := range []bool{false, true} {
		vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "vm1"}}
		c, fake := newFake(t, vm)
		var opts []metav1.DeleteOptions
		fake.PrependReactor("delete", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
			opts = append(opts, a.(clienttesting.DeleteAction).GetDeleteOptions())
			return false, nil, nil
		})
		if err := c.Delete(t.Context(), vm, foreground); err != nil {
			t.Fatal(err)
		}
		if len(opts) != 1 {
			t.Fatalf("%d delete requests, want 1", len(opts))
		}
		got, want := "none", "none"
		if p := opts[0].PropagationPolicy; p != nil {
			got = string(*p)
		}
		if foreground {
			want = string(metav1.DeletePropagationForeground)
		}
		if got != want {
			t.Errorf("delete with foreground %v sent propagation policy %s, want %s", foreground, got, want)
		}
		if err := c.Get(t.Context(), "tenant-a", "vm1", &kubevirtv1.VirtualMachine{}); !apierrors.IsNotFound(err) {
			t.Errorf("reading the deleted VM: %v, want NotFound", err)
		}
		if err := c.Delete(t.Context(), vm, foreground); !apierrors.IsNotFound(err) {
			t.Errorf("deleting it again: %v, want NotFound", err)
		}
	}
}
