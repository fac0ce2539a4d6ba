package hub

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// tenantHub is a hub prepared as a provider prepares one for its tenants'
// imagectl vm and volume commands, without image-syncer or CDI's
// controller: the BaseImage CRD, namespaces acme and globex, a default
// StorageClass whose CDI StorageProfile the provider gave ReadWriteMany
// Block (spec.claimPropertySets, as for a provisioner CDI does not know),
// and the hub user tenant-a bound to config/tenant's RBAC in acme only.
type tenantHub struct {
	*harness.Hub
	// kc is the admin's client, as imagectl's; c the admin's
	// controller-runtime client, for status writes.
	kc *kube.Client
	c  client.Client
	// tenant are imagectl's flags for tenant-a in acme, admin for the
	// admin (namespace left to each command).
	tenant, admin []string
}

func startTenantHub(t *testing.T, name string) *tenantHub {
	t.Helper()
	hub := harness.StartHub(t, name, crdDir(t))
	scheme := harness.NewScheme(t)
	kc, err := kube.New(hub.RestConfig, scheme)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(hub.RestConfig, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	h := &tenantHub{Hub: hub, kc: kc, c: c}
	block := corev1.PersistentVolumeBlock
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "acme"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "globex"}},
		&storagev1.StorageClass{
			ObjectMeta:  metav1.ObjectMeta{Name: "shared", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
			Provisioner: "example.com/shared",
		},
		&cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Spec: cdiv1.StorageProfileSpec{ClaimPropertySets: []cdiv1.ClaimPropertySet{
			{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &block},
		}}},
	}
	objs = append(objs, tenantRBAC(t)...)
	user := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant-a"}}
	objs = append(objs,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a", Namespace: "acme"}, Subjects: user,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "imagepipe-tenant"}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a-storage"}, Subjects: user,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "imagepipe-tenant-storage"}},
	)
	for _, o := range objs {
		if err := c.Create(t.Context(), o); err != nil {
			t.Fatalf("hub %s: creating %T %s: %v", name, o, o.GetName(), err)
		}
	}
	h.waitAuthorized(t, "tenant-a", authorizationv1.ResourceAttributes{Namespace: "acme", Verb: "delete", Group: "cdi.kubevirt.io", Resource: "datavolumes"})
	h.tenant = []string{"--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "acme"}
	h.admin = []string{"--kubeconfig", hub.Kubeconfig}
	return h
}

// tenantRBAC reads the ClusterRoles of config/tenant/rbac.yaml.
func tenantRBAC(t *testing.T) []client.Object {
	t.Helper()
	return harness.ReadManifests(t, filepath.Join(harness.RepoRoot(t), "config", "tenant", "rbac.yaml"))
}

// waitAuthorized waits until the apiserver's RBAC authorizer, which reads
// bindings through informers, lets user do what attrs says.
func (h *tenantHub) waitAuthorized(t *testing.T, user string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
		if err := h.c.Create(t.Context(), review); err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s may still not %s %s 10s after binding: %s", user, attrs.Verb, attrs.Resource, review.Status.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createVM renders a simple VM named name in ns, as vm create does, and
// creates it with vmlaunch.Create as the admin. No BaseImage is needed:
// nothing on this hub checks the DataSource it clones.
func (h *tenantHub) createVM(t *testing.T, ns, name string, stopped bool) *kubevirtv1.VirtualMachine {
	t.Helper()
	tmpl, values := simpleTemplate(t)
	r, err := vmlaunch.Render(vmlaunch.Request{
		Name: name, Namespace: ns, Template: tmpl, Values: values, Stopped: stopped,
		Image: vmlaunch.Image{Tenant: ns, Name: "rhel", Tag: "9", Namespace: ns, DataSource: "rhel--9",
			Digest: "sha256:" + strings.Repeat("ef", 32), VirtualSize: 1 << 30},
		Storage: cdi.Storage{StorageClass: "shared", AccessMode: corev1.ReadWriteMany, VolumeMode: corev1.PersistentVolumeBlock},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := vmlaunch.Create(t.Context(), h.kc, r); err != nil {
		t.Fatal(err)
	}
	return r.VM
}

// virtController plays KubeVirt's virt-controller and virt-handler, which
// do not run on a test hub: it writes what they would report of a VM.
type virtController struct {
	t *testing.T
	c client.Client
}

// reportStatus sets the VM's status through its status subresource, as
// virt-controller does.
func (v virtController) reportStatus(ns, name string, status kubevirtv1.VirtualMachineStatus) {
	v.t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := v.c.Get(v.t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &vm); err != nil {
		v.t.Fatal(err)
	}
	vm.Status = status
	if err := v.c.Status().Update(v.t.Context(), &vm); err != nil {
		v.t.Fatalf("reporting the status of VM %s/%s: %v", ns, name, err)
	}
}

// startInstance creates the instance of the VM as the hub now stores it,
// running on node with address ip, with the LiveMigratable condition
// KubeVirt would report (harness.StartedInstance), and returns it.
// VirtualMachineInstances have no status subresource: the status is
// stored as created.
func (v virtController) startInstance(vm *kubevirtv1.VirtualMachine, node, ip string) *kubevirtv1.VirtualMachineInstance {
	v.t.Helper()
	var stored kubevirtv1.VirtualMachine
	if err := v.c.Get(v.t.Context(), client.ObjectKeyFromObject(vm), &stored); err != nil {
		v.t.Fatalf("reading VM %s/%s: %v", vm.Namespace, vm.Name, err)
	}
	vmi := harness.StartedInstance(&stored, node, ip, v.claims(&stored))
	if err := v.c.Create(v.t.Context(), vmi); err != nil {
		v.t.Fatalf("starting the instance of VM %s/%s: %v", vm.Namespace, vm.Name, err)
	}
	return vmi
}

// claims are the access modes of the claims of vm's volumes, as
// virt-controller reads them. CDI's controller does not run on these
// hubs, so a claim that does not exist is the one CDI would bind for the
// DataVolume of its name, the hub's or one of the VM's templates, with
// the access modes the DataVolume asks for; a claim with neither is
// missing, as virt-controller would find it.
func (v virtController) claims(vm *kubevirtv1.VirtualMachine) harness.Claims {
	v.t.Helper()
	ctx := v.t.Context()
	out := harness.Claims{}
	for _, vol := range vm.Spec.Template.Spec.Volumes {
		var name string
		switch {
		case vol.PersistentVolumeClaim != nil:
			name = vol.PersistentVolumeClaim.ClaimName
		case vol.DataVolume != nil:
			name = vol.DataVolume.Name
		default:
			continue
		}
		var pvc corev1.PersistentVolumeClaim
		err := v.c.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: name}, &pvc)
		if err == nil {
			out[name] = pvc.Spec.AccessModes
			continue
		}
		if !apierrors.IsNotFound(err) {
			v.t.Fatalf("reading claim %s/%s: %v", vm.Namespace, name, err)
		}
		var dv cdiv1.DataVolume
		err = v.c.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: name}, &dv)
		switch {
		case err == nil:
		case apierrors.IsNotFound(err):
			i := slices.IndexFunc(vm.Spec.DataVolumeTemplates, func(t kubevirtv1.DataVolumeTemplateSpec) bool { return t.Name == name })
			if i < 0 {
				continue
			}
			dv.Spec = vm.Spec.DataVolumeTemplates[i].Spec
		default:
			v.t.Fatalf("reading DataVolume %s/%s: %v", vm.Namespace, name, err)
		}
		switch {
		case dv.Spec.Storage != nil:
			out[name] = dv.Spec.Storage.AccessModes
		case dv.Spec.PVC != nil:
			out[name] = dv.Spec.PVC.AccessModes
		}
	}
	return out
}

// complete asks imagectl, through cobra's hidden __complete command as a
// shell does, for the candidates of the last of args, and returns them
// and the directive.
func complete(t *testing.T, env []string, args ...string) (candidates []string, directive string) {
	t.Helper()
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: append([]string{"__complete"}, args...), Env: env})
	if r.Code != 0 {
		t.Fatalf("imagectl __complete %s: exit %d\n%s", strings.Join(args, " "), r.Code, r.Stderr)
	}
	lines := strings.Split(strings.TrimRight(r.Stdout, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, ":") {
		t.Fatalf("imagectl __complete %s printed no directive:\n%s", strings.Join(args, " "), r.Stdout)
	}
	return lines[:len(lines)-1], last
}

// dataVolumeGone reports whether ns/name is deleted or being deleted.
func (h *tenantHub) dataVolumeGone(t *testing.T, ns, name string) bool {
	t.Helper()
	var dv cdiv1.DataVolume
	err := h.c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &dv)
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	return dv.DeletionTimestamp != nil
}

// simpleTemplate is a one-parameter template (vm_memory, 2Gi by default)
// and its resolved default values.
func simpleTemplate(t *testing.T) (*api.VMTemplate, map[string]vmlaunch.Value) {
	t.Helper()
	tmpl, err := vmlaunch.ParseTemplate([]byte(`{"id":"simple_vm","title":"Simple VM","parameters":[{"name":"vm_memory","default":{"value":"2Gi"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	values, err := vmlaunch.ResolveParameters(tmpl, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl, values
}
