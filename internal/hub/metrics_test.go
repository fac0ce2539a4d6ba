package hub

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imagepipe/imagepipe/internal/version"
)

// TestBuildInfoMetric: the registry exports imagepipe_syncer_build_info 1
// labelled with the running build, as version.Get reports it.
func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg, nil); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := version.Get()
	found := false
	for _, f := range families {
		if f.GetName() != "imagepipe_syncer_build_info" {
			continue
		}
		found = true
		if f.GetType().String() != "GAUGE" || len(f.GetMetric()) != 1 {
			t.Fatalf("build_info: type %s with %d series, want one gauge", f.GetType(), len(f.GetMetric()))
		}
		m := f.GetMetric()[0]
		if m.GetGauge().GetValue() != 1 {
			t.Errorf("build_info is %v, want 1", m.GetGauge().GetValue())
		}
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["version"] != want.Version || labels["commit"] != want.Commit || labels["goversion"] != want.GoVersion || len(labels) != 3 {
			t.Errorf("build_info labels %v, want version %q, commit %q, goversion %q", labels, want.Version, want.Commit, want.GoVersion)
		}
	}
	if !found {
		t.Error("no imagepipe_syncer_build_info")
	}
}
