package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

func TestParsePorts(t *testing.T) {
	got, err := parsePorts([]string{"443", "80:8080", "53/udp", "53/TCP", "9000:9001/sctp"})
	if err != nil {
		t.Fatal(err)
	}
	want := []v1alpha1.LoadBalancerPort{
		{Port: 443, TargetPort: 443, Protocol: "TCP"}, {Port: 80, TargetPort: 8080, Protocol: "TCP"},
		{Port: 53, TargetPort: 53, Protocol: "UDP"}, {Port: 53, TargetPort: 53, Protocol: "TCP"},
		{Port: 9000, TargetPort: 9001, Protocol: "SCTP"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parsePorts = %+v, want %+v", got, want)
	}
	for spec, msg := range map[string]string{
		"0": "from 1 to 65535", "65536": "from 1 to 65535", "80:0": "from 1 to 65535", "-1": "from 1 to 65535",
		"http": "from 1 to 65535", "80/icmp": "none of tcp, udp and sctp", "": "from 1 to 65535", "80:": "from 1 to 65535",
	} {
		if _, err := parsePorts([]string{spec}); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("--port %q: %v, want an error saying %q", spec, err, msg)
		}
	}
	if _, err := parsePorts([]string{"80:8080", "80/tcp"}); err == nil || !strings.Contains(err.Error(), "external port 80/TCP is already exposed") {
		t.Errorf("a port exposed twice: %v", err)
	}
	if _, err := parsePorts([]string{"80/udp", "80/tcp"}); err != nil {
		t.Errorf("one port over two protocols: %v", err)
	}
	if _, err := parsePorts(nil); err == nil {
		t.Error("no port accepted")
	}
	many := make([]string, maxExposedPorts+1)
	for i := range many {
		many[i] = strconv.Itoa(1000 + i)
	}
	if _, err := parsePorts(many); err == nil || !strings.Contains(err.Error(), "at most 32") {
		t.Errorf("%d ports: %v", len(many), err)
	}
}

func TestCheckHosts(t *testing.T) {
	if err := checkHosts([]string{"web-1", "web-2"}); err != nil {
		t.Error(err)
	}
	for _, hosts := range [][]string{{"Web"}, {"web_1"}, {strings.Repeat("a", 64)}, {"web", "web"}} {
		if err := checkHosts(hosts); err == nil {
			t.Errorf("hosts %v accepted", hosts)
		}
	}
}
