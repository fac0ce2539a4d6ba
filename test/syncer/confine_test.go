package syncer

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/test/harness"
)

// TestATenantsObjectsNameNothingOutsideItsNamespace: with
// config/tenant/policy.yaml on the real API server (harness.BindTenant
// applies it, as on every test/syncer hub), a tenant writing
// VirtualMachines and DataVolumes with its own credentials (no imagectl)
// cannot name another namespace's network attachment, pass a Multus
// networks annotation to its VM's pod, or clone from another namespace;
// in its home namespace (labelled by the provider) and in its network's
// (labelled by image-syncer) alike. The same objects naming their own
// namespace pass.
func TestATenantsObjectsNameNothingOutsideItsNamespace(t *testing.T) {
	t.Parallel()
	hub := &testHub{harness.StartSyncerHub(t, "hub-confine", harness.SyncerHubOptions{Namespaces: []string{"acme", "globex"}, NoCDI: true, OVNKubernetes: true})}
	hub.BindTenant(t, "tenant-a", "acme") // with the policy, acme labelled for it
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	startSyncer(t, harness.ReserveSyncer(t), hub, reg.Host, "--poll-interval", "1h")
	acme := userClient(t, hub, "tenant-a")
	front := network("acme", "front", "10.10.0.0/24")
	provisioned(t, hub, acme, front)

	withNetwork := func(ns, networkName string) client.Object {
		vm := haltedVM(ns, "web")
		vm.Spec.Template.Spec.Networks = []kubevirtv1.Network{{Name: "lab", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: networkName}}}}
		vm.Spec.Template.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "lab", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}}}
		return vm
	}
	withAnnotation := func(ns string) client.Object {
		vm := haltedVM(ns, "web")
		vm.Spec.Template.ObjectMeta.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": "globex/lab"}
		return vm
	}
	cloneFrom := func(ns, from string) client.Object {
		return &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copy"}, Spec: cdiv1.DataVolumeSpec{
			Source:  &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: from, Name: "disk"}},
			Storage: &cdiv1.StorageSpec{},
		}}
	}
	vmCloning := func(ns, from string) client.Object {
		vm := haltedVM(ns, "web")
		vm.Spec.DataVolumeTemplates = []kubevirtv1.DataVolumeTemplateSpec{{ObjectMeta: metav1.ObjectMeta{Name: "root"}, Spec: cdiv1.DataVolumeSpec{
			SourceRef: &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Namespace: &from, Name: "rhel--9"},
			Storage:   &cdiv1.StorageSpec{},
		}}}
		return vm
	}
	for _, ns := range []string{"acme", "acme-net-front"} {
		for what, c := range map[string]struct {
			obj  client.Object
			want string // "" accepted
		}{
			"another namespace's network attachment": {withNetwork(ns, "globex/lab"), "may attach only network attachments of its own namespace"},
			"the Multus networks annotation":         {withAnnotation(ns), "may not carry the annotation k8s.v1.cni.cncf.io/networks"},
			"a clone from another namespace":         {cloneFrom(ns, "globex"), "may clone only from " + ns},
			"a VM cloning another namespace's image": {vmCloning(ns, "globex"), "may clone only from " + ns},
			"a VM cloning its tenant's image":        {vmCloning(ns, "acme"), ""},
			"its own network attachment":             {withNetwork(ns, "lab"), ""},
			"its own network attachment, qualified":  {withNetwork(ns, ns+"/lab"), ""},
			"a clone from its own namespace":         {cloneFrom(ns, ns), ""},
			"a VM cloning its own image":             {vmCloning(ns, ns), ""},
		} {
			var err error
			waitFor(t, "the policy in force", func() (bool, error) {
				err = acme.Create(t.Context(), c.obj, client.DryRunAll)
				// The API server loads a new policy within a second or so;
				// until then a refused object passes.
				return c.want == "" || err != nil, nil
			})
			switch {
			case c.want == "" && err != nil:
				t.Errorf("%s in %s: refused: %v", what, ns, err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("%s in %s: %v; want refused saying %q", what, ns, err, c.want)
			}
		}
	}
}

// TestTheSyncerTouchesOnlyNetworksNamespaces: image-syncer's RBAC lets it
// create and delete any namespace and bind its tenant role anywhere;
// config/syncer/policy.yaml, on the real API server, holds the hub user it
// runs as to what it does (every test/syncer hub has it). Acting as that
// user: a namespace that is no network's cannot be created or deleted, a
// tenant namespace's other labels cannot change, and the tenant role
// cannot be bound outside a network's namespace. A network's namespace,
// made and deleted by the syncer itself, passes.
func TestTheSyncerTouchesOnlyNetworksNamespaces(t *testing.T) {
	t.Parallel()
	hub := &testHub{harness.StartSyncerHub(t, "hub-syncer-confine", harness.SyncerHubOptions{Namespaces: []string{"acme", "globex"}, NoCDI: true, OVNKubernetes: true})}
	hub.StartControllerManager(t, "namespace-controller", "garbage-collector-controller")
	hub.BindTenant(t, "tenant-a", "acme")
	syncer := userClient(t, hub, "syncer")
	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("as image-syncer, %s: %v; want refused saying %q", what, err, want)
		}
	}
	var err error
	waitFor(t, "the policy in force", func() (bool, error) {
		err = syncer.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "anything"}}, client.DryRunAll)
		return err != nil, nil
	})
	refused("creating a namespace that is no network's", err, "creates only namespaces of private networks")
	refused("deleting a tenant's namespace", syncer.Delete(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "globex"}}, client.DryRunAll), "deletes only namespaces of private networks")
	strip := []byte(`{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"privileged"}}}`)
	refused("relabelling a tenant's namespace", syncer.Patch(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "globex"}}, client.RawPatch(types.MergePatchType, strip), client.DryRunAll), "changes only the imagepipe.io/tenant annotation and label")
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "globex", Name: "imagepipe-tenant"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "imagepipe-tenant"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant-a"}}}
	refused("binding the tenant role in another tenant's namespace", syncer.Create(t.Context(), bind, client.DryRunAll), "binds only the role imagepipe-tenant, and only in namespaces of private networks")
	tag := []byte(`{"metadata":{"labels":{"imagepipe.io/tenant":"globex"},"annotations":{"imagepipe.io/tenant":"globex"}}}`)
	if err := syncer.Patch(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "globex"}}, client.RawPatch(types.MergePatchType, tag), client.DryRunAll); err != nil {
		t.Errorf("as image-syncer, recording a namespace's tenant: %v", err)
	}

	// What the syncer does for a network passes: its namespace, binding,
	// and the namespace's deletion.
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	startSyncer(t, harness.ReserveSyncer(t), hub, reg.Host, "--poll-interval", "1h")
	acme := userClient(t, hub, "tenant-a")
	front := network("acme", "front", "10.10.0.0/24")
	provisioned(t, hub, acme, front)
	if err := acme.Delete(t.Context(), front); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the network and its namespace gone", func() (bool, error) {
		errNet := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(front), front)
		errNS := hub.Client.Get(t.Context(), client.ObjectKey{Name: "acme-net-front"}, &corev1.Namespace{})
		return apierrors.IsNotFound(errNet) && apierrors.IsNotFound(errNS), nil
	})
}
