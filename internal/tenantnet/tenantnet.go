// Package tenantnet is the vocabulary of a tenant's private networks that
// imagectl and image-syncer share: how a PrivateNetwork's name and subnet
// are checked, which namespace its VMs live in, and the OVN-Kubernetes
// UserDefinedNetwork that namespace gets.
//
// A network NAME of the tenant whose namespace is HOME lives in namespace
// HOME-net-NAME. That namespace carries OVN-Kubernetes' primary-network
// label from its creation, an annotation naming the network it belongs to
// (a namespace of that name made for anything else is never taken over),
// and one UserDefinedNetwork, "primary": topology Layer2, role Primary,
// the network's subnet, persistent IP addresses. Layer 2 with persistent
// addresses is where KubeVirt live-migrates a VM without changing its
// address.
//
// Subnets are IPv4 network addresses of prefix length 8 to 29 that overlap
// neither the tenant's other networks nor the ranges OVN-Kubernetes keeps
// for itself (Reserved).
package tenantnet

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/imagepipe/imagepipe/internal/imageref"
)

// Labels and annotations on a network's namespace.
const (
	// LabelPrimaryUDN is OVN-Kubernetes' label on a namespace whose primary
	// network is a user defined network. It must be there when the
	// namespace is created: OVN-Kubernetes does not honour it added later.
	LabelPrimaryUDN = "k8s.ovn.org/primary-user-defined-network"
	// LabelNetwork, on a network's namespace, is the network's name.
	LabelNetwork = "imagepipe.io/private-network"
	// AnnotationNetworkOf, on a network's namespace, is HOME/NAME of the
	// PrivateNetwork it belongs to.
	AnnotationNetworkOf = "imagepipe.io/private-network-of"
	// UDNName is the name of the UserDefinedNetwork in a network's namespace.
	UDNName = "primary"
	// MaxNameLength bounds a network's name, as the PrivateNetwork CRD does.
	MaxNameLength = 40
)

// UDNKind is OVN-Kubernetes' UserDefinedNetwork.
var UDNKind = schema.GroupVersionKind{Group: "k8s.ovn.org", Version: "v1", Kind: "UserDefinedNetwork"}

var namePattern = regexp.MustCompile(`^[a-z]([a-z0-9-]*[a-z0-9])?$`)

// CheckName refuses a network name that is not a DNS label of at most
// MaxNameLength characters starting with a letter.
func CheckName(name string) error {
	if len(name) > MaxNameLength || !namePattern.MatchString(name) {
		return fmt.Errorf("network name %q: want a DNS label of at most %d characters: lower-case letters, digits and '-', starting with a letter and ending with a letter or digit", name, MaxNameLength)
	}
	return nil
}

// IsNetworkNamespace reports whether ns has the form of a network's
// namespace, HOME-net-NAME; the tenant grammar owns the rule
// (imageref.IsNetworkNamespace), so no registry tenant has that form.
func IsNetworkNamespace(ns string) bool { return imageref.IsNetworkNamespace(ns) }

// Namespace is the namespace of network name of the tenant whose
// namespace is home. It fails when that name would exceed 63 characters.
func Namespace(home, name string) (string, error) {
	ns := home + imageref.NetworkInfix + name
	if len(ns) > 63 {
		return "", fmt.Errorf("network %q: its namespace %s would have %d characters, over Kubernetes' 63; choose a name of at most %d characters", name, ns, len(ns), 63-len(home+"-net-"))
	}
	return ns, nil
}

// Reserved are the IPv4 ranges a network's subnet must not overlap:
// OVN-Kubernetes' own (join, transit and masquerade subnets, whose
// defaults these are), and addresses no private network can use.
var Reserved = []struct {
	Prefix netip.Prefix
	Why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\" (RFC 791)"},
	{netip.MustParsePrefix("100.64.0.0/16"), "OVN-Kubernetes' join subnet"},
	{netip.MustParsePrefix("100.65.0.0/16"), "OVN-Kubernetes' join subnet of user defined networks"},
	{netip.MustParsePrefix("100.88.0.0/16"), "OVN-Kubernetes' transit switch subnet"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local, and OVN-Kubernetes' masquerade subnet"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved (RFC 1112)"},
}

// ParseSubnet parses an IPv4 network address with a prefix length from
// 8 to 29 (10.10.0.0/24) and refuses one that overlaps a Reserved range.
func ParseSubnet(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("subnet %q: want an IPv4 network address and prefix length, such as 10.10.0.0/24", s)
	}
	if p.Bits() < 8 || p.Bits() > 29 {
		return netip.Prefix{}, fmt.Errorf("subnet %s: the prefix length must be from 8 to 29 (a /29 has 6 usable addresses)", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("subnet %s has host bits set: the network address is %s", s, p.Masked())
	}
	for _, r := range Reserved {
		if p.Overlaps(r.Prefix) {
			return netip.Prefix{}, fmt.Errorf("subnet %s overlaps %s, %s", s, r.Prefix, r.Why)
		}
	}
	return p, nil
}

// CheckAddress parses s, an address a VM asks for on the network of
// subnet, and returns it with the subnet's prefix length (the form of
// KubeVirt's IP request). It refuses an address outside the subnet, the
// subnet's network and broadcast addresses, and its first address, which
// a layer-2 network's gateway may hold.
func CheckAddress(subnet netip.Prefix, s string) (netip.Prefix, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Prefix{}, fmt.Errorf("address %q: want an IPv4 address such as %s", s, subnet.Addr().Next().Next())
	}
	if !subnet.Contains(a) {
		return netip.Prefix{}, fmt.Errorf("address %s is not in the network's subnet %s", a, subnet)
	}
	first := subnet.Masked().Addr()
	last := first.As4()
	for i, n := 3, 32-subnet.Bits(); n > 0; i, n = i-1, n-8 {
		last[i] |= byte(0xff >> max(0, 8-n))
	}
	switch a {
	case first, netip.AddrFrom4(last):
		return netip.Prefix{}, fmt.Errorf("address %s is the network or broadcast address of %s", a, subnet)
	case first.Next():
		return netip.Prefix{}, fmt.Errorf("address %s is the first of %s, which the network's gateway may hold; choose another", a, subnet)
	}
	return netip.PrefixFrom(a, subnet.Bits()), nil
}

// Network is one of a tenant's networks, for Overlap.
type Network struct {
	Name   string
	Subnet string
}

// Overlap returns the first of others whose subnet overlaps p, if any.
// Subnets that do not parse overlap nothing.
func Overlap(p netip.Prefix, others []Network) (Network, bool) {
	for _, o := range others {
		q, err := netip.ParsePrefix(o.Subnet)
		if err == nil && q.Overlaps(p) {
			return o, true
		}
	}
	return Network{}, false
}

// UDN is the UserDefinedNetwork of a network on subnet in namespace ns.
func UDN(ns string, subnet netip.Prefix) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": UDNName, "namespace": ns},
		"spec": map[string]any{
			"topology": "Layer2",
			"layer2": map[string]any{
				"role":    "Primary",
				"subnets": []any{subnet.String()},
				"ipam":    map[string]any{"lifecycle": "Persistent"},
			},
		},
	}}
	u.SetGroupVersionKind(UDNKind)
	return u
}

// NetworkOf reads a namespace's AnnotationNetworkOf: the home namespace
// and name of the network it belongs to, if any.
func NetworkOf(annotations map[string]string) (home, name string, ok bool) {
	return strings.Cut(annotations[AnnotationNetworkOf], "/")
}

// NetworkName is OVN-Kubernetes' name of the network of namespace ns: its
// UserDefinedNetwork's namespace and name joined by an underscore, which no
// Kubernetes name holds.
func NetworkName(ns string) string { return ns + "_" + UDNName }
