package syncer

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/netsync"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// vmCount is the ResourceQuota resource of KubeVirt's VirtualMachines,
// lbCount that of imagepipe's LoadBalancers.
const (
	vmCount corev1.ResourceName = "count/virtualmachines.kubevirt.io"
	lbCount corev1.ResourceName = "count/loadbalancers.imagepipe.io"
)

// TestATenantsQuotaHoldsOverItsNetworks: the provider gives tenant acme a
// quota of 3 VMs in its namespace. A network made with a share of 1 takes
// it from the home, which keeps 2; a network asking for more than is left
// is refused; a network with no share can hold no VM. Creating VMs in the
// home and the network at once, the tenant gets at most 3 in all: the API
// server's own quota admission, in each namespace, enforces it. The same
// holds for CPUs (2, 1 of them front's) and for the number of load
// balancer objects (2), which the networks' shares leave at 0.
//
// kube-controller-manager runs its resource-quota controller, which makes
// the API server enforce a quota (status.hard).
func TestATenantsQuotaHoldsOverItsNetworks(t *testing.T) {
	t.Parallel()
	hub := &testHub{harness.StartSyncerHub(t, "hub-quota", harness.SyncerHubOptions{Namespaces: []string{"acme"}, NoCDI: true, OVNKubernetes: true})}
	hub.StartControllerManager(t, "resourcequota-controller", "namespace-controller", "garbage-collector-controller")
	hub.BindTenant(t, "tenant-a", "acme")
	hub.Create(t, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: "acme", Name: "tenant"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{vmCount: resource.MustParse("3"), lbCount: resource.MustParse("2"), corev1.ResourceRequestsCPU: resource.MustParse("2")}}})
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	startSyncer(t, harness.ReserveSyncer(t), hub, reg.Host, "--poll-interval", "1h")
	kube := []string{"--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "acme"}

	testenv.RunImagectlOK(t, append([]string{"network", "create", "front", "--subnet", "10.10.0.0/24", "--quota", "vms=1", "--quota", "cpu=1", "--wait"}, kube...)...)
	for ns, want := range map[string]string{"acme/" + netsync.QuotaHomeShare: "2", "acme-net-front/" + netsync.QuotaNetworkShare: "1"} {
		var q corev1.ResourceQuota
		key := strings.SplitN(ns, "/", 2)
		if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: key[0], Name: key[1]}, &q); err != nil {
			t.Fatal(err)
		}
		if got := q.Status.Hard[vmCount]; got.String() != want {
			t.Errorf("quota %s enforces %s VMs, want %s", ns, got.String(), want)
		}
	}
	r := testenv.RunImagectl(t, append([]string{"network", "create", "big", "--subnet", "10.20.0.0/24", "--quota", "vms=3", "--wait"}, kube...)...)
	wantRefused(t, r, "a share larger than the home leaves", "QuotaTooLarge")
	if !strings.Contains(r.Stderr, "the tenant's quota in acme is 3 and its other networks take 1") {
		t.Errorf("the refusal does not say what is left:\n%s", r.Stderr)
	}
	testenv.RunImagectlOK(t, append([]string{"network", "create", "none", "--subnet", "10.30.0.0/24", "--wait"}, kube...)...)

	// VMs created at once in the three namespaces, more than the quota.
	acme := userClient(t, hub, "tenant-a")
	var mu sync.Mutex
	made := map[string]int{}
	var wg sync.WaitGroup
	for _, ns := range []string{"acme", "acme-net-front", "acme-net-none"} {
		for i := range 4 {
			wg.Go(func() {
				if err := acme.Create(t.Context(), haltedVM(ns, fmt.Sprintf("vm-%d", i))); err == nil {
					mu.Lock()
					made[ns]++
					mu.Unlock()
				} else if !strings.Contains(err.Error(), "exceeded quota") {
					t.Errorf("creating a VM in %s: %v", ns, err)
				}
			})
		}
	}
	wg.Wait()
	if made["acme"] != 2 || made["acme-net-front"] != 1 || made["acme-net-none"] != 0 {
		t.Errorf("VMs made: %v; want 2 at home, 1 on front, none on none", made)
	}
	// Load balancer objects, bounded like any object: 2 in all, none on
	// the networks, whose shares do not name them.
	made = map[string]int{}
	for _, ns := range []string{"acme", "acme-net-front"} {
		for i := range 3 {
			wg.Go(func() {
				if err := acme.Create(t.Context(), balancer(ns, fmt.Sprintf("lb-%d", i), []string{"vm-0"}, 80)); err == nil {
					mu.Lock()
					made[ns]++
					mu.Unlock()
				} else if !strings.Contains(err.Error(), "exceeded quota") {
					t.Errorf("creating a load balancer in %s: %v", ns, err)
				}
			})
		}
	}
	wg.Wait()
	if made["acme"] != 2 || made["acme-net-front"] != 0 {
		t.Errorf("load balancers made: %v; want 2 at home, none on front", made)
	}
	// CPUs, which pods request (a VM's virt-launcher pod; pods made here
	// as the provider, since the quota admits any client's): 2 in all, 1
	// on front, none on none.
	made = map[string]int{}
	for _, ns := range []string{"acme", "acme-net-front", "acme-net-none"} {
		hub.Create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}})
		for i := range 2 {
			wg.Go(func() {
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("launcher-%d", i)},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "example.com/virt-launcher:1",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}}}
				if err := hub.Client.Create(t.Context(), pod); err == nil {
					mu.Lock()
					made[ns]++
					mu.Unlock()
				} else if !strings.Contains(err.Error(), "exceeded quota") {
					t.Errorf("creating a pod in %s: %v", ns, err)
				}
			})
		}
	}
	wg.Wait()
	if made["acme"] != 1 || made["acme-net-front"] != 1 || made["acme-net-none"] != 0 {
		t.Errorf("pods of 1 CPU made: %v; want 1 at home, 1 on front, none on none", made)
	}
	var all kubevirtv1.VirtualMachineList
	if err := hub.Client.List(t.Context(), &all); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) > 3 {
		t.Errorf("%d VMs in the tenant's namespaces, over its quota of 3", len(all.Items))
	}

	// The home uses its 2: a share of 1 more does not fit, and the home's
	// limit is not lowered for it, even for a moment.
	r = testenv.RunImagectl(t, append([]string{"network", "create", "extra", "--subnet", "10.40.0.0/24", "--quota", "vms=1", "--wait"}, kube...)...)
	wantRefused(t, r, "a share the home's use leaves no room for", "acme already uses 2 of the 2 the tenant's quota leaves it")
	var home corev1.ResourceQuota
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: netsync.QuotaHomeShare}, &home); err != nil {
		t.Fatal(err)
	}
	if got := home.Spec.Hard[vmCount]; got.String() != "2" {
		t.Errorf("the home's share is %s after a refused network, want 2", got.String())
	}
}
