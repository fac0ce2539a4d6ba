package syncer

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
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
// networks annotation to its VM's pod, or clone from another namespace
// (sourceRef, source.pvc, source.snapshot, or the PVC-style dataSourceRef
// of spec.storage or spec.pvc, in a DataVolume or a VM's template); in
// its home namespace (labelled by the provider) and in its network's
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
	// CDI passes a PVC-style dataSourceRef to the claim it makes; with
	// Kubernetes' CrossNamespaceVolumeDataSource its namespace is another's.
	populateFrom := func(ns, from string, pvc bool) client.Object {
		ref := &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Namespace: &from, Name: "disk"}
		dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "copy"}}
		if pvc {
			dv.Spec.PVC = &corev1.PersistentVolumeClaimSpec{DataSourceRef: ref}
		} else {
			dv.Spec.Storage = &cdiv1.StorageSpec{DataSourceRef: ref}
		}
		return dv
	}
	vmPopulating := func(ns, from string) client.Object {
		vm := haltedVM(ns, "web")
		vm.Spec.DataVolumeTemplates = []kubevirtv1.DataVolumeTemplateSpec{{ObjectMeta: metav1.ObjectMeta{Name: "root"}, Spec: cdiv1.DataVolumeSpec{
			Storage: &cdiv1.StorageSpec{DataSourceRef: &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Namespace: &from, Name: "disk"}},
		}}}
		return vm
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
			"another namespace's network attachment":            {withNetwork(ns, "globex/lab"), "may attach only network attachments of its own namespace"},
			"the Multus networks annotation":                    {withAnnotation(ns), "may not carry the annotation k8s.v1.cni.cncf.io/networks"},
			"a clone from another namespace":                    {cloneFrom(ns, "globex"), "may clone only from " + ns},
			"a VM cloning another namespace's image":            {vmCloning(ns, "globex"), "may clone only from " + ns},
			"a VM cloning its tenant's image":                   {vmCloning(ns, "acme"), ""},
			"a storage dataSourceRef to another namespace":      {populateFrom(ns, "globex", false), "may clone only from " + ns},
			"a pvc dataSourceRef to another namespace":          {populateFrom(ns, "globex", true), "may clone only from " + ns},
			"a VM's storage dataSourceRef to another namespace": {vmPopulating(ns, "globex"), "may clone only from " + ns},
			"a storage dataSourceRef to its own namespace":      {populateFrom(ns, ns, false), ""},
			"a pvc dataSourceRef to its own namespace":          {populateFrom(ns, ns, true), ""},
			"its own network attachment":                        {withNetwork(ns, "lab"), ""},
			"its own network attachment, qualified":             {withNetwork(ns, ns+"/lab"), ""},
			"a clone from its own namespace":                    {cloneFrom(ns, ns), ""},
			"a VM cloning its own image":                        {vmCloning(ns, ns), ""},
		} {
			var err error
			waitFor(t, "the policy in force ("+what+" in "+ns+" refused)", func() (bool, error) {
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
// user: a namespace that is no network's (not HOME-net-NAME of its
// annotation HOME/NAME) cannot be created, nor one that is no network's
// deleted; a tenant namespace's other labels cannot change, its tenant
// label cannot go, its tenant annotation cannot change or go; only the
// tenant role can be bound, as imagepipe-tenant, only in a network's
// namespace, never to system:anonymous or a system: group but the home's
// ServiceAccounts; and only the syncer's
// two ResourceQuotas can be written, each where it belongs. A network's
// namespace, binding and quotas, made and deleted by the syncer itself,
// pass.
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
	// A tenant's namespace whose tenant is recorded, a network's namespace
	// (as if image-syncer had made it), and a role of no rules, which RBAC
	// lets anyone bind.
	hub.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "initech",
		Labels: map[string]string{"imagepipe.io/tenant": "initech"}, Annotations: map[string]string{"imagepipe.io/tenant": "initech"}}})
	hub.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "acme-net-lab",
		Annotations: map[string]string{"imagepipe.io/private-network-of": "acme/lab"},
		Labels:      map[string]string{"k8s.ovn.org/primary-user-defined-network": "", "imagepipe.io/private-network": "lab"}}})
	hub.Create(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nothing-at-all"}})
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
	// A namespace of a network's form, but not of what its annotation
	// says, or of no network's name, or not labelled as the syncer does.
	for _, c := range []struct{ name, of, network string }{
		{"evil", "acme/evil", "evil"},
		{"globex-net-front", "acme/front", "front"},
		{"acme-net-network-name-of-forty-one-characters-1234", "acme/network-name-of-forty-one-characters-1234", "network-name-of-forty-one-characters-1234"},
		{"acme-net-x", "acme/x/y", "x"},
		{"acme--net-x", "acme-/x", "x"},
		{"acme-net-y", "acme/y", "z"},
		{"acme-net-w", "acme/w", ""},
	} {
		labels := map[string]string{"k8s.ovn.org/primary-user-defined-network": "", "imagepipe.io/private-network": c.network}
		if c.network == "" {
			labels = map[string]string{"imagepipe.io/private-network": "w"} // no OVN label
		}
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.name, Annotations: map[string]string{"imagepipe.io/private-network-of": c.of}, Labels: labels}}
		refused("creating namespace "+c.name+" annotated for network "+c.of+", labelled "+fmt.Sprint(labels), syncer.Create(t.Context(), ns, client.DryRunAll), "creates only namespaces of private networks")
	}
	// The tenant's label and annotation: set, changed (the label), never dropped.
	initech := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "initech"}}
	for what, patch := range map[string]string{
		"dropping a namespace's tenant label":      `{"metadata":{"labels":{"imagepipe.io/tenant":null}}}`,
		"dropping a namespace's tenant annotation": `{"metadata":{"annotations":{"imagepipe.io/tenant":null}}}`,
		"giving a namespace to another tenant":     `{"metadata":{"annotations":{"imagepipe.io/tenant":"acme"},"labels":{"imagepipe.io/tenant":"acme"}}}`,
	} {
		refused(what, syncer.Patch(t.Context(), initech, client.RawPatch(types.MergePatchType, []byte(patch)), client.DryRunAll), "never removes a namespace's imagepipe.io/tenant label")
	}
	// In a network's namespace (made here by the admin): no other role,
	// binding name, or subjects that are everybody; no other quota.
	tenantA := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant-a"}}
	toRole := func(name, role string, subjects []rbacv1.Subject) *rbacv1.RoleBinding {
		return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "acme-net-lab", Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}, Subjects: subjects}
	}
	if err := syncer.Create(t.Context(), toRole("cluster-admin", "cluster-admin", tenantA), client.DryRunAll); err == nil {
		t.Errorf("as image-syncer, binding cluster-admin in a network's namespace: accepted")
	} // RBAC refuses it first (the syncer may bind only imagepipe-tenant)
	waitFor(t, "RBAC to know the role nothing-at-all", func() (bool, error) {
		err = syncer.Create(t.Context(), toRole("imagepipe-tenant", "nothing-at-all", tenantA), client.DryRunAll)
		return err == nil || !apierrors.IsNotFound(err), nil
	})
	refused("binding another role in a network's namespace", err, "binds only the role imagepipe-tenant")
	refused("binding the tenant role under another name", syncer.Create(t.Context(), toRole("mine", "imagepipe-tenant", tenantA), client.DryRunAll), "binds only the role imagepipe-tenant")
	for _, s := range []rbacv1.Subject{
		{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"},
		{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:masters"},
		{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:nodes"},
		{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts:globex"},
		{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "system:anonymous"},
	} {
		refused("binding the tenant role to "+s.Name, syncer.Create(t.Context(), toRole("imagepipe-tenant", "imagepipe-tenant", append([]rbacv1.Subject{s}, tenantA...)), client.DryRunAll), "binds the tenant role only to Users, Groups and ServiceAccounts")
	}
	quota := func(ns, name string, labels map[string]string) *corev1.ResourceQuota {
		return &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}}}
	}
	share := map[string]string{"imagepipe.io/quota-share-of": "acme", "imagepipe.io/private-network": "lab"}
	for what, q := range map[string]*corev1.ResourceQuota{
		"a quota of another name in a home":    quota("globex", "squeeze", nil),
		"a network's share in a home":          quota("globex", "imagepipe-network-share", share),
		"a quota of another name in a network": quota("acme-net-lab", "squeeze", share),
		"a home's share in a network":          quota("acme-net-lab", "imagepipe-home-share", nil),
		"a network's share of another home":    quota("acme-net-lab", "imagepipe-network-share", map[string]string{"imagepipe.io/quota-share-of": "globex", "imagepipe.io/private-network": "lab"}),
	} {
		refused("writing "+what, syncer.Create(t.Context(), q, client.DryRunAll), "writes only the ResourceQuotas imagepipe-network-share")
	}
	for what, obj := range map[string]client.Object{
		"a network's namespace": &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "acme-net-dev", Annotations: map[string]string{"imagepipe.io/private-network-of": "acme/dev"}, Labels: map[string]string{"k8s.ovn.org/primary-user-defined-network": "", "imagepipe.io/private-network": "dev"}}},
		"a network's binding":   toRole("imagepipe-tenant", "imagepipe-tenant", append([]rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "acme", Name: "ci"}, {Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "acme-admins"}, {Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts:acme"}}, tenantA...)),
		"a network's share":     quota("acme-net-lab", "imagepipe-network-share", share),
		"a home's share":        quota("globex", "imagepipe-home-share", nil),
	} {
		if err := syncer.Create(t.Context(), obj, client.DryRunAll); err != nil {
			t.Errorf("as image-syncer, writing %s: %v", what, err)
		}
	}
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
