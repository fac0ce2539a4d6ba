package tenantnet

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseSubnet(t *testing.T) {
	for _, c := range []struct {
		in, err string
	}{
		{"10.10.0.0/24", ""},
		{"192.168.8.0/29", ""},
		{"10.0.0.0/8", ""},
		{"100.63.255.0/24", ""}, // just below OVN-Kubernetes' join subnet
		{"100.66.0.0/16", ""},   // between the join subnets and the transit subnet
		{"10.10.0.1/24", "the network address is 10.10.0.0/24"},
		{"10.10.0.0/30", "from 8 to 29"},
		{"8.0.0.0/7", "from 8 to 29"},
		{"10.10.0.0", "want an IPv4 network address"},
		{"10.10.0.256/24", "want an IPv4 network address"},
		{"010.10.0.0/24", "want an IPv4 network address"},
		{"fd00::/64", "want an IPv4 network address"},
		{"::ffff:10.0.0.0/104", "want an IPv4 network address"},
		{" 10.10.0.0/24", "want an IPv4 network address"},
		{"100.64.0.0/24", "OVN-Kubernetes' join subnet"},
		{"100.0.0.0/8", "OVN-Kubernetes' join subnet"}, // contains the reserved ranges
		{"100.65.7.0/24", "join subnet of user defined networks"},
		{"100.88.0.0/29", "transit switch"},
		{"169.254.169.0/24", "masquerade"},
		{"127.0.0.0/8", "loopback"},
		{"0.0.0.0/8", "this network"},
		{"224.0.0.0/8", "multicast"},
		{"240.0.0.0/8", "reserved"},
	} {
		_, err := ParseSubnet(c.in)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseSubnet(%q) = %v, want an error saying %q", c.in, err, c.err)
		}
	}
}

func TestCheckNameAndNamespace(t *testing.T) {
	for name, ok := range map[string]bool{
		"front": true, "a": true, "net-2": true, strings.Repeat("a", MaxNameLength): true,
		"": false, "Front": false, "2net": false, "net-": false, "-net": false, "a.b": false, "a_b": false,
		strings.Repeat("a", MaxNameLength+1): false,
	} {
		if err := CheckName(name); (err == nil) != ok {
			t.Errorf("CheckName(%q) = %v, want ok %v", name, err, ok)
		}
	}
	if ns, err := Namespace("acme", "front"); ns != "acme-net-front" || err != nil {
		t.Errorf("Namespace(acme, front) = %q, %v", ns, err)
	}
	home := strings.Repeat("h", 50)
	if _, err := Namespace(home, "abcdefgh"); err != nil {
		t.Errorf("a 63-character namespace refused: %v", err)
	}
	if _, err := Namespace(home, "abcdefghi"); err == nil || !strings.Contains(err.Error(), "at most 8 characters") {
		t.Errorf("a 64-character namespace: %v", err)
	}
}

func TestOverlap(t *testing.T) {
	others := []Network{{"a", "10.1.0.0/16"}, {"b", "10.2.0.0/24"}, {"junk", "not a subnet"}}
	for in, want := range map[string]string{
		"10.1.7.0/24": "a", "10.0.0.0/8": "a", "10.2.0.128/25": "b", "10.3.0.0/24": "", "10.2.1.0/24": "",
	} {
		got, ok := Overlap(netip.MustParsePrefix(in), others)
		if ok != (want != "") || got.Name != want {
			t.Errorf("Overlap(%s) = %q %v, want %q", in, got.Name, ok, want)
		}
	}
}

func TestCheckAddress(t *testing.T) {
	for subnet, cases := range map[string]map[string]string{
		"10.10.0.0/24": {"10.10.0.20": "10.10.0.20/24", "10.10.0.254": "10.10.0.254/24", "10.10.0.0": "", "10.10.0.255": "", "10.10.0.1": "", "10.11.0.5": "", "fd00::1": "", "x": ""},
		"10.20.0.0/29": {"10.20.0.6": "10.20.0.6/29", "10.20.0.7": "", "10.20.0.8": ""},
		"10.0.0.0/12":  {"10.15.255.254": "10.15.255.254/12", "10.15.255.255": "", "10.16.0.1": ""},
	} {
		p := netip.MustParsePrefix(subnet)
		for addr, want := range cases {
			got, err := CheckAddress(p, addr)
			if (want == "") != (err != nil) || (err == nil && got.String() != want) {
				t.Errorf("CheckAddress(%s, %s) = %v, %v; want %q", subnet, addr, got, err, want)
			}
		}
	}
}
