package gate

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// Sizes of the Waiting part: the raw disks of the long verifications, and
// the small disk a third tenant imports.
const (
	longDisk  = 16 << 30
	smallDisk = 4 << 20
	// smallReps is how many small images are timed alone, and how many
	// while the long verifications run.
	smallReps = 3
	// busyCPU is the CPU time after which a verification child counts as
	// running (the spare child waiting for a subject has used a few ms).
	busyCPU = time.Second
	// waitTarget bounds the small image's push → verdict while the long
	// verifications run: within seconds (issue 34).
	waitTarget = 5 * time.Second
)

// benchWaiting is the Waiting part: a fresh gate with --workers 4 (and
// the default reserve of 2); a third tenant's small images (imagectl
// import of a 4 MiB raw disk) timed from push to verdict on the idle gate;
// then long verifications take every slot: two tenants push two images
// each whose run-length zstd layers declare 16 GiB raw disks (distinct
// layers: the store cannot share them), and once the four verifications
// are running in the workers (each child has used busyCPU, read from
// /proc) two more tenants push one each, which go to the reserve; once
// each has had its turn there (the gate logged that it waits for a
// worker, over --reserve-max-size, or its child is running), the third
// tenant's small images are timed again, one after the other. Push is the start of the manifest PUT, from
// the registry's log; verdict is the gate's log of "verdict given", written once the
// verdict is attached. With the reserve and the renicing the small images
// should wait seconds, not the long verifications' end.
func benchWaiting(t testing.TB) string {
	longs, err := newRLELayers(longDisk, 0x5a, []byte{0x61, 0x62, 0x63, 0x64, 0x65, 0x66})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var disks []string
	for i := range 2 * smallReps {
		disks = append(disks, writeSmallDisk(t, dir, uint64(i)))
	}
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, GateArgs: []string{"--workers", "4"}})
	pid := reg.Gate.Pid()

	var alone []smallRun
	for i := range smallReps {
		alone = append(alone, timeSmall(t, reg, pid, disks[i], fmt.Sprintf("tenant-c/alone-%d", i)))
	}

	// The workers' four: tenants a and b, two each; the reserve's two:
	// tenants d and e, one each (c is the small images' tenant).
	amd64 := v1.Platform{OS: "linux", Architecture: "amd64"}
	repos := []string{"tenant-a/long-0", "tenant-a/long-1", "tenant-b/long-0", "tenant-b/long-1", "tenant-d/long-0", "tenant-e/long-0"}
	pushLong := func(i int) {
		img, err := rleImage(longs[i], amd64, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref(t, reg.Host+"/"+repos[i]+":1"), img, remote.WithContext(t.Context())); err != nil {
			t.Fatal(err)
		}
	}
	for i := range workerLongs {
		pushLong(i)
	}
	waitStart := time.Now()
	harness.WaitUntil(t, "the four long verifications running", 5*time.Minute, 20*time.Millisecond, func() (bool, error) {
		return len(busyChildren(pid)) >= workerLongs, nil
	})
	t.Logf("the four long verifications each used %.0f CPU-s %.1f s after their push", busyCPU.Seconds(), time.Since(waitStart).Seconds())
	for i := workerLongs; i < len(longs); i++ {
		pushLong(i)
	}
	harness.WaitUntil(t, "the reserve's long verifications' turn", 5*time.Minute, 20*time.Millisecond, func() (bool, error) {
		data, err := os.ReadFile(reg.Gate.LogPath)
		if err != nil {
			return false, err
		}
		sentBack := 0
		for _, repo := range repos[workerLongs:] {
			if regexp.MustCompile(`waits for a worker.* repository=` + regexp.QuoteMeta(repo) + ` `).Match(data) {
				sentBack++
			}
		}
		return sentBack+len(busyChildren(pid)) >= len(longs), nil
	})
	var loaded []smallRun
	for i := range smallReps {
		loaded = append(loaded, timeSmall(t, reg, pid, disks[smallReps+i], fmt.Sprintf("tenant-c/small-%d", i)))
	}
	// The long verifications end with the gate: they are not what is
	// measured, and each spools its disk.
	reg.Gate.Stop(t)
	return renderWaiting(alone, loaded, len(longs), len(longs[0].blob))
}

// workerLongs is how many of the long verifications are pushed first, to
// take the workers; the others then go to the reserve.
const workerLongs = 4

// smallRun is one small image timed from push to verdict.
type smallRun struct {
	pushToVerdict time.Duration
	gateSecs      float64 // the gate's own time: handed out → verdict
	busyNice      []int   // nice of each long verification running at the verdict
}

// timeSmall imports disk into repo:1 and times it from the registry's
// PUT of its manifest to the gate's verdict, noting the verification
// children of the gate (pid) still running when the verdict came.
func timeSmall(t testing.TB, reg *harness.Registry, pid int, disk, repo string) smallRun {
	t.Helper()
	digest := importImage(t, disk, reg.Host+"/"+repo+":1")
	var run smallRun
	var at time.Time
	harness.WaitUntil(t, "the verdict on "+repo, 10*time.Minute, 20*time.Millisecond, func() (bool, error) {
		line, ok, err := verdictLogLine(reg.Gate.LogPath, digest, repo)
		if err != nil || !ok {
			return false, err
		}
		for _, c := range busyChildren(pid) {
			run.busyNice = append(run.busyNice, c.nice)
		}
		m := verdictLine.FindStringSubmatch(line)
		if m[2] != "accepted" {
			return false, fmt.Errorf("the gate refused %s: %s", repo, line)
		}
		if _, err := fmt.Sscan(m[3], &run.gateSecs); err != nil {
			return false, err
		}
		at, err = logTime(line)
		return true, err
	})
	pushed := manifestPut(t, reg.LogPath(), repo, "1")
	run.pushToVerdict = at.Sub(pushed)
	t.Logf("%s: push → verdict %.3f s (gate %.3f s), long verifications running at its verdict: %d, nice %v",
		repo, run.pushToVerdict.Seconds(), run.gateSecs, len(run.busyNice), run.busyNice)
	return run
}

// busyChildren are the gate's verification children that have used
// busyCPU.
func busyChildren(pid int) []procStat {
	var busy []procStat
	for _, c := range children(pid) {
		if s, ok := readStat(c); ok && s.cpu() >= busyCPU {
			busy = append(busy, s)
		}
	}
	return busy
}

// verdictLogLine is the gate's log line of its verdict on repo@digest.
func verdictLogLine(logPath, digest, repo string) (string, bool, error) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return "", false, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if m := verdictLine.FindStringSubmatch(line); m != nil && strings.HasSuffix(m[1], "/"+repo+"@"+digest) {
			return line, true, nil
		}
	}
	return "", false, nil
}

// logTime is the time= of a log line, the gate's (slog, milliseconds) or
// the registry's (logrus, nanoseconds).
func logTime(line string) (time.Time, error) {
	m := regexp.MustCompile(`^time="?([^" ]+)"? `).FindStringSubmatch(line)
	if m == nil {
		return time.Time{}, fmt.Errorf("no time in the log line %q", line)
	}
	return time.Parse(time.RFC3339, m[1])
}

// manifestPut is when the registry began the PUT of repo:tag's manifest:
// the time of its log line, when the response completed, less the
// request's duration. The gate may hear of the push before the response
// completes.
func manifestPut(t testing.TB, logPath, repo, tag string) time.Time {
	t.Helper()
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	uri := regexp.MustCompile(`http.request.method=PUT .*http.request.uri="?/v2/` + regexp.QuoteMeta(repo) + `/manifests/` + regexp.QuoteMeta(tag) + `"? .*http.response.duration=(\S+)`)
	for _, line := range strings.Split(string(data), "\n") {
		m := uri.FindStringSubmatch(line)
		if m == nil || !strings.Contains(line, `msg="response completed"`) {
			continue
		}
		at, err := logTime(line)
		if err != nil {
			t.Fatal(err)
		}
		took, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatalf("the registry's log line %q: %v", line, err)
		}
		return at.Add(-took)
	}
	t.Fatalf("the registry's log has no PUT of %s:%s", repo, tag)
	return time.Time{}
}

// writeSmallDisk writes a raw disk of smallDisk pseudo-random bytes, its
// own for each seed, so that no two small images share a layer.
func writeSmallDisk(t testing.TB, dir string, seed uint64) string {
	t.Helper()
	b := make([]byte, smallDisk)
	var key [32]byte
	key[0] = byte(seed)
	rand.NewChaCha8(key).Read(b)
	p := filepath.Join(dir, fmt.Sprintf("small-%d.raw", seed))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func renderWaiting(alone, loaded []smallRun, longs, longBlob int) string {
	secs := func(runs []smallRun, f func(smallRun) float64) []float64 {
		var xs []float64
		for _, r := range runs {
			xs = append(xs, f(r))
		}
		return xs
	}
	wait := func(r smallRun) float64 { return r.pushToVerdict.Seconds() }
	aloneMed, worst := median(secs(alone, wait)), slowest(secs(loaded, wait))
	var b strings.Builder
	fmt.Fprintf(&b, "\nWaiting: a fresh gate with `--workers 4` and the default reserve of 2 slots for tenants with nothing running; verifications reniced to 10 after 2 CPU-s and 19 after 20. A third tenant imports a %d MiB raw disk with imagectl (each time another, so that no layer is shared) %d times on the idle gate; then %d long verifications take every slot: two tenants push two images each whose zstd layers of run-length blocks (%d KB each, all different) declare %d GiB raw disks, and once these %d have each used %.0f CPU-s (/proc), two more tenants push one each, which go to the reserve (and, over `--reserve-max-size`, stop there and wait for a worker); then the third tenant imports %d more, one after the other. Push → verdict is from the start of the manifest PUT (the registry's log) to the gate's log of its verdict, written once the verdict is attached. Target: the small image's verdict within seconds while the long verifications run (issue 34 measured 38 s, 0.58 s alone).\n\n",
		smallDisk>>20, len(alone), longs, longBlob/1000, longDisk>>30, workerLongs, busyCPU.Seconds(), len(loaded))
	fmt.Fprintf(&b, "| case | measured | target | |\n| --- | ---: | ---: | --- |\n")
	fmt.Fprintf(&b, "| small image alone: push → verdict, median of %d | %.2f s | | |\n", len(alone), aloneMed)
	var each []string
	for _, r := range loaded {
		each = append(each, fmt.Sprintf("%.2f s (gate %.2f s; %d long running, nice %s)", wait(r), r.gateSecs, len(r.busyNice), niceList(r.busyNice)))
	}
	fmt.Fprintf(&b, "| small image while %d tenants' %d long verifications are in the workers and the reserve: push → verdict, each | %s | | |\n", 4, longs, strings.Join(each, "; "))
	fmt.Fprintf(&b, "| small image while they run: slowest push → verdict | %.2f s = %.1f× alone | ≤ %.0f s | %s |\n", worst, worst/aloneMed, waitTarget.Seconds(), verdict(worst <= waitTarget.Seconds()))
	stillRunning := !slices.ContainsFunc(loaded, func(r smallRun) bool { return len(r.busyNice) < workerLongs })
	fmt.Fprintf(&b, "| the workers' %d long verifications still running at each of its verdicts | %s | yes | %s |\n", workerLongs, yesNo(stillRunning), verdict(stillRunning))
	return b.String()
}

func niceList(nice []int) string {
	var s []string
	for _, n := range nice {
		s = append(s, fmt.Sprint(n))
	}
	return strings.Join(s, "/")
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
