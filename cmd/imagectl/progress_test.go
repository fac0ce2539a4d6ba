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

// TestProgressBarThrottlesAndFinishes: however often it is told, a bar
// draws at most once per progressInterval, and finish draws the last
// figures it was told and ends the line.
func TestProgressBarThrottlesAndFinishes(t *testing.T) {
	var buf strings.Builder
	bar := &progressBar{w: &buf, label: "copying", enabled: true}
	start := time.Now()
	const total = 200000
	for i := int64(1); i <= total; i++ {
		bar.update(i*1000, total*1000)
	}
	elapsed := time.Since(start)
	bar.finish()
	draws := strings.Count(buf.String(), "\r")
	if most := 1 + int(elapsed/progressInterval) + 1; draws > most {
		t.Errorf("%d draws in %s, want at most %d", draws, elapsed, most)
	}
	out := buf.String()
	last := out[strings.LastIndex(out, "\r"):]
	if !strings.Contains(last, "100%") || !strings.HasSuffix(out, "\n") {
		t.Errorf("the last draw %q does not say 100%% and end the line", last)
	}

	var quiet strings.Builder
	off := &progressBar{w: &quiet, label: "copying"}
	off.update(1, 2)
	off.finish()
	if quiet.Len() != 0 {
		t.Errorf("a disabled bar wrote %q", quiet.String())
	}
}
