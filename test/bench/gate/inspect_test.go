package gate

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// benchInspect is the Inspect part: what reading the guest costs the
// gate on the bench image, which imagectl writes as a canonical qcow2
// that the gate verifies as it streams. With the default spool share
// the disk is copied to the spool as it passes and its guest read from
// there; with --max-spool 1048576 the copy stops at once and the guest is
// not read, so the difference is the inspection's whole cost. Each
// verification has a fresh registry and gate, so that no verdict or
// record of an earlier one is reused.
func benchInspect(t testing.TB) string {
	disk := os.Getenv("IMAGEPIPE_BENCH_DISK")
	if disk == "" {
		t.Fatal("IMAGEPIPE_BENCH_DISK names no disk (gate.sh sets it)")
	}
	type run struct{ secs, cpu, peak, spooled, reads float64 }
	measure := func(compression string, gateArgs ...string) run {
		reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, GateArgs: gateArgs})
		defer reg.Gate.Stop(t)
		const repo = "acme/inspect"
		d := importImage(t, disk, reg.Host+"/"+repo+":1", "--compression", compression)
		r := run{secs: waitVerdict(t, reg.Gate.LogPath, d, repo)}
		r.cpu, r.peak, r.spooled = spentOn(t, reg.Gate.LogPath, repo+"@"+d)
		r.reads = float64(layerReads(t, reg.LogPath(), repo, "imagepipe-gate/"))
		return r
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nGuest inspection: the bench image imported with imagectl (a canonical qcow2, verified as it streams), each time to a fresh registry and gate; with the default spool share the gate copies the disk to its spool as it passes and reads the guest there, with `--max-spool 1048576` (1 MiB) the copy stops at once and the guest is not read. Median of 3 each; CPU and peak memory are the verification child's (rusage); the bench disk's root has no os-release, so the inspection reads its partition table and filesystem and finds no OS.\n\n")
	fmt.Fprintf(&b, "| case | measured | target | |\n| --- | ---: | ---: | --- |\n")
	for _, comp := range []string{"zstd", "gzip"} {
		var with, without []run
		for range reps {
			with = append(with, measure(comp))
			without = append(without, measure(comp, "--max-spool", "1048576"))
		}
		field := func(rs []run, f func(run) float64) float64 { return median(fieldAll(rs, f)) }
		secs := func(r run) float64 { return r.secs }
		cpu := func(r run) float64 { return r.cpu }
		w, wo := field(with, secs), field(without, secs)
		wc, woc := field(with, cpu), field(without, cpu)
		peak := slowest(append(fieldAll(with, func(r run) float64 { return r.peak }), fieldAll(without, func(r run) float64 { return r.peak })...))
		reads := slowest(append(fieldAll(with, func(r run) float64 { return r.reads }), fieldAll(without, func(r run) float64 { return r.reads })...))
		share := (w - wo) / wo
		fmt.Fprintf(&b, "| %s: gate's time to its verdict, with inspection / without | %.2f s / %.2f s | | |\n", comp, w, wo)
		fmt.Fprintf(&b, "| %s: verification CPU, with / without | %.2f s / %.2f s | | |\n", comp, wc, woc)
		fmt.Fprintf(&b, "| %s: data copied to the spool | %.0f MiB | | |\n", comp, field(with, func(r run) float64 { return r.spooled })/(1<<20))
		fmt.Fprintf(&b, "| %s: inspection's cost (time) / verification | %.3f | ≤ 0.10 | %s |\n", comp, share, verdict(share <= 0.10))
		fmt.Fprintf(&b, "| %s: inspection's cost (CPU) / verification | %.3f | | |\n", comp, (wc-woc)/woc)
		fmt.Fprintf(&b, "| %s: verification child's peak memory | %.0f MiB | ≤ 128 MiB | %s |\n", comp, peak/(1<<20), verdict(peak <= 128<<20))
		fmt.Fprintf(&b, "| %s: reads of the layer, most in one verification | %.0f | 1 | %s |\n", comp, reads, verdict(reads == 1))
	}
	return b.String()
}

func fieldAll[R any](rs []R, f func(R) float64) []float64 {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, f(r))
	}
	return xs
}

var spentLine = regexp.MustCompile(`msg="verification spent" subject=(\S+) cpuSeconds=(\S+) peakMemory=(\d+) decompressed=\d+ spooled=(\d+)`)

// spentOn reads the gate's log line of what the verification of subject
// (repo@digest) spent: CPU seconds, peak memory and spooled bytes.
func spentOn(t testing.TB, logPath, subject string) (cpu, peak, spooled float64) {
	t.Helper()
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spentLine.FindAllStringSubmatch(string(data), -1) {
		if strings.HasSuffix(m[1], "/"+subject) {
			cpu, _ = strconv.ParseFloat(m[2], 64)
			peak, _ = strconv.ParseFloat(m[3], 64)
			spooled, _ = strconv.ParseFloat(m[4], 64)
			return cpu, peak, spooled
		}
	}
	t.Fatalf("the gate's log has no verification spent on %s", subject)
	return 0, 0, 0
}
