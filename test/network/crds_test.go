package network

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/imagepipe/imagepipe/test/harness"
)

// crdDir holds the fixtures under test, relative to this package.
const crdDir = "../crds/ovn-kubernetes"

const tenant = "tenant-a"

var (
	udns  = schema.GroupVersionResource{Group: "k8s.ovn.org", Version: "v1", Resource: "userdefinednetworks"}
	cudns = schema.GroupVersionResource{Group: "k8s.ovn.org", Version: "v1", Resource: "clusteruserdefinednetworks"}
)

// primaryLayer2 is the network a KubeVirt tenant asks for so that its VMs
// keep their IPs across live migration.
const primaryLayer2 = `
apiVersion: k8s.ovn.org/v1
kind: UserDefinedNetwork
metadata:
  name: primary-l2
  namespace: tenant-a
spec:
  topology: Layer2
  layer2:
    role: Primary
    subnets: ["10.100.0.0/16"]
    ipam:
      lifecycle: Persistent
`

const primaryLayer3 = `
apiVersion: k8s.ovn.org/v1
kind: UserDefinedNetwork
metadata:
  name: primary-l3
  namespace: tenant-a
spec:
  topology: Layer3
  layer3:
    role: Primary
    mtu: 1400
    subnets:
    - cidr: 10.200.0.0/16
      hostSubnet: 24
`

const secondaryLocalnet = `
apiVersion: k8s.ovn.org/v1
kind: ClusterUserDefinedNetwork
metadata:
  name: physnet
spec:
  namespaceSelector:
    matchLabels:
      network: physnet
    matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values: [tenant-a, tenant-b]
  network:
    topology: Localnet
    localnet:
      role: Secondary
      physicalNetworkName: physnet1
      subnets: ["192.168.100.0/24"]
      excludeSubnets: ["192.168.100.0/29"]
      mtu: 1500
      vlan:
        mode: Access
        access:
          id: 100
      ipam:
        lifecycle: Persistent
`

// TestOVNKubernetesCRDs installs the fixtures on a hub and checks that
// well-formed networks are stored whole and that the API server itself
// rejects malformed ones with the message of upstream's rule.
func TestOVNKubernetesCRDs(t *testing.T) {
	hub := harness.StartHub(t, "hub-network", crdDir)
	dyn, err := dynamic.NewForConfig(hub.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(hub.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := func(gvr schema.GroupVersionResource) dynamic.ResourceInterface {
		if gvr == udns {
			return dyn.Resource(gvr).Namespace(tenant)
		}
		return dyn.Resource(gvr)
	}

	// Well-formed networks are accepted and keep every field: nothing in
	// their specs is pruned as unknown.
	for _, c := range []struct {
		name string
		gvr  schema.GroupVersionResource
		doc  string
	}{
		{"primary Layer2 UDN with persistent IPAM", udns, primaryLayer2},
		{"primary Layer3 UDN", udns, primaryLayer3},
		{"secondary Localnet CUDN with a namespace selector", cudns, secondaryLocalnet},
	} {
		t.Run("accepts "+c.name, func(t *testing.T) {
			obj := object(t, c.doc)
			created, err := client(c.gvr).Create(t.Context(), obj, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			got, err := client(c.gvr).Get(t.Context(), created.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Object["spec"], obj.Object["spec"]) {
				t.Errorf("stored spec differs:\n got  %v\n sent %v", got.Object["spec"], obj.Object["spec"])
			}
		})
	}

	// The status subresource exists: a controller's condition is stored
	// through it.
	t.Run("status subresource", func(t *testing.T) {
		udn, err := client(udns).Get(t.Context(), "primary-l2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cond := map[string]any{
			"type": "NetworkCreated", "status": "True", "reason": "NetworkAttachmentDefinitionCreated",
			"message": "created", "lastTransitionTime": "2026-01-01T00:00:00Z",
		}
		if err := unstructured.SetNestedSlice(udn.Object, []any{cond}, "status", "conditions"); err != nil {
			t.Fatal(err)
		}
		if _, err := client(udns).UpdateStatus(t.Context(), udn, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update status: %v", err)
		}
		got, err := client(udns).Get(t.Context(), "primary-l2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		if len(conds) != 1 || conds[0].(map[string]any)["type"] != "NetworkCreated" {
			t.Errorf("status.conditions = %v, want the NetworkCreated condition", conds)
		}
	})

	// Malformed networks are refused at create, each by one rule.
	for _, c := range []struct {
		name string
		gvr  schema.GroupVersionResource
		doc  string
		want string // the rule's message, or the schema's error
	}{
		{
			name: "primary Layer2 UDN without subnets",
			gvr:  udns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: UserDefinedNetwork
metadata: {name: no-subnets, namespace: tenant-a}
spec:
  topology: Layer2
  layer2: {role: Primary}
`,
			want: "Subnets is required with ipam.mode is Enabled or unset",
		},
		{
			name: "UDN whose topology names Layer3 but which configures Layer2",
			gvr:  udns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: UserDefinedNetwork
metadata: {name: wrong-topology, namespace: tenant-a}
spec:
  topology: Layer3
  layer2: {role: Secondary, subnets: ["10.1.0.0/16"]}
`,
			want: "spec.layer3 is required when topology is Layer3 and forbidden otherwise",
		},
		{
			name: "secondary Layer2 UDN with joinSubnets",
			gvr:  udns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: UserDefinedNetwork
metadata: {name: secondary-join, namespace: tenant-a}
spec:
  topology: Layer2
  layer2: {role: Secondary, subnets: ["10.1.0.0/16"], joinSubnets: ["100.66.0.0/16"]}
`,
			want: "JoinSubnets is only supported for Primary network",
		},
		{
			name: "Layer2 UDN with persistent IPAM but IPAM disabled",
			gvr:  udns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: UserDefinedNetwork
metadata: {name: persistent-disabled, namespace: tenant-a}
spec:
  topology: Layer2
  layer2: {role: Secondary, ipam: {mode: Disabled, lifecycle: Persistent}}
`,
			want: "lifecycle Persistent is only supported when ipam.mode is Enabled",
		},
		{
			name: "Layer3 UDN whose IPv4 hostSubnet is 32",
			gvr:  udns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: UserDefinedNetwork
metadata: {name: host-32, namespace: tenant-a}
spec:
  topology: Layer3
  layer3: {role: Primary, subnets: [{cidr: 10.2.0.0/16, hostSubnet: 32}]}
`,
			want: "HostSubnet must < 32 for ipv4 CIDR",
		},
		{
			name: "Localnet CUDN with IPAM disabled and subnets",
			gvr:  cudns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: ClusterUserDefinedNetwork
metadata: {name: disabled-with-subnets}
spec:
  namespaceSelector: {matchLabels: {network: physnet}}
  network:
    topology: Localnet
    localnet: {role: Secondary, physicalNetworkName: physnet1, subnets: ["192.168.1.0/24"], ipam: {mode: Disabled}}
`,
			want: "Subnets is required with ipam.mode is Enabled or unset, and forbidden otherwise",
		},
		{
			name: "Localnet CUDN whose physicalNetworkName has a colon",
			gvr:  cudns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: ClusterUserDefinedNetwork
metadata: {name: colon}
spec:
  namespaceSelector: {}
  network:
    topology: Localnet
    localnet: {role: Secondary, physicalNetworkName: "br-ex:physnet1", ipam: {mode: Disabled}}
`,
			want: "physicalNetworkName cannot contain `,` or `:` characters",
		},
		{
			name: "Localnet CUDN in VLAN access mode without a VLAN id",
			gvr:  cudns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: ClusterUserDefinedNetwork
metadata: {name: vlan-no-id}
spec:
  namespaceSelector: {}
  network:
    topology: Localnet
    localnet: {role: Secondary, physicalNetworkName: physnet1, ipam: {mode: Disabled}, vlan: {mode: Access}}
`,
			want: "vlan access config is required when vlan mode is 'Access', and forbidden otherwise",
		},
		// Not CEL: upstream's Localnet role enum has Secondary only, and
		// physicalNetworkName is a required field.
		{
			name: "primary Localnet CUDN",
			gvr:  cudns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: ClusterUserDefinedNetwork
metadata: {name: primary-localnet}
spec:
  namespaceSelector: {}
  network:
    topology: Localnet
    localnet: {role: Primary, physicalNetworkName: physnet1, subnets: ["192.168.1.0/24"]}
`,
			want: `spec.network.localnet.role: Unsupported value: "Primary": supported values: "Secondary"`,
		},
		{
			name: "Localnet CUDN without physicalNetworkName",
			gvr:  cudns,
			doc: `
apiVersion: k8s.ovn.org/v1
kind: ClusterUserDefinedNetwork
metadata: {name: no-physnet}
spec:
  namespaceSelector: {}
  network:
    topology: Localnet
    localnet: {role: Secondary, subnets: ["192.168.1.0/24"]}
`,
			want: "spec.network.localnet.physicalNetworkName: Required value",
		},
	} {
		t.Run("rejects "+c.name, func(t *testing.T) {
			_, err := client(c.gvr).Create(t.Context(), object(t, c.doc), metav1.CreateOptions{})
			wantInvalid(t, err, c.want)
		})
	}

	// Networks are immutable once created: changing a created one is
	// refused by the rules on their topology sections.
	for _, c := range []struct {
		name, obj string
		gvr       schema.GroupVersionResource
		path      []string
		value     any
		want      string
	}{
		{"Layer2 subnets", "primary-l2", udns, []string{"spec", "layer2", "subnets"}, []any{"10.101.0.0/16"}, "Layer2 is immutable"},
		{"Layer3 MTU", "primary-l3", udns, []string{"spec", "layer3", "mtu"}, int64(1300), "mtu is immutable"},
		{"Localnet VLAN", "physnet", cudns, []string{"spec", "network", "localnet", "vlan", "access", "id"}, int64(200), "Localnet is immutable"},
	} {
		t.Run("refuses to change "+c.name, func(t *testing.T) {
			obj, err := client(c.gvr).Get(t.Context(), c.obj, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedField(obj.Object, c.value, c.path...); err != nil {
				t.Fatal(err)
			}
			_, err = client(c.gvr).Update(t.Context(), obj, metav1.UpdateOptions{})
			wantInvalid(t, err, c.want)
		})
	}
}

// object decodes a YAML document into an unstructured object, with
// integers as int64 as the client decodes the API server's answers.
func object(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatalf("decoding %s: %v", doc, err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(j); err != nil {
		t.Fatalf("decoding %s: %v", doc, err)
	}
	return obj
}

// wantInvalid fails the test unless err is the API server's Invalid error
// and its message contains want.
func wantInvalid(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("accepted, want rejection with %q", want)
	case !apierrors.IsInvalid(err):
		t.Fatalf("error %v is not Invalid, want rejection with %q", err, want)
	case !strings.Contains(err.Error(), want):
		t.Errorf("error %q does not contain %q", err, want)
	default:
		t.Logf("rejected: %v", err)
	}
}
