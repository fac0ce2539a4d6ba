package syncer

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/imagepipe/imagepipe/internal/kube"
	"github.com/imagepipe/imagepipe/internal/vmlaunch"
	"github.com/imagepipe/imagepipe/test/harness"
)

// TestTenantReadsTheNetworkBindingsKubeVirtRegisters reads, as a tenant
// through imagectl's client, the network bindings of a KubeVirt object
// stored with KubeVirt's real CRD: unreadable without config/tenant's
// RBAC, none on a cluster without a KubeVirt object, and exactly what a
// default OpenShift Virtualization install registers (l2bridge) once one
// exists.
func TestTenantReadsTheNetworkBindingsKubeVirtRegisters(t *testing.T) {
	t.Parallel()
	hub := startAPIHub(t, "hub-a")
	cfg, err := clientcmd.BuildConfigFromFlags("", hub.UserKubeconfig(t, "tenant-a"))
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := kube.New(cfg, harness.NewScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	read := func() vmlaunch.KubeVirtConfig {
		t.Helper()
		b, err := vmlaunch.ReadKubeVirtConfig(t.Context(), tenant)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := read(); b.Known {
		t.Errorf("without RBAC the tenant read %+v", b)
	}
	hub.BindTenant(t, "tenant-a", "acme")
	if b := read(); !b.Known || len(b.Bindings) != 0 {
		t.Errorf("no KubeVirt object: %+v, want known and none", b)
	}
	hub.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "openshift-cnv"}})
	hub.Create(t, &kubevirtv1.KubeVirt{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevirt-kubevirt-hyperconverged", Namespace: "openshift-cnv"},
		Spec: kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{
			NetworkConfiguration: &kubevirtv1.NetworkConfiguration{Binding: map[string]kubevirtv1.InterfaceBindingPlugin{
				vmlaunch.BindingL2Bridge: {DomainAttachmentType: kubevirtv1.ManagedTap},
			}},
		}},
	})
	b := read()
	if !b.Known || !slices.Equal(b.Bindings, []string{vmlaunch.BindingL2Bridge}) || b.Source != "KubeVirt openshift-cnv/kubevirt-kubevirt-hyperconverged" {
		t.Errorf("OpenShift-like KubeVirt: %+v", b)
	}
}
