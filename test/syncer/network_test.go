package syncer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	refused := func(r testenv.Result, what, want string) {
		t.Helper()
		if r.Code == 0 || !strings.Contains(r.Stderr, want) {
			t.Errorf("%s: exit %d, want an error saying %q:\n%s", what, r.Code, want, r.Stderr)
		}
	}

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

	// Another tenant can neither name the network nor reach its namespace.
	refused(run(globex, "vm", "create", "x", "--network", "front", "--image", "globex/rhel:9", "--template-file", tmpl), "another tenant's network", "no network front in namespace globex")
	refused(testenv.RunImagectl(t, "vm", "create", "x", "--image", "acme/rhel:9", "--template-file", tmpl, "--kubeconfig", hub.UserKubeconfig(t, "tenant-b"), "-n", "acme-net-front"),
		"another tenant's network namespace", "forbidden")
	refused(run(globex, "network", "delete", "front"), "deleting another tenant's network", "no network front in namespace globex")

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
