package syncer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/netsync"
	"github.com/imagepipe/imagepipe/internal/tenantnet"
	"github.com/imagepipe/imagepipe/pkg/api"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestPrivateNetworks: a tenant makes a private network with imagectl and
// image-syncer provisions it on a real hub with OVN-Kubernetes' CRDs (no
// OVN-Kubernetes runs): a namespace created with the primary-network label,
// a Layer2 primary UserDefinedNetwork with persistent addresses, and the
// tenant's access there. Two VMs go on it, pass KubeVirt's own admission and
// are live-migratable by KubeVirt's verdict; the network cannot be deleted
// while one is there, and goes with its namespace after both are deleted.
// Another tenant can neither use it nor reach its namespace.
func TestPrivateNetworks(t *testing.T) {
	t.Parallel()
	testenv.RequireQEMU(t)
	hub := &testHub{harness.StartSyncerHub(t, "hub-a", harness.SyncerHubOptions{Namespaces: []string{"acme", "globex"}, OVNKubernetes: true})}
	hub.BindTenant(t, "tenant-a", "acme")
	hub.BindTenant(t, "tenant-b", "globex")
	adm := hub.StartKubeVirtAdmission(t, harness.OpenShiftVirtualizationCR())
	s := harness.ReserveSyncer(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURL: s.WebhookURL, NotifyToken: webhookToken})
	startSyncer(t, s, hub, reg.Host, "--poll-interval", "1h")
	v1 := importImage(t, rawDisk(t, "bootable"), reg.Host+"/acme/rhel:9")
	hub.waitReady(t, "acme", "rhel--9", v1.Digest)
	tmpl := filepath.Join(t.TempDir(), "simple_vm.yaml")
	if err := os.WriteFile(tmpl, []byte("id: simple_vm\ntitle: Simple VM\nvm:\n  memory: 1Gi\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	acme := []string{"--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "acme"}
	globex := []string{"--kubeconfig", hub.UserKubeconfig(t, "tenant-b"), "-n", "globex"}
	run := func(kube []string, args ...string) testenv.Result {
		return testenv.RunImagectl(t, append(args, kube...)...)
	}
	refused := func(r testenv.Result, what, want string) { t.Helper(); wantRefused(t, r, what, want) }

	// Bad input is refused before anything is created.
	refused(run(acme, "network", "create", "Front", "--subnet", "10.10.0.0/24"), "a name outside the DNS grammar", "want a DNS label")
	refused(run(acme, "network", "create", strings.Repeat("n", 41), "--subnet", "10.10.0.0/24"), "a name too long", "at most 40 characters")
	refused(run(acme, "network", "create", "front", "--subnet", "10.10.0.300/24"), "an invalid CIDR", "want an IPv4 network address")
	refused(run(acme, "network", "create", "front", "--subnet", "10.10.0.1/24"), "host bits", "the network address is 10.10.0.0/24")
	refused(run(acme, "network", "create", "front", "--subnet", "10.0.0.0/30"), "a prefix too long", "from 8 to 29")
	refused(run(acme, "network", "create", "front", "--subnet", "100.64.8.0/24"), "OVN-Kubernetes' join subnet", "overlaps 100.64.0.0/16, OVN-Kubernetes' join subnet")
	refused(run(acme, "network", "create", "front", "--subnet", "fd00::/64"), "IPv6", "want an IPv4 network address")
	var list v1alpha1.PrivateNetworkList
	if err := hub.Client.List(t.Context(), &list); err != nil || len(list.Items) != 0 {
		t.Fatalf("refused creates left networks: %v %v", list.Items, err)
	}

	r := testenv.RunImagectlOK(t, append([]string{"network", "create", "front", "--subnet", "10.10.0.0/24", "--wait"}, acme...)...)
	if !strings.Contains(r.Stdout, "its VMs live in namespace acme-net-front") {
		t.Errorf("network create printed:\n%s", r.Stdout)
	}
	var ns corev1.Namespace
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Name: "acme-net-front"}, &ns); err != nil {
		t.Fatal(err)
	}
	if _, ok := ns.Labels[tenantnet.LabelPrimaryUDN]; !ok || ns.Annotations[tenantnet.AnnotationNetworkOf] != "acme/front" {
		t.Errorf("the network's namespace: labels %v, annotations %v", ns.Labels, ns.Annotations)
	}
	udn := &unstructured.Unstructured{}
	udn.SetGroupVersionKind(tenantnet.UDNKind)
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme-net-front", Name: "primary"}, udn); err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(udn.Object["spec"])
	if string(spec) != `{"layer2":{"ipam":{"lifecycle":"Persistent"},"role":"Primary","subnets":["10.10.0.0/24"]},"topology":"Layer2"}` {
		t.Errorf("UserDefinedNetwork spec %s", spec)
	}
	var rb rbacv1.RoleBinding
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme-net-front", Name: "imagepipe-tenant"}, &rb); err != nil {
		t.Fatal(err)
	}
	if len(rb.Subjects) != 1 || rb.Subjects[0].Name != "tenant-a" {
		t.Errorf("access to the network's namespace: %+v", rb.Subjects)
	}

	// A subnet overlapping the tenant's own network is refused by imagectl,
	// and by the syncer when a PrivateNetwork is created without imagectl.
	refused(run(acme, "network", "create", "back", "--subnet", "10.10.0.128/25"), "an overlapping subnet", "overlaps 10.10.0.0/24 of network front")
	sneaky := &v1alpha1.PrivateNetwork{ObjectMeta: metav1.ObjectMeta{Name: "sneaky", Namespace: "acme"}, Spec: v1alpha1.PrivateNetworkSpec{IPv4CIDR: "10.10.0.0/16"}}
	hub.Create(t, sneaky)
	waitFor(t, "the overlapping network refused", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(sneaky), sneaky)
		c := meta.FindStatusCondition(sneaky.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == v1alpha1.ReasonSubnetInvalid && strings.Contains(c.Message, "overlaps 10.10.0.0/24 of network front"), err
	})
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Name: "acme-net-sneaky"}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused network got a namespace (%v)", err)
	}
	// The CRD refuses what the syncer would never see: host bits set.
	bad := &v1alpha1.PrivateNetwork{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "acme"}, Spec: v1alpha1.PrivateNetworkSpec{IPv4CIDR: "10.20.0.1/24"}}
	if err := hub.Client.Create(t.Context(), bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "ipv4Cidr must be an IPv4 network address") {
		t.Errorf("a PrivateNetwork with host bits set: %v", err)
	}

	// A network's subnet cannot change under its VMs.
	moved := &v1alpha1.PrivateNetwork{}
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "front"}, moved); err != nil {
		t.Fatal(err)
	}
	moved.Spec.IPv4CIDR = "10.11.0.0/24"
	if err := hub.Client.Update(t.Context(), moved); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "ipv4Cidr cannot change") {
		t.Errorf("changing a network's subnet: %v", err)
	}

	// A network made inside a network's namespace is not a home: refused.
	nested := &v1alpha1.PrivateNetwork{ObjectMeta: metav1.ObjectMeta{Name: "nested", Namespace: "acme-net-front"}, Spec: v1alpha1.PrivateNetworkSpec{IPv4CIDR: "10.40.0.0/24"}}
	tenantA := userClient(t, hub, "tenant-a")
	if err := tenantA.Create(t.Context(), nested); err != nil {
		t.Fatalf("tenant-a creating a network in the network's namespace: %v", err)
	}
	waitFor(t, "the nested network refused", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(nested), nested)
		c := meta.FindStatusCondition(nested.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == v1alpha1.ReasonNotHome, err
	})
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Name: "acme-net-front-net-nested"}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Errorf("the nested network got a namespace (%v)", err)
	}
	if err := tenantA.Delete(t.Context(), nested); err != nil {
		t.Fatal(err)
	}

	// A namespace of the network's name that is not the network's is never
	// taken over, nor deleted with the network.
	hub.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "acme-net-taken", Labels: map[string]string{"owner": "someone-else"}}})
	testenv.RunImagectlOK(t, append([]string{"network", "create", "taken", "--subnet", "10.50.0.0/24"}, acme...)...)
	taken := &v1alpha1.PrivateNetwork{ObjectMeta: metav1.ObjectMeta{Name: "taken", Namespace: "acme"}}
	waitFor(t, "the network whose namespace is taken refused", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(taken), taken)
		c := meta.FindStatusCondition(taken.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == v1alpha1.ReasonNamespaceUsed, err
	})
	refused(run(acme, "vm", "create", "x", "--network", "taken", "--image", "acme/rhel:9", "--template-file", tmpl), "a VM on a network whose namespace is taken", "NamespaceUsed")
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme-net-taken", Name: "primary"}, udn); !apierrors.IsNotFound(err) {
		t.Errorf("a UserDefinedNetwork went into a namespace not the network's (%v)", err)
	}
	testenv.RunImagectlOK(t, append([]string{"network", "delete", "taken", "--wait"}, acme...)...)
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Name: "acme-net-taken"}, &ns); err != nil || !ns.DeletionTimestamp.IsZero() {
		t.Errorf("deleting the network touched a namespace not its own: %v, deleting %v", err, !ns.DeletionTimestamp.IsZero())
	}

	// Two VMs on the network, each live-migratable by KubeVirt's verdict.
	for _, name := range []string{"web-1", "web-2"} {
		r := testenv.RunImagectlOK(t, append([]string{"vm", "create", name, "--network", "front", "--image", "acme/rhel:9", "--template-file", tmpl}, acme...)...)
		if !strings.Contains(r.Stdout, "virtualmachine acme-net-front/"+name+" created") || !strings.Contains(r.Stderr, "will be live-migratable") {
			t.Errorf("vm create %s --network front:\n%s%s", name, r.Stdout, r.Stderr)
		}
		if lm := adm.LiveMigration(t, "acme-net-front", name); !lm.LiveMigratable() || lm.LaunchError != "" {
			t.Errorf("KubeVirt says %s is live-migratable %v (%s: %s), launch error %q", name, lm.LiveMigratable(), lm.Condition.Reason, lm.Condition.Message, lm.LaunchError)
		}
	}
	var vm kubevirtv1.VirtualMachine
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme-net-front", Name: "web-1"}, &vm); err != nil {
		t.Fatal(err)
	}
	if ref := vm.Spec.DataVolumeTemplates[0].Spec.SourceRef; ref == nil || ref.Namespace == nil || *ref.Namespace != "acme" || ref.Name != "rhel--9" {
		t.Errorf("web-1 clones %+v, want the DataSource acme/rhel--9", ref)
	}
	if b := vm.Spec.Template.Spec.Domain.Devices.Interfaces; len(b) != 1 || b[0].Binding == nil || b[0].Binding.Name != "l2bridge" {
		t.Errorf("web-1's interfaces %+v, want one bound with l2bridge", b)
	}

	// A VM may choose its address on the network: KubeVirt's IP request,
	// which passes KubeVirt's admission; an address another VM asked for,
	// outside the subnet or without a network is refused.
	r = testenv.RunImagectlOK(t, append([]string{"vm", "create", "web-3", "--network", "front", "--ip", "10.10.0.20", "--image", "acme/rhel:9", "--template-file", tmpl}, acme...)...)
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme-net-front", Name: "web-3"}, &vm); err != nil {
		t.Fatal(err)
	}
	if got := vm.Spec.Template.ObjectMeta.Annotations["network.kubevirt.io/addresses"]; got != `{"default":["10.10.0.20/24"]}` {
		t.Errorf("web-3's IP request %q", got)
	}
	refused(run(acme, "vm", "create", "web-4", "--network", "front", "--ip", "10.10.0.20", "--image", "acme/rhel:9", "--template-file", tmpl), "an address another VM asked for", "VM web-3 already asks for address 10.10.0.20 on network front")
	refused(run(acme, "vm", "create", "web-4", "--network", "front", "--ip", "10.20.0.5", "--image", "acme/rhel:9", "--template-file", tmpl), "an address outside the subnet", "not in the network's subnet 10.10.0.0/24")
	refused(run(acme, "vm", "create", "web-4", "--ip", "10.10.0.21", "--image", "acme/rhel:9", "--template-file", tmpl), "an address without a network", "--ip needs --network")
	testenv.RunImagectlOK(t, append([]string{"vm", "delete", "web-3", "--network", "front"}, acme...)...)

	// Another tenant can neither name the network nor reach its namespace.
	refused(run(globex, "vm", "create", "x", "--network", "front", "--image", "globex/rhel:9", "--template-file", tmpl), "another tenant's network", "no network front in namespace globex")
	refused(testenv.RunImagectl(t, "vm", "create", "x", "--image", "acme/rhel:9", "--template-file", tmpl, "--kubeconfig", hub.UserKubeconfig(t, "tenant-b"), "-n", "acme-net-front"),
		"another tenant's network namespace", "forbidden")
	refused(run(globex, "network", "delete", "front"), "deleting another tenant's network", "no network front in namespace globex")

	exposeVMs(t, hub, acme, globex)
	attachLocalnets(t, hub, adm, acme, tmpl)

	// In use: imagectl refuses, naming the VMs; a delete made without it
	// is held by the finalizer until they are gone.
	refused(run(acme, "network", "delete", "front"), "deleting a network in use", "network front is in use by 2 VM(s): web-1, web-2")
	var nets []api.Network
	if err := json.Unmarshal([]byte(testenv.RunImagectlOK(t, append([]string{"network", "list", "-o", "json"}, acme...)...).Stdout), &nets); err != nil {
		t.Fatal(err)
	}
	if len(nets) != 2 || nets[0].Name != "front" || nets[0].VMCount != 2 || strings.Join(nets[0].VMs, ",") != "web-1,web-2" || nets[0].Ready != "True" || nets[0].VMNamespace != "acme-net-front" {
		t.Errorf("network list: %+v", nets)
	}
	front := &v1alpha1.PrivateNetwork{ObjectMeta: metav1.ObjectMeta{Name: "front", Namespace: "acme"}}
	if err := hub.Client.Delete(t.Context(), front); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion held for the VMs", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(front), front)
		c := meta.FindStatusCondition(front.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == v1alpha1.ReasonVMsPresent && strings.Contains(c.Message, "web-1, web-2"), err
	})
	testenv.RunImagectlOK(t, "vm", "delete", "web-1", "--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "acme-net-front")
	waitFor(t, "the count down to one VM", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(front), front)
		return front.Status.VirtualMachineCount == 1, err
	})
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Name: "acme-net-front"}, &ns); err != nil || !ns.DeletionTimestamp.IsZero() {
		t.Errorf("the namespace of a network still in use: deleting %v (%v)", !ns.DeletionTimestamp.IsZero(), err)
	}
	testenv.RunImagectlOK(t, "vm", "delete", "web-2", "--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "acme-net-front")
	waitFor(t, "the network and its namespace gone", func() (bool, error) {
		errNet := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(front), front)
		errNS := hub.Client.Get(t.Context(), client.ObjectKey{Name: "acme-net-front"}, &ns)
		return apierrors.IsNotFound(errNet) && apierrors.IsNotFound(errNS), nil
	})
	// The name is free again.
	testenv.RunImagectlOK(t, append([]string{"network", "create", "front", "--subnet", "10.30.0.0/24", "--wait"}, acme...)...)
}

// exposeVMs: the tenant of acme exposes web-1 and web-2, on network front,
// through a load balancer. Bad input is refused before anything is made;
// image-syncer makes a Service without a selector and an EndpointSlice in
// the form OVN-Kubernetes reads for the namespace's primary network, on the
// addresses of the VMs that run and are ready; the external address reaches
// vm get and vm list. Another tenant can expose none of it, and a Service of
// the load balancer's name that is not its own is never taken over.
//
// Played by this test (no node, no load-balancer implementation runs):
// virt-controller and virt-handler storing the VMs' running instances, and
// the hub's load-balancer implementation assigning the external address.
func exposeVMs(t *testing.T, hub *testHub, acme, globex []string) {
	t.Helper()
	const ns = "acme-net-front"
	run := func(kube []string, args ...string) testenv.Result {
		return testenv.RunImagectl(t, append(args, kube...)...)
	}
	refused := func(r testenv.Result, what, want string) { t.Helper(); wantRefused(t, r, what, want) }
	onFront := append([]string{"--network", "front"}, acme...)
	refused(run(onFront, "vm", "expose", "web-1"), "no port", "name at least one port")
	refused(run(onFront, "vm", "expose", "web-1", "--port", "0"), "port 0", "want a number from 1 to 65535")
	refused(run(onFront, "vm", "expose", "web-1", "--port", "80:65536"), "a target port out of range", "want a number from 1 to 65535")
	refused(run(onFront, "vm", "expose", "web-1", "--port", "80/icmp"), "an unknown protocol", "none of tcp, udp and sctp")
	refused(run(onFront, "vm", "expose", "web-1", "--port", "80:8080", "--port", "80/tcp"), "a port exposed twice", "external port 80/TCP is already exposed by --port 80:8080")
	refused(run(onFront, "vm", "expose", "Web-1", "--port", "80"), "a VM name outside the DNS grammar", `VM name "Web-1"`)
	refused(run(onFront, "vm", "expose", "web-1", "web-1", "--port", "80"), "a VM named twice", "VM web-1 is named twice")
	refused(run(onFront, "vm", "expose", "web-3", "--port", "80"), "a VM that does not exist", "no VM web-3 in namespace acme-net-front")
	var lbs v1alpha1.LoadBalancerList
	if err := hub.Client.List(t.Context(), &lbs); err != nil || len(lbs.Items) != 0 {
		t.Fatalf("refused exposes left load balancers: %v %v", lbs.Items, err)
	}
	// The CRD refuses a port exposed twice from any client.
	tenantA, tenantB := userClient(t, hub, "tenant-a"), userClient(t, hub, "tenant-b")
	twice := &v1alpha1.LoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "twice", Namespace: ns}, Spec: v1alpha1.LoadBalancerSpec{
		Hosts: []string{"web-1"}, Ports: []v1alpha1.LoadBalancerPort{{Port: 80, Protocol: "TCP"}, {Port: 80, TargetPort: 90, Protocol: "TCP"}},
	}}
	if err := tenantA.Create(t.Context(), twice); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Duplicate value") {
		t.Errorf("a LoadBalancer exposing port 80/TCP twice: %v", err)
	}

	// Another tenant exposes none of acme's VMs: not from its namespace, where
	// no VM has the name, nor in acme's.
	refused(run(globex, "vm", "expose", "web-1", "--port", "80"), "another tenant's VM", "no VM web-1 in namespace globex")
	refused(testenv.RunImagectl(t, "vm", "expose", "web-1", "--port", "80", "--kubeconfig", hub.UserKubeconfig(t, "tenant-b"), "-n", ns), "another tenant's namespace", "forbidden")
	stray := &v1alpha1.LoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "stray", Namespace: "globex"}, Spec: v1alpha1.LoadBalancerSpec{
		Hosts: []string{"web-1"}, Ports: []v1alpha1.LoadBalancerPort{{Port: 80, Protocol: "TCP"}},
	}}
	if err := tenantB.Create(t.Context(), stray); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a load balancer naming another tenant's VM finding no host", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(stray), stray)
		c := meta.FindStatusCondition(stray.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == v1alpha1.ReasonHostsMissing && strings.Contains(c.Message, "no VM of namespace globex is named web-1"), err
	})

	// A Service of the chosen name that is not the load balancer's stays as
	// it is, even labelled as a load balancer's.
	hub.Create(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns, Labels: map[string]string{netsync.LabelLoadBalancer: "api"}}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "api"}, Ports: []corev1.ServicePort{{Port: 80}},
	}})
	refused(run(onFront, "vm", "expose", "web-1", "--name", "api", "--port", "80", "--wait"), "a Service of that name", "ServiceUsed")
	var other corev1.Service
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "api"}, &other); err != nil || other.Spec.Type != corev1.ServiceTypeClusterIP || other.Spec.Selector["app"] != "api" {
		t.Errorf("the Service not the load balancer's: type %s, selector %v (%v)", other.Spec.Type, other.Spec.Selector, err)
	}
	testenv.RunImagectlOK(t, append([]string{"vm", "unexpose", "api"}, onFront...)...)

	// Exposed: a Service without a selector, and endpoints on the VMs once
	// they run and are ready.
	var e struct {
		Name, Ready string
		Ports       []string
	}
	r := testenv.RunImagectlOK(t, append([]string{"vm", "expose", "web-1", "web-2", "--name", "web", "--port", "80:8080", "--port", "443:8443", "-o", "json"}, onFront...)...)
	if err := json.Unmarshal([]byte(r.Stdout), &e); err != nil || e.Name != "web" || strings.Join(e.Ports, ",") != "80:8080/TCP,443:8443/TCP" {
		t.Errorf("vm expose -o json: %+v (%v)\n%s", e, err, r.Stdout)
	}
	var svc corev1.Service
	waitFor(t, "the load balancer's Service", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web"}, &svc)
		return err == nil, client.IgnoreNotFound(err)
	})
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Spec.Selector) != 0 || len(svc.Spec.Ports) != 2 ||
		svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.IntValue() != 8080 || svc.Spec.Ports[1].Port != 443 {
		t.Errorf("the load balancer's Service: %+v", svc.Spec)
	}
	for _, name := range []string{"web-1", "web-2"} {
		var vm kubevirtv1.VirtualMachine
		if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &vm); err != nil {
			t.Fatal(err)
		}
		vmi := harness.RunningInstance(&vm, "node-1", map[string]string{"web-1": "10.10.0.5", "web-2": "10.10.0.6"}[name], true)
		vmi.Status.Conditions = append(vmi.Status.Conditions, kubevirtv1.VirtualMachineInstanceCondition{Type: kubevirtv1.VirtualMachineInstanceReady, Status: corev1.ConditionTrue})
		hub.Create(t, vmi)
	}
	var slice discoveryv1.EndpointSlice
	waitFor(t, "endpoints on both VMs", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web-hosts"}, &slice)
		return err == nil && len(slice.Endpoints) == 2 && *slice.Endpoints[0].Conditions.Ready && *slice.Endpoints[1].Conditions.Ready, client.IgnoreNotFound(err)
	})
	if slice.Labels["k8s.ovn.org/service-name"] != "web" || slice.Annotations["k8s.ovn.org/endpointslice-network"] != "acme-net-front_primary" ||
		slice.Labels[discoveryv1.LabelServiceName] != "" || slice.Endpoints[0].Addresses[0] != "10.10.0.5" || slice.Endpoints[1].Addresses[0] != "10.10.0.6" ||
		len(slice.Ports) != 2 || *slice.Ports[0].Port != 8080 || *slice.Ports[1].Port != 8443 {
		t.Errorf("the EndpointSlice, for OVN-Kubernetes on the network: labels %v, annotations %v, endpoints %+v, ports %+v", slice.Labels, slice.Annotations, slice.Endpoints, slice.Ports)
	}
	lb := &v1alpha1.LoadBalancer{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}}
	waitFor(t, "the load balancer waiting for its address", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(lb), lb)
		c := meta.FindStatusCondition(lb.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == v1alpha1.ReasonAddressPending, err
	})

	// The hub's load-balancer implementation assigns the address.
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
	if err := hub.Client.Status().Update(t.Context(), &svc); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the load balancer exposed", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(lb), lb)
		c := meta.FindStatusCondition(lb.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == v1alpha1.ReasonExposed, err
	})
	var got api.VMSummary
	if err := json.Unmarshal([]byte(testenv.RunImagectlOK(t, "vm", "get", "web-2", "-o", "json", "--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", ns).Stdout), &got); err != nil {
		t.Fatal(err)
	}
	if got.IP != "10.10.0.6" || strings.Join(got.ExternalIPs, ",") != "203.0.113.10" {
		t.Errorf("vm get web-2: internal IP %q, external IPs %v; want 10.10.0.6 and 203.0.113.10", got.IP, got.ExternalIPs)
	}
	if out := testenv.RunImagectlOK(t, "vm", "list", "--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", ns).Stdout; !strings.Contains(out, "EXTERNAL-IP") || strings.Count(out, "203.0.113.10") != 2 {
		t.Errorf("vm list shows no external IP of each VM:\n%s", out)
	}
	// From the tenant's own namespace: its VMs on the network, and the
	// load balancer, each with its network.
	var all []api.VMSummary
	if err := json.Unmarshal([]byte(testenv.RunImagectlOK(t, append([]string{"vm", "list", "-o", "json"}, acme...)...).Stdout), &all); err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Name != "web-1" || all[0].Network != "front" || all[0].Namespace != ns || all[1].Network != "front" {
		t.Errorf("vm list -n acme: %+v; want web-1 and web-2 on network front", all)
	}
	if r := testenv.RunImagectlOK(t, append([]string{"vm", "get", "web-2", "--network", "front"}, acme...)...); !strings.Contains(r.Stdout, "front") || !strings.Contains(r.Stdout, "10.10.0.6") {
		t.Errorf("vm get web-2 --network front:\n%s", r.Stdout)
	}
	var exposed []api.Exposure
	if err := json.Unmarshal([]byte(testenv.RunImagectlOK(t, append([]string{"loadbalancer", "list", "-o", "json"}, acme...)...).Stdout), &exposed); err != nil {
		t.Fatal(err)
	}
	if len(exposed) != 1 || exposed[0].Name != "web" || exposed[0].Network != "front" || strings.Join(exposed[0].Addresses, ",") != "203.0.113.10" || exposed[0].Ready != "True" {
		t.Errorf("loadbalancer list -n acme: %+v; want web on front at 203.0.113.10, ready", exposed)
	}

	// A VM no longer ready keeps its endpoint, marked not ready.
	var vmi kubevirtv1.VirtualMachineInstance
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web-2"}, &vmi); err != nil {
		t.Fatal(err)
	}
	for i := range vmi.Status.Conditions {
		if vmi.Status.Conditions[i].Type == kubevirtv1.VirtualMachineInstanceReady {
			vmi.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	if err := hub.Client.Update(t.Context(), &vmi); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "web-2's endpoint not ready", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(&slice), &slice)
		return err == nil && len(slice.Endpoints) == 2 && !*slice.Endpoints[1].Conditions.Ready && *slice.Endpoints[0].Conditions.Ready, err
	})

	// A guest that reports an address outside its network (its agent may
	// report anything) gets no traffic: the address is not used.
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web-1"}, &vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Status.Interfaces[0].IP, vmi.Status.Interfaces[0].IPs = "10.0.0.1", []string{"10.0.0.1"}
	if err := hub.Client.Update(t.Context(), &vmi); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "web-1's foreign address left out", func() (bool, error) {
		err := hub.Client.Get(t.Context(), client.ObjectKeyFromObject(&slice), &slice)
		return err == nil && len(slice.Endpoints) == 1 && slice.Endpoints[0].Addresses[0] == "10.10.0.6", err
	})

	// The tenant cannot reshape the Service behind image-syncer's back.
	svc.Spec.ExternalIPs = []string{"198.51.100.7"}
	if err := tenantA.Update(t.Context(), &svc); !apierrors.IsForbidden(err) {
		t.Errorf("tenant-a updating the load balancer's Service: %v, want forbidden", err)
	}

	// Unexposed: the Service and its endpoints go with the load balancer.
	testenv.RunImagectlOK(t, append([]string{"vm", "unexpose", "web"}, onFront...)...)
	waitFor(t, "the Service and EndpointSlice gone", func() (bool, error) {
		errSvc := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web"}, &corev1.Service{})
		errSlice := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web-hosts"}, &discoveryv1.EndpointSlice{})
		return apierrors.IsNotFound(errSvc) && apierrors.IsNotFound(errSlice), nil
	})
}

// attachLocalnets: a provider's localnets, ClusterUserDefinedNetworks of
// topology Localnet, one selecting acme's namespace and one another's. A VM
// of acme attaches to the first with vm create --localnet, passes KubeVirt's
// admission and stays live-migratable by its verdict; the second, a
// NetworkAttachmentDefinition OVN-Kubernetes did not write, and a bad name
// are refused before anything is created.
//
// Played by this test: OVN-Kubernetes' cluster manager writing, in each
// namespace a ClusterUserDefinedNetwork's selector admits, the
// NetworkAttachmentDefinition of the network (playOVNLocalnet).
func attachLocalnets(t *testing.T, hub *testHub, adm *harness.KubeVirtAdmission, acme []string, tmpl string) {
	t.Helper()
	for name, ns := range map[string]string{"datacenter": "acme", "lab": "globex"} {
		cudn := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "k8s.ovn.org/v1", "kind": "ClusterUserDefinedNetwork", "metadata": map[string]any{"name": name},
			"spec": map[string]any{
				"namespaceSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "kubernetes.io/metadata.name", "operator": "In", "values": []any{ns}}}},
				"network":           map[string]any{"topology": "Localnet", "localnet": map[string]any{"role": "Secondary", "physicalNetworkName": "physnet-" + name, "ipam": map[string]any{"mode": "Disabled"}}},
			},
		}}
		hub.Create(t, cudn)
		playOVNLocalnet(t, hub, cudn)
	}
	vmCreate := func(name string, extra ...string) testenv.Result {
		return testenv.RunImagectl(t, append(append([]string{"vm", "create", name, "--image", "acme/rhel:9", "--template-file", tmpl}, extra...), acme...)...)
	}
	for _, c := range []struct{ localnet, want string }{
		{"lab", "localnet lab is not offered to namespace acme"},
		{"Lab_1", `localnet "Lab_1": want a DNS label`},
		{"nowhere", "localnet nowhere is not offered to namespace acme"},
		{"forged", "is not OVN-Kubernetes' for a ClusterUserDefinedNetwork"},
	} {
		if c.localnet == "forged" {
			nad := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": map[string]any{"name": "forged", "namespace": "acme"},
				"spec": map[string]any{"config": `{"cniVersion":"1.0.0","type":"ovn-k8s-cni-overlay","topology":"localnet","role":"secondary"}`},
			}}
			if err := userClient(t, hub, "tenant-a").Create(t.Context(), nad.DeepCopy()); !apierrors.IsForbidden(err) {
				t.Errorf("tenant-a creating a NetworkAttachmentDefinition: %v, want forbidden", err)
			}
			hub.Create(t, nad)
		}
		wantRefused(t, vmCreate("x", "--localnet", c.localnet), "vm create --localnet "+c.localnet, c.want)
	}
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "x"}, &kubevirtv1.VirtualMachine{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused vm create left a VM (%v)", err)
	}

	r := vmCreate("db", "--localnet", "datacenter")
	if r.Code != 0 || !strings.Contains(r.Stderr, "will be live-migratable") {
		t.Fatalf("vm create db --localnet datacenter: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	var vm kubevirtv1.VirtualMachine
	if err := hub.Client.Get(t.Context(), client.ObjectKey{Namespace: "acme", Name: "db"}, &vm); err != nil {
		t.Fatal(err)
	}
	nets := vm.Spec.Template.Spec.Networks
	if len(nets) != 2 || nets[1].Multus == nil || nets[1].Multus.NetworkName != "datacenter" || vm.Spec.Template.Spec.Domain.Devices.Interfaces[1].Bridge == nil {
		t.Errorf("db's networks %+v, want the pod network and datacenter, bridged", nets)
	}
	if lm := adm.LiveMigration(t, "acme", "db"); !lm.LiveMigratable() || lm.LaunchError != "" {
		t.Errorf("KubeVirt says db on a localnet is live-migratable %v (%s: %s), launch error %q", lm.LiveMigratable(), lm.Condition.Reason, lm.Condition.Message, lm.LaunchError)
	}
	testenv.RunImagectlOK(t, append([]string{"vm", "delete", "db"}, acme...)...)
}

// playOVNLocalnet plays OVN-Kubernetes' cluster manager for cudn: in each
// namespace its selector admits, the NetworkAttachmentDefinition of the
// network's name, controlled by it, with the CNI configuration's topology
// and role (ovn-kubernetes go-controller/pkg/clustermanager/userdefinednetwork/template).
func playOVNLocalnet(t *testing.T, hub *testHub, cudn *unstructured.Unstructured) {
	t.Helper()
	raw, _, _ := unstructured.NestedMap(cudn.Object, "spec", "namespaceSelector")
	var ls metav1.LabelSelector
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &ls); err != nil {
		t.Fatal(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		t.Fatal(err)
	}
	var nss corev1.NamespaceList
	if err := hub.Client.List(t.Context(), &nss, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range nss.Items {
		name := cudn.GetName()
		nad := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
			"metadata": map[string]any{"name": name, "namespace": ns.Name, "labels": map[string]any{"k8s.ovn.org/user-defined-network": ""}},
			"spec":     map[string]any{"config": `{"cniVersion":"1.0.0","type":"ovn-k8s-cni-overlay","name":"cluster_udn_` + name + `","netAttachDefName":"` + ns.Name + "/" + name + `","topology":"localnet","role":"secondary"}`},
		}}
		nad.SetOwnerReferences([]metav1.OwnerReference{*metav1.NewControllerRef(cudn, cudn.GroupVersionKind())})
		hub.Create(t, nad)
	}
}

// wantRefused fails the test unless r failed with an error saying want.
func wantRefused(t *testing.T, r testenv.Result, what, want string) {
	t.Helper()
	if r.Code == 0 || !strings.Contains(r.Stderr, want) {
		t.Errorf("%s: exit %d, want an error saying %q:\n%s", what, r.Code, want, r.Stderr)
	}
}

// userClient is a client of hub acting as user, with that user's RBAC.
func userClient(t *testing.T, hub *testHub, user string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", hub.UserKubeconfig(t, user))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: harness.NewScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestVMConsoleOnAPrivateNetwork: imagectl vm console NAME --network NET
// reaches the VM in the namespace image-syncer provisioned for the
// tenant's network, not the VM of that name in the tenant's own namespace,
// which the console reaches without --network; another tenant does not
// find the network.
//
// Played by this test: virt-api and the VM's serial port
// (harness.VirtAPIConsole), and virt-controller's running instance.
func TestVMConsoleOnAPrivateNetwork(t *testing.T) {
	t.Parallel()
	hub := &testHub{harness.StartSyncerHub(t, "hub-console", harness.SyncerHubOptions{Namespaces: []string{"acme", "globex"}, NoCDI: true, OVNKubernetes: true})}
	hub.BindTenant(t, "tenant-a", "acme")
	hub.BindTenant(t, "tenant-b", "globex")
	virtAPI := hub.StartVirtAPIConsole(t)
	reg := harness.StartRegistry(t, harness.RegistryOptions{})
	startSyncer(t, harness.ReserveSyncer(t), hub, reg.Host, "--poll-interval", "1h")
	acme := []string{"--kubeconfig", hub.UserKubeconfig(t, "tenant-a"), "-n", "acme"}
	globex := []string{"--kubeconfig", hub.UserKubeconfig(t, "tenant-b"), "-n", "globex"}
	testenv.RunImagectlOK(t, append([]string{"network", "create", "front", "--subnet", "10.10.0.0/24", "--wait"}, acme...)...)
	const netNS = "acme-net-front"
	for ns, ip := range map[string]string{netNS: "10.10.0.5", "acme": "10.244.0.5"} {
		vm := haltedVM(ns, "web")
		hub.Create(t, vm)
		hub.Create(t, harness.RunningInstance(vm, "node-1", ip, true))
	}
	waitFor(t, "tenant-a allowed the consoles of "+netNS, func() (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "tenant-a", ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: netNS, Verb: "get", Group: "subresources.kubevirt.io", Resource: "virtualmachineinstances", Subresource: "console"}}}
		err := hub.Client.Create(t.Context(), review)
		return err == nil && review.Status.Allowed, err
	})
	console := func(kube []string, args ...string) testenv.Result {
		return testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: append(append([]string{"vm", "console", "web"}, args...), kube...),
			Env: []string{"IMAGEPIPE_CACHE=" + t.TempDir()}, Stdin: "ls\r"})
	}

	if r := console(acme, "--network", "front"); r.Code != 0 || r.Stdout != harness.ConsoleBanner+"ls\r" || !strings.Contains(r.Stderr, "console of "+netNS+"/web") {
		t.Errorf("vm console web --network front: exit %d, stdout %q, stderr %q; want the VM's console in %s", r.Code, r.Stdout, r.Stderr, netNS)
	}
	if r := console(acme); r.Code != 0 || !strings.Contains(r.Stderr, "console of acme/web") {
		t.Errorf("vm console web: exit %d, stderr %q; want the console of acme/web", r.Code, r.Stderr)
	}
	wantRefused(t, console(globex, "--network", "front"), "another tenant's network", "no network front in namespace globex")
	sessions := virtAPI.Sessions()
	if len(sessions) != 2 || sessions[0].User != "tenant-a" || sessions[0].Namespace != netNS || sessions[0].VMI != "web" || sessions[1].Namespace != "acme" {
		t.Errorf("virt-api served %+v, want a session of tenant-a on %s/web, then one on acme/web", sessions, netNS)
	}
}
