package netsync

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func vmi(networks []any, ifaces []any, phase, ready string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"networks": networks},
		"status": map[string]any{
			"phase": phase, "interfaces": ifaces,
			"conditions": []any{map[string]any{"type": "Ready", "status": ready}},
		},
	}}
}

// TestInstanceAddress: a host's address is the IPv4 one of the interface
// on its pod network, not of a secondary network listed first, and it is
// ready only when it runs, is Ready and has one.
func TestInstanceAddress(t *testing.T) {
	pod := []any{map[string]any{"name": "storage", "multus": map[string]any{"networkName": "san"}}, map[string]any{"name": "default", "pod": map[string]any{}}}
	ifaces := []any{
		map[string]any{"name": "storage", "ipAddress": "192.168.9.9"},
		map[string]any{"name": "default", "ipAddress": "fd00::5", "ipAddresses": []any{"fd00::5", "10.10.0.5"}},
	}
	for _, c := range []struct {
		vmi       *unstructured.Unstructured
		ip        string
		ready     bool
		situation string
	}{
		{vmi(pod, ifaces, "Running", "True"), "10.10.0.5", true, "running and ready"},
		{vmi(pod, ifaces, "Running", "False"), "10.10.0.5", false, "not Ready"},
		{vmi(pod, ifaces, "Scheduled", "True"), "10.10.0.5", false, "not running yet"},
		{vmi(pod, ifaces[:1], "Running", "True"), "", false, "no interface on the pod network"},
		{vmi(nil, []any{map[string]any{"name": "x", "ipAddress": "not-an-ip"}}, "Running", "True"), "", false, "an address that does not parse"},
	} {
		ip, ready := instanceAddress(c.vmi)
		if ip != c.ip || ready != c.ready {
			t.Errorf("%s: %q ready %v, want %q ready %v", c.situation, ip, ready, c.ip, c.ready)
		}
	}
}
