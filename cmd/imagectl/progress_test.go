package main

import (
	"strings"
	"testing"
	"time"
)

func TestRenderProgress(t *testing.T) {
	got := renderProgress("pushing", 256<<20, 1<<30, 2*time.Second)
	for _, want := range []string{"25%", "256.0 MiB/1.0 GiB", "128.0 MiB/s", "ETA 6s", "[=======>"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	if got := renderProgress("reading", 5<<20, -1, time.Second); !strings.Contains(got, "5.0 MiB 5.0 MiB/s") {
		t.Errorf("unknown total: %q", got)
	}
}
