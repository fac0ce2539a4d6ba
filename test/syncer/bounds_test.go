package syncer

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestOneTenantCannotTakeTheHub: what a hub shares between tenants
// (namespaces, NodePorts, external addresses) is bounded per tenant over
// all of its namespaces, whichever client writes the objects. With
// image-syncer's bounds at 1 network, 2 load balancers and 4 exposed ports,
// tenant-a writes PrivateNetworks and LoadBalancers through the API as
// itself: past each bound the newest gets nothing and says which bound; a
// load balancer naming no VM holds no Service; no Service holds a NodePort;
// and tenant-b, meanwhile, gets what it asks for.
func TestOneTenantCannotTakeTheHub(t *testing.T) {
	t.Parallel()
	hub := &testHub{harness.StartSyncerHub(t, "hub-bounds", harness.SyncerHubOptions{Namespaces: []string{"acme", "globex"}, NoCDI: true, OVNKubernetes: true})}
	hub.StartControllerManager(t, "garbage-collector-controller", "namespace-controller")
	hub.BindTenant(t, "tenant-a", "acme")
	hub.BindTenant(t, "tenant-b", "globex")
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	startSyncer(t, harness.ReserveSyncer(t), hub, reg.Host, "--poll-interval", "1h",
		"--max-networks-per-tenant", "1", "--max-load-balancers-per-tenant", "2", "--max-exposed-ports-per-tenant", "4")
	acme, globex := userClient(t, hub, "tenant-a"), userClient(t, hub, "tenant-b")
	ready := func(obj client.Object, conds func() []metav1.Condition, reason, says string) {
		t.Helper()
		waitFor(t, obj.GetNamespace()+"/"+obj.GetName()+" "+reason, func() (bool, error) {
			err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), obj)
			c := meta.FindStatusCondition(conds(), v1alpha1.ConditionReady)
			return c != nil && c.Reason == reason && strings.Contains(c.Message, says), err
		})
	}

	// Networks: the second of acme's gets no namespace until the first goes.
	front := network("acme", "front", "10.10.0.0/24")
	back := network("acme", "back", "10.20.0.0/24")
	lab := network("globex", "lab", "10.10.0.0/24")
	for c, pn := range map[client.Client]*v1alpha1.PrivateNetwork{acme: front, globex: lab} {
		if err := c.Create(t.Context(), pn); err != nil {
			t.Fatal(err)
		}
	}
	pnConds := func(pn *v1alpha1.PrivateNetwork) func() []metav1.Condition {
		return func() []metav1.Condition { return pn.Status.Conditions }
	}
	ready(front, pnConds(front), v1alpha1.ReasonProvisioned, "acme-net-front")
	if err := acme.Create(t.Context(), back); err != nil {
		t.Fatal(err)
	}
	ready(back, pnConds(back), v1alpha1.ReasonTenantLimit, "--max-networks-per-tenant=1")
	ready(lab, pnConds(lab), v1alpha1.ReasonProvisioned, "globex-net-lab")
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Name: "acme-net-back"}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Errorf("a network past the bound got its namespace (%v)", err)
	}

	// Load balancers, across acme's home and its network's namespace.
	for _, ns := range []string{"acme", "acme-net-front", "globex"} {
		hub.Create(t, haltedVM(ns, "web"))
	}
	lbConds := func(lb *v1alpha1.LoadBalancer) func() []metav1.Condition {
		return func() []metav1.Condition { return lb.Status.Conditions }
	}
	ghost := balancer("acme", "ghost", []string{"nobody"}, 80)
	a1 := balancer("acme", "a1", []string{"web"}, 80, 443, 8443)
	a2 := balancer("acme-net-front", "a2", []string{"web"}, 22)
	a3 := balancer("acme", "a3", []string{"web"}, 8080, 8081)
	g1 := balancer("globex", "g1", []string{"web"}, 80, 443, 8443)
	for c, lbs := range map[client.Client][]*v1alpha1.LoadBalancer{acme: {ghost, a1, a2}, globex: {g1}} {
		for _, lb := range lbs {
			if err := c.Create(t.Context(), lb); err != nil {
				t.Fatal(err)
			}
		}
	}
	ready(ghost, lbConds(ghost), v1alpha1.ReasonHostsMissing, "gets its Service once one is")
	ready(a1, lbConds(a1), v1alpha1.ReasonNoReadyHosts, "")
	ready(a2, lbConds(a2), v1alpha1.ReasonNoReadyHosts, "")
	if err := acme.Create(t.Context(), a3); err != nil {
		t.Fatal(err)
	}
	ready(a3, lbConds(a3), v1alpha1.ReasonTenantLimit, "--max-load-balancers-per-tenant=2")
	ready(g1, lbConds(g1), v1alpha1.ReasonNoReadyHosts, "")
	for lb, want := range map[*v1alpha1.LoadBalancer]bool{ghost: false, a1: true, a2: true, a3: false, g1: true} {
		var svc corev1.Service
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(lb), &svc)
		switch {
		case !want && !apierrors.IsNotFound(err):
			t.Errorf("load balancer %s/%s holds a Service (%v)", lb.Namespace, lb.Name, err)
		case want && err != nil:
			t.Errorf("load balancer %s/%s: %v", lb.Namespace, lb.Name, err)
		case want:
			if a := svc.Spec.AllocateLoadBalancerNodePorts; a == nil || *a {
				t.Errorf("%s/%s: allocateLoadBalancerNodePorts %v, want false", lb.Namespace, lb.Name, a)
			}
			for _, p := range svc.Spec.Ports {
				if p.NodePort != 0 {
					t.Errorf("%s/%s holds NodePort %d", lb.Namespace, lb.Name, p.NodePort)
				}
			}
		}
	}

	// a2 deleted, a3 is within the count but not the ports (3 + 2 > 4);
	// a1 deleted, a3 gets its Service.
	if err := acme.Delete(t.Context(), a2); err != nil {
		t.Fatal(err)
	}
	ready(a3, lbConds(a3), v1alpha1.ReasonTenantLimit, "--max-exposed-ports-per-tenant")
	if err := acme.Delete(t.Context(), a1); err != nil {
		t.Fatal(err)
	}
	ready(a3, lbConds(a3), v1alpha1.ReasonNoReadyHosts, "")
	if err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(a3), &corev1.Service{}); err != nil {
		t.Errorf("a3 within the bounds again has no Service: %v", err)
	}

	// g1's only host deleted, its Service goes.
	if err := hub.Client.Delete(t.Context(), haltedVM("globex", "web")); err != nil {
		t.Fatal(err)
	}
	ready(g1, lbConds(g1), v1alpha1.ReasonHostsMissing, "")
	waitFor(t, "g1's Service gone with its last host", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(g1), &corev1.Service{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})

	// The network deleted, the next one gets its namespace.
	if err := hub.Client.Delete(t.Context(), haltedVM("acme-net-front", "web")); err != nil {
		t.Fatal(err)
	}
	if err := acme.Delete(t.Context(), front); err != nil {
		t.Fatal(err)
	}
	ready(back, pnConds(back), v1alpha1.ReasonProvisioned, "acme-net-back")
}

// TestALoadBalancerSendsTrafficOnlyToItsVMsOwnPod: on the pod network, the
// address a VM's instance reports (its guest agent may say anything) goes
// behind the load balancer only when the VM's own virt-launcher pod holds
// it.
//
// Played by this test: virt-controller creating the instance and its
// virt-launcher pod, virt-handler reporting the instance's address, and
// kubelet reporting the pods' addresses.
func TestALoadBalancerSendsTrafficOnlyToItsVMsOwnPod(t *testing.T) {
	t.Parallel()
	hub := &testHub{harness.StartSyncerHub(t, "hub-podaddr", harness.SyncerHubOptions{Namespaces: []string{"acme"}, NoCDI: true})}
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	startSyncer(t, harness.ReserveSyncer(t), hub, reg.Host, "--poll-interval", "1h")
	vm := haltedVM("acme", "web")
	hub.Create(t, vm)
	hub.Create(t, balancer("acme", "web", []string{"web"}, 80))

	// Another pod of the namespace, whose address the guest will claim.
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "acme", Name: "db", Labels: map[string]string{"kubevirt.io": "virt-launcher"}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "db", Image: "db"}}}}
	hub.Create(t, other)
	setPodStatus(t, hub, other, harness.LauncherPodStatus("10.244.0.8"))

	vmi := harness.RunningInstance(vm, "node-1", "10.244.0.7", true)
	vmi.Status.Conditions = append(vmi.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue})
	hub.Create(t, vmi)
	endpoints := func(what string, want ...string) {
		t.Helper()
		waitFor(t, what, func() (bool, error) {
			var slice discoveryv1.EndpointSlice
			err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "web-hosts"}, &slice)
			var got []string
			for _, e := range slice.Endpoints {
				got = append(got, e.Addresses...)
			}
			return err == nil && strings.Join(got, ",") == strings.Join(want, ","), client.IgnoreNotFound(err)
		})
	}
	endpoints("no endpoint before the instance's pod holds the address")
	pod := harness.LauncherPod(vmi, "node-1")
	hub.Create(t, pod)
	setPodStatus(t, hub, pod, harness.LauncherPodStatus("10.244.0.7"))
	endpoints("the endpoint on the pod's address", "10.244.0.7")

	// The guest claims the other pod's address.
	vmi.Status.Interfaces[0].IP, vmi.Status.Interfaces[0].IPs = "10.244.0.8", []string{"10.244.0.8"}
	if err := hub.Client.Update(t.Context(), vmi); err != nil {
		t.Fatal(err)
	}
	endpoints("no endpoint on another pod's address")
}

// provisioned creates pn as c's user and waits until image-syncer
// provisioned it.
func provisioned(t *testing.T, hub *testHub, c client.Client, pn *v1alpha1.PrivateNetwork) {
	t.Helper()
	if err := c.Create(t.Context(), pn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, pn.Namespace+"'s network "+pn.Name+" provisioned", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(pn), pn)
		c := meta.FindStatusCondition(pn.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == v1alpha1.ReasonProvisioned, err
	})
}

func setPodStatus(t *testing.T, hub *testHub, pod *corev1.Pod, status corev1.PodStatus) {
	t.Helper()
	pod.Status = status
	if err := hub.Client.Status().Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
}

func network(ns, name, subnet string) *v1alpha1.PrivateNetwork {
	return &v1alpha1.PrivateNetwork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.PrivateNetworkSpec{IPv4CIDR: subnet}}
}

func balancer(ns, name string, hosts []string, ports ...int32) *v1alpha1.LoadBalancer {
	lb := &v1alpha1.LoadBalancer{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.LoadBalancerSpec{Hosts: hosts}}
	for _, p := range ports {
		lb.Spec.Ports = append(lb.Spec.Ports, v1alpha1.LoadBalancerPort{Port: p, Protocol: "TCP"})
	}
	return lb
}

// haltedVM is a minimal stopped VirtualMachine.
func haltedVM(ns, name string) *kubevirtv1.VirtualMachine {
	halted := kubevirtv1.RunStrategyHalted
	memory := resource.MustParse("128Mi")
	return &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &halted,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{Memory: &kubevirtv1.Memory{Guest: &memory}},
			}},
		},
	}
}

// TestANetworksNamespaceIsNoTenants: a registry tenant named like a private
// network's namespace (HOME-net-NAME) gets nothing synced on a hub, while
// the network's home has no image yet (so no tenant recorded on its
// namespaces) and after: its images would land among another tenant's
// VMs, and the name would be one a network may need. imagectl refuses the
// name; the pushes here come from another OCI client.
func TestANetworksNamespaceIsNoTenants(t *testing.T) {
	t.Parallel()
	hub := &testHub{harness.StartSyncerHub(t, "hub-squat", harness.SyncerHubOptions{Namespaces: []string{"globex"}, NoCDI: true, OVNKubernetes: true})}
	hub.BindTenant(t, "tenant-b", "globex")
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h", "--log-level", "debug")
	provisioned(t, hub, userClient(t, hub, "tenant-b"), network("globex", "lab", "10.10.0.0/24"))

	squat := reg.Host + "/globex-net-lab/rhel:1"
	wantRefused(t, testenv.RunImagectl(t, "import", rawDisk(t, "squatter"), squat), "a tenant of a network's form", "form of a private network's namespace")
	pushContainerDisk(t, squat, rawDisk(t, "squatter"))
	waitLogLine(t, s, "event ignored", "repository=globex-net-lab/rhel")
	importImage(t, rawDisk(t, "globex"), reg.Host+"/globex/rhel:1")
	hub.baseImage(t, "globex", "rhel--1", "globex's own image", func(*v1alpha1.BaseImage) bool { return true })
	// Now that the home is recorded as globex's, once more.
	pushContainerDisk(t, reg.Host+"/globex-net-lab/web:1", rawDisk(t, "squatter-2"))
	waitLogLine(t, s, "event ignored", "repository=globex-net-lab/web")
	hub.wantNoBaseImagesOf(t, "globex-net-lab", "globex-net-lab")
	var ns corev1.Namespace
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Name: "globex-net-lab"}, &ns); err != nil {
		t.Fatal(err)
	}
	if owner := ns.Annotations["imagepipe.io/tenant"]; owner == "globex-net-lab" {
		t.Errorf("the network's namespace is recorded as tenant %q's", owner)
	}
}
