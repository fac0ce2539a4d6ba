package harness_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/test/harness"
)

var (
	dataVolumes    = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}
	dataSources    = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datasources"}
	virtualMachine = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	instancetypes  = schema.GroupVersionResource{Group: "instancetype.kubevirt.io", Version: "v1beta1", Resource: "virtualmachineclusterinstancetypes"}
)

const ns = "images"

const dataVolumeYAML = `
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: fedora
  namespace: images
spec:
  source:
    registry:
      url: docker://registry.example:5000/vm/fedora:42
      pullMethod: node
  pvc:
    accessModes: [ReadWriteMany]
    volumeMode: Block
    resources:
      requests:
        storage: 10Gi
`

const dataSourceYAML = `
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataSource
metadata:
  name: fedora
  namespace: images
spec:
  source:
    pvc:
      name: fedora
      namespace: images
`

const virtualMachineYAML = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: vm1
  namespace: images
spec:
  runStrategy: Halted
  instancetype:
    kind: VirtualMachineClusterInstancetype
    name: u1.small
  dataVolumeTemplates:
  - metadata:
      name: vm1-root
    spec:
      sourceRef:
        kind: DataSource
        name: fedora
        namespace: images
      storage:
        resources:
          requests:
            storage: 10Gi
  template:
    metadata:
      labels:
        app: vm1
    spec:
      domain:
        devices:
          disks:
          - name: root
            disk:
              bus: virtio
      volumes:
      - name: root
        dataVolume:
          name: vm1-root
`

const instancetypeYAML = `
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineClusterInstancetype
metadata:
  name: u1.small
spec:
  cpu:
    guest: 1
  memory:
    guest: 2Gi
`

// TestHubsServeCDIAndKubeVirtWithRBAC starts two hubs and checks on each what the image-syncer's
// tests rely on: the real CDI, KubeVirt and instancetype schemas accept well-formed objects (and
// keep their fields) and reject malformed ones, and a HubUsers token has no rights until a
// RoleBinding grants them.
func TestHubsServeCDIAndKubeVirtWithRBAC(t *testing.T) {
	hubs := []*harness.Hub{harness.StartHub(t, "hub-a"), harness.StartHub(t, "hub-b")}
	if hubs[0].URL == hubs[1].URL {
		t.Fatalf("both hubs serve on %s", hubs[0].URL)
	}
	for _, h := range hubs {
		t.Run(h.Name, func(t *testing.T) {
			checkHubSchemas(t, h)
			checkHubRBAC(t, h)
		})
	}

	// Hubs are separate clusters: hub-a's objects and tokens mean nothing to hub-b.
	ctx := t.Context()
	onlyA := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "only-on-hub-a"}}
	if _, err := kubernetes.NewForConfigOrDie(hubs[0].RestConfig).CoreV1().Namespaces().Create(ctx, onlyA, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(hubs[1].RestConfig).CoreV1().Namespaces().Get(ctx, onlyA.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("hub-b: get namespace made on hub-a: err = %v, want NotFound", err)
	}
	crossed := userClient(t, hubs[0].UserKubeconfig(t, "syncer"))
	crossed.Host = hubs[1].URL
	crossed.CAData = hubs[1].RestConfig.CAData
	if _, err := dynamic.NewForConfigOrDie(crossed).Resource(dataVolumes).Namespace(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("hub-a's syncer token on hub-b: err = %v, want Unauthorized", err)
	}
}

func checkHubSchemas(t *testing.T, h *harness.Hub) {
	ctx := t.Context()
	kube := kubernetes.NewForConfigOrDie(h.RestConfig)
	dyn := dynamic.NewForConfigOrDie(h.RestConfig)
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	strict := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if _, err := dyn.Resource(instancetypes).Create(ctx, object(t, instancetypeYAML), strict); err != nil {
		t.Fatalf("creating instancetype: %v", err)
	}
	for _, c := range []struct {
		gvr  schema.GroupVersionResource
		yaml string
		// field must survive the schema's pruning: proof the schema knows it.
		field []string
		want  any
	}{
		{dataVolumes, dataVolumeYAML, []string{"spec", "source", "registry", "url"}, "docker://registry.example:5000/vm/fedora:42"},
		{dataSources, dataSourceYAML, []string{"spec", "source", "pvc", "name"}, "fedora"},
		{virtualMachine, virtualMachineYAML, []string{"spec", "runStrategy"}, "Halted"},
	} {
		obj := object(t, c.yaml)
		// Strict: a field the real schema does not know fails the create instead of vanishing.
		if _, err := dyn.Resource(c.gvr).Namespace(ns).Create(ctx, obj, strict); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		got, err := dyn.Resource(c.gvr).Namespace(ns).Get(ctx, obj.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, _, _ := unstructured.NestedFieldNoCopy(got.Object, c.field...); v != c.want {
			t.Errorf("%s %s: %s = %v, want %v", obj.GetKind(), obj.GetName(), strings.Join(c.field, "."), v, c.want)
		}
	}

	vm, err := dyn.Resource(virtualMachine).Namespace(ns).Get(ctx, "vm1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	templates, _, _ := unstructured.NestedSlice(vm.Object, "spec", "dataVolumeTemplates")
	if len(templates) != 1 {
		t.Fatalf("vm1 has %d dataVolumeTemplates, want 1", len(templates))
	}
	if name, _, _ := unstructured.NestedString(templates[0].(map[string]any), "metadata", "name"); name != "vm1-root" {
		t.Errorf("vm1 dataVolumeTemplates[0].metadata.name = %q, want vm1-root (pruned by the schema?)", name)
	}

	bad := []struct {
		name, field string
		mutate      func(map[string]any)
	}{
		{"url not a string", "spec.source.registry.url", func(o map[string]any) {
			_ = unstructured.SetNestedField(o, int64(42), "spec", "source", "registry", "url")
		}},
		{"storage not a quantity", "spec.pvc.resources.requests.storage", func(o map[string]any) {
			_ = unstructured.SetNestedField(o, "lots", "spec", "pvc", "resources", "requests", "storage")
		}},
		{"unknown field, strict", "spec.source.registry.bogus", func(o map[string]any) {
			_ = unstructured.SetNestedField(o, "x", "spec", "source", "registry", "bogus")
		}},
	}
	for _, b := range bad {
		obj := object(t, dataVolumeYAML)
		obj.SetName("invalid")
		b.mutate(obj.Object)
		_, err := dyn.Resource(dataVolumes).Namespace(ns).Create(ctx, obj, strict)
		if err == nil {
			t.Errorf("%s: invalid DataVolume accepted", b.name)
			continue
		}
		if !(apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)) || !strings.Contains(err.Error(), b.field) {
			t.Errorf("%s: err = %v, want Invalid or BadRequest naming %s", b.name, err, b.field)
		}
	}
}

func checkHubRBAC(t *testing.T, h *harness.Hub) {
	ctx := t.Context()
	syncer := dynamic.NewForConfigOrDie(userClient(t, h.UserKubeconfig(t, "syncer")))
	tenant := dynamic.NewForConfigOrDie(userClient(t, h.UserKubeconfig(t, "tenant-a")))
	dv := object(t, dataVolumeYAML)
	dv.SetName("from-syncer")

	if _, err := syncer.Resource(dataVolumes).Namespace(ns).Create(ctx, dv, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("syncer creating a DataVolume before any RoleBinding: err = %v, want Forbidden", err)
	}

	kube := kubernetes.NewForConfigOrDie(h.RestConfig)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "image-syncer", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"cdi.kubevirt.io"},
			Resources: []string{"datavolumes", "datasources"},
			Verbs:     []string{"get", "list", "watch", "create", "update", "patch", "delete"},
		}},
	}
	if _, err := kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "image-syncer", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "syncer"}},
	}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The RBAC authorizer learns of the binding through an informer: poll until it does.
	err := poll(ctx, 30*time.Second, func() error {
		_, err := syncer.Resource(dataVolumes).Namespace(ns).Create(ctx, dv, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("syncer creating a DataVolume after the RoleBinding: %v", err)
	}
	// Least privilege: the binding names the syncer only, and only CDI's resources.
	if _, err := tenant.Resource(dataVolumes).Namespace(ns).Get(ctx, dv.GetName(), metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("tenant-a reading the syncer's DataVolume: err = %v, want Forbidden", err)
	}
	if _, err := syncer.Resource(virtualMachine).Namespace(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("syncer listing VirtualMachines: err = %v, want Forbidden", err)
	}
}

// userClient loads a kubeconfig file the way the syncer and kubectl do.
func userClient(t *testing.T, kubeconfig string) *rest.Config {
	t.Helper()
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("loading %s: %v", kubeconfig, err)
	}
	return config
}

// object parses one YAML manifest.
func object(t *testing.T, manifest string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(manifest), &obj.Object); err != nil {
		t.Fatalf("parsing manifest: %v", err)
	}
	return obj
}

// poll calls f every 100 ms until it returns nil or timeout passes, and returns f's last error.
func poll(ctx context.Context, timeout time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
