package gate

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"
)

// TestMain builds imagectl, image-syncer and image-gate unless gate.sh
// names them.
func TestMain(m *testing.M) { os.Exit(testenv.MainWithSyncer(m)) }

// reps is how many imports of the bench image are measured.
const reps = 3

// BenchmarkGate measures the gate against the CNCF distribution registry,
// in parts (sub-benchmarks, each with a registry and gate of its own):
//
// Disk, on the bench image (IMAGEPIPE_BENCH_DISK):
//
//   - overhead: imagectl import of the bench image, then the gate's own
//     time to verify it in full, publish its canonical image and sign the
//     verdict (its log's seconds), each in a repository of its own; the
//     ratio gate/import (target ≤ 0.25), with gzip layers (imagectl's
//     default) and with zstd layers;
//   - reads: the registry's GETs of the tenant's layer by imagepipe per
//     digest (target 1; syncers read none, test/syncer checks that);
//   - push to Ready: one import into a registry with the gate and two
//     hubs, each with image-syncer and CDI's real controller and importer;
//     push → Ready on both, the gate's verdict and CDI's import within it;
//   - memory: a gate started with four images of four tenants waiting,
//     verifying them at once, each in a child process; the peak of the
//     memory of the gate and its children together, sampled every 50 ms
//     as the sum of their proportional set sizes (PSS: pages the
//     processes share, such as the binary's, counted once in all), and
//     the gate's own VmHWM (target ≤ 256 MiB);
//   - floor: what any verifier of the layer must spend, decompressing it
//     alone and decompressing it while hashing blob and tar (floor.go).
//
// Inspect: what reading the guest costs the gate on the bench image
// (inspect_test.go).
//
// ReadOnce: one layer named by many manifests is read once (readonce_test.go).
//
// Waiting: a small image's verdict while other tenants' long
// verifications run (waiting_test.go).
//
// BootCheck: the boot check's time and QEMU's memory on the test guests
// (boot_test.go).
//
// It is a Go benchmark, so that `go test ./...` never runs it; gate.sh runs
// it once (-bench Gate -benchtime 1x), and -bench 'Gate/ReadOnce' runs one
// part. The section, of the parts run, goes to $IMAGEPIPE_BENCH_OUT.
func BenchmarkGate(b *testing.B) {
	section := "\n### image-gate\n"
	parts := []struct {
		name string
		run  func(testing.TB) string
	}{{"Disk", benchGate}, {"Inspect", benchInspect}, {"ReadOnce", benchReadOnce}, {"Waiting", benchWaiting}, {"BootCheck", benchBoot}}
	for _, p := range parts {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				section += p.run(b)
			}
		})
	}
	if b.Failed() {
		return
	}
	fmt.Print(section)
	if out := os.Getenv("IMAGEPIPE_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(section), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// benchGate is the Disk part: the gate on the bench image.
func benchGate(t testing.TB) string {
	disk := os.Getenv("IMAGEPIPE_BENCH_DISK")
	if disk == "" {
		t.Fatal("IMAGEPIPE_BENCH_DISK names no disk (gate.sh sets it)")
	}
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate})

	var imports, gates []float64
	for i := range reps {
		repo := fmt.Sprintf("acme/bench-%d", i)
		start := time.Now()
		digest := importImage(t, disk, reg.Host+"/"+repo+":1")
		imports = append(imports, time.Since(start).Seconds())
		gates = append(gates, waitVerdict(t, reg.Gate.LogPath, digest, repo))
	}
	reads := layerReads(t, reg.LogPath(), "acme/bench-0", "imagepipe-gate/")
	gzFloor := measureFloor(t, reg.Host+"/acme/bench-0:1")

	// The same disk with zstd layers: the gate's floor is the layer's
	// decompression, and zstd's is several times faster than gzip's.
	var zImports, zGates []float64
	for i := range reps {
		repo := fmt.Sprintf("acme/bench-zstd-%d", i)
		start := time.Now()
		digest := importImage(t, disk, reg.Host+"/"+repo+":1", "--compression", "zstd")
		zImports = append(zImports, time.Since(start).Seconds())
		zGates = append(zGates, waitVerdict(t, reg.Gate.LogPath, digest, repo))
	}
	zFloor := measureFloor(t, reg.Host+"/acme/bench-zstd-0:1")

	// Four tenants' images waiting for a gate that starts once they are
	// pushed: its first poll finds all four and its four workers take one
	// each.
	reg.Gate.Stop(t)
	var digests []string
	for i := range 4 {
		digests = append(digests, importImage(t, disk, reg.Host+fmt.Sprintf("/tenant%d/img:1", i)))
	}
	g := harness.ReserveGate(t)
	g.Start(t, testenv.ImageGate, reg.Host, "", "", "", "--workers", "4", "--webhook-listen", "")
	stop := make(chan struct{})
	peakCh := make(chan float64, 1)
	go func() { peakCh <- peakTreePSS(g.Pid(), stop) }()
	var parallel []float64
	for i, d := range digests {
		parallel = append(parallel, waitVerdict(t, g.LogPath, d, fmt.Sprintf("tenant%d/img", i)))
	}
	close(stop)
	peak := max(<-peakCh, vmHWM(t, g.Pid()))

	hubs := pushToReady(t, disk)

	return render(disk, imports, gates, zImports, zGates, gzFloor, zFloor, reads, parallel, peak) + hubs.render(median(imports))
}

// hubFigures are one push of the bench image to Ready on two hubs.
type hubFigures struct {
	importSecs  float64            // imagectl import, until the tag is pushed
	verdictSecs float64            // push → the gate's verdict attached
	readySecs   map[string]float64 // push → BaseImage Ready, per hub
	cdiSecs     map[string]float64 // DataVolume seen → BaseImage Ready, per hub
}

// pushToReady pushes the bench image once to a registry with the gate and
// two hubs, each with image-syncer and CDI's real controller and importer,
// and times it to Ready on both: the gate's verdict, then each hub's
// DataVolume, imported by CDI.
func pushToReady(t testing.TB, disk string) hubFigures {
	const ns = "acme"
	names := []string{"hub-a", "hub-b"}
	var hubs []*harness.SyncerHub
	var syncers []*harness.Syncer
	var notify []string
	for _, n := range names {
		hubs = append(hubs, harness.StartSyncerHub(t, n, harness.SyncerHubOptions{Namespaces: []string{ns}}))
		s := harness.ReserveSyncer(t)
		syncers = append(syncers, s)
		notify = append(notify, s.WebhookURL)
	}
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, NotifyURLs: notify, NotifyToken: harness.SyncerWebhookToken})
	for i, h := range hubs {
		h.CDI.AllowInsecureRegistry(t, reg.Host)
		syncers[i].Start(t, testenv.ImageSyncer, h, reg.Host, "--poll-interval", "1h")
	}

	start := time.Now()
	digest := importImage(t, disk, reg.Host+"/acme/hubs:1")
	pushed := time.Now()
	f := hubFigures{importSecs: pushed.Sub(start).Seconds(), readySecs: map[string]float64{}, cdiSecs: map[string]float64{}}
	dvSeen := map[string]time.Time{}
	key := client.ObjectKey{Namespace: ns, Name: cdi.BaseImageName("acme/hubs", "1")}
	dvName := cdi.DataVolumeName(cdi.ImageName("acme/hubs"), digest)
	harness.WaitUntil(t, "the bench image Ready on both hubs", 15*time.Minute, 100*time.Millisecond, func() (bool, error) {
		now := time.Now()
		if f.verdictSecs == 0 && hasVerdict(reg.Gate.LogPath, digest, "acme/hubs") {
			f.verdictSecs = now.Sub(pushed).Seconds()
		}
		for i, h := range hubs {
			if _, done := f.readySecs[names[i]]; done {
				continue
			}
			if _, seen := dvSeen[names[i]]; !seen {
				var dv cdiv1.DataVolume
				if err := h.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: dvName}, &dv); err == nil {
					dvSeen[names[i]] = now
				}
			}
			var bi v1alpha1.BaseImage
			if err := h.Client.Get(t.Context(), key, &bi); err == nil && bi.Status.Phase == v1alpha1.PhaseReady {
				f.readySecs[names[i]] = now.Sub(pushed).Seconds()
				f.cdiSecs[names[i]] = now.Sub(dvSeen[names[i]]).Seconds()
			}
		}
		return len(f.readySecs) == len(hubs), nil
	})
	return f
}

// hasVerdict reports whether the gate's log holds its verdict on
// repo@digest.
func hasVerdict(logPath, digest, repo string) bool {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return false
	}
	for _, m := range verdictLine.FindAllStringSubmatch(string(data), -1) {
		if strings.HasSuffix(m[1], "/"+repo+"@"+digest) {
			return true
		}
	}
	return false
}

// render is the two-hub part of the section; importSecs is the median
// import of the first part, the reference of the gate's share.
func (f hubFigures) render(importSecs float64) string {
	var b strings.Builder
	slowest := func(m map[string]float64) float64 { return slowest(slices.Collect(maps.Values(m))) }
	share := f.verdictSecs / importSecs
	fmt.Fprintf(&b, "\nPush to Ready on two hubs (image-syncer and CDI's real controller and importer on each; the node's volume is played by a file), one `imagectl import` of the same disk, gzip (the import itself, %.2f s here, shares the 2 cores with two starting hubs, so the gate's share is taken of the median import above):\n\n", f.importSecs)
	fmt.Fprintf(&b, "| case | measured | target | |\n| --- | ---: | ---: | --- |\n")
	fmt.Fprintf(&b, "| push → Ready on both hubs, with the gate | %.2f s | | |\n", slowest(f.readySecs))
	fmt.Fprintf(&b, "| of which push → the gate's verdict | %.2f s | | |\n", f.verdictSecs)
	fmt.Fprintf(&b, "| of which DataVolume → Ready (CDI's import, the path without the gate), slower hub | %.2f s | | |\n", slowest(f.cdiSecs))
	fmt.Fprintf(&b, "| the gate's share / median import | %.2f | ≤ 0.25 | %s |\n", share, verdict(share <= 0.25))
	return b.String()
}

// importImage runs imagectl import with a cache of its own, so that no
// build is reused, and returns the digest.
func importImage(t testing.TB, disk, ref string, flags ...string) string {
	t.Helper()
	r := testenv.RunCommand(t, testenv.Command{Name: testenv.Imagectl, Args: append([]string{"import", "--quiet", disk, ref}, flags...), Env: []string{"IMAGEPIPE_CACHE=" + t.TempDir()}})
	if r.Code != 0 {
		t.Fatalf("imagectl import: exit %d\n%s", r.Code, r.Stderr)
	}
	m := regexp.MustCompile(`@(sha256:[0-9a-f]{64})`).FindStringSubmatch(r.Stdout)
	if m == nil {
		t.Fatalf("imagectl import printed %q", r.Stdout)
	}
	return m[1]
}

var verdictLine = regexp.MustCompile(`msg="verdict given" subject=(\S+) verdict=(\S+) .* seconds=([0-9.e+-]+)`)

// waitVerdict waits for the gate's log line of the verdict on repo@digest
// and returns the seconds it took.
func waitVerdict(t testing.TB, logPath, digest, repo string) float64 {
	t.Helper()
	var secs float64
	harness.WaitUntil(t, "the verdict on "+repo, 10*time.Minute, 200*time.Millisecond, func() (bool, error) {
		data, err := os.ReadFile(logPath)
		if err != nil {
			return false, err
		}
		for _, m := range verdictLine.FindAllStringSubmatch(string(data), -1) {
			if strings.HasSuffix(m[1], "/"+repo+"@"+digest) {
				if m[2] != "accepted" {
					return false, fmt.Errorf("the gate refused %s: %s", repo, m[0])
				}
				secs, err = strconv.ParseFloat(m[3], 64)
				return true, err
			}
		}
		return false, nil
	})
	return secs
}

// layerReads counts the registry's completed GETs of repo's largest blob
// (the layer) by clients whose User-Agent contains agent.
func layerReads(t testing.TB, logPath, repo, agent string) int {
	t.Helper()
	written := map[string]int64{}
	reads := map[string]int{}
	for _, g := range blobGets(t, logPath) {
		if g.repo != repo {
			continue
		}
		written[g.digest] = max(written[g.digest], g.written)
		if strings.Contains(g.line, agent) {
			reads[g.digest]++
		}
	}
	var largest string
	for d, n := range written {
		if largest == "" || n > written[largest] {
			largest = d
		}
	}
	return reads[largest]
}

// blobReads counts the registry's completed GETs of the blob digest, in
// any repository, by clients whose User-Agent contains agent.
func blobReads(t testing.TB, logPath, digest, agent string) int {
	t.Helper()
	n := 0
	for _, g := range blobGets(t, logPath) {
		if g.digest == digest && strings.Contains(g.line, agent) {
			n++
		}
	}
	return n
}

// blobGet is one completed GET of a blob in the registry's log.
type blobGet struct {
	repo, digest string
	written      int64  // bytes sent
	line         string // the whole log line
}

var blobGetLine = regexp.MustCompile(`http.request.uri="/v2/(.+?)/blobs/(sha256:[0-9a-f]{64})".*http.response.written=(\d+)`)

// blobGets are the completed GETs of blobs in the registry's log.
func blobGets(t testing.TB, logPath string) []blobGet {
	t.Helper()
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var gets []blobGet
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="response completed"`) || !strings.Contains(line, "http.request.method=GET ") {
			continue
		}
		m := blobGetLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, _ := strconv.ParseInt(m[3], 10, 64)
		gets = append(gets, blobGet{repo: m[1], digest: m[2], written: n, line: line})
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the registry's log: %v", err)
	}
	return gets
}

// peakTreePSS samples, every 50 ms until stop is closed, the proportional
// set size of process pid and its children together, and returns the
// largest sum seen, in MiB.
func peakTreePSS(pid int, stop <-chan struct{}) float64 {
	var peak int64
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		sum := procKB(pid, "smaps_rollup", "Pss:")
		for _, child := range children(pid) {
			sum += procKB(child, "smaps_rollup", "Pss:")
		}
		peak = max(peak, sum)
		select {
		case <-stop:
			return float64(peak) / 1024
		case <-t.C:
		}
	}
}

// children are the running child processes of process pid: each of its
// threads lists those it started.
func children(pid int) []int {
	var pids []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, task := range tasks {
		kids, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(kids)) {
			if child, err := strconv.Atoi(f); err == nil {
				pids = append(pids, child)
			}
		}
	}
	return pids
}

// procStat is what the bench reads of /proc/PID/stat.
type procStat struct {
	user, sys time.Duration // its own CPU time
	// childUser and childSys are the CPU time of its children that ended
	// and were waited for.
	childUser, childSys time.Duration
	nice                int
}

// cpu is the process's own CPU time, user and system.
func (s procStat) cpu() time.Duration { return s.user + s.sys }

// readStat reads /proc/PID/stat; ok is false when the process is gone.
func readStat(pid int) (s procStat, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, false
	}
	// The command name may hold spaces: fields are counted after its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return s, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 17 {
		return s, false
	}
	const tick = 10 * time.Millisecond // USER_HZ, 100 on Linux
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	ticks := func(i int) time.Duration { return time.Duration(n(i)) * tick }
	// Fields 14 to 17 of proc(5): utime stime cutime cstime; 19: nice.
	return procStat{user: ticks(11), sys: ticks(12), childUser: ticks(13), childSys: ticks(14), nice: int(n(16))}, true
}

// cpuTime is CPU time, user and system.
type cpuTime struct{ user, sys time.Duration }

func (c cpuTime) total() time.Duration { return c.user + c.sys }

func (c cpuTime) sub(o cpuTime) cpuTime { return cpuTime{c.user - o.user, c.sys - o.sys} }

// treeCPU is the CPU time of process pid and of all its children, those
// that ended and those still running.
func treeCPU(t testing.TB, pid int) cpuTime {
	t.Helper()
	var sum cpuTime
	for i, p := range append([]int{pid}, children(pid)...) {
		s, ok := readStat(p)
		if !ok && i == 0 {
			t.Fatalf("process %d is gone", pid)
		}
		sum.user += s.user + s.childUser
		sum.sys += s.sys + s.childSys
	}
	return sum
}

// procKB is a kB field of /proc/PID/file; 0 when it cannot be read (the
// process ended).
func procKB(pid int, file, field string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb
		}
	}
	return 0
}

// vmHWM is a process's peak resident set, in MiB.
func vmHWM(t testing.TB, pid int) float64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb / 1024
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func render(disk string, imports, gates, zImports, zGates []float64, gzFloor, zFloor floor, reads int, parallel []float64, peak float64) string {
	var b strings.Builder
	ratio := median(gates) / median(imports)
	fmt.Fprintf(&b, "\nInput: %s, imported %d times with imagectl (gzip, qcow2), each into a repository of its own against the CNCF distribution registry with image-gate beside it.\n\n", filepath.Base(disk), len(imports))
	fmt.Fprintf(&b, "| case | measured | target | |\n| --- | ---: | ---: | --- |\n")
	fmt.Fprintf(&b, "| `imagectl import`, median of %d | %.2f s | | |\n", len(imports), median(imports))
	fmt.Fprintf(&b, "| gate: verify in full, publish, sign; median | %.2f s | | |\n", median(gates))
	fmt.Fprintf(&b, "| gate / import | %.2f | ≤ 0.25 | %s |\n", ratio, verdict(ratio <= 0.25))
	floorRows(&b, "gzip", gzFloor, median(imports))
	zRatio := median(zGates) / median(zImports)
	fmt.Fprintf(&b, "| `imagectl import --compression zstd`, median of %d | %.2f s | | |\n", len(zImports), median(zImports))
	fmt.Fprintf(&b, "| gate on the zstd images; median | %.2f s | | |\n", median(zGates))
	fmt.Fprintf(&b, "| gate / import, zstd | %.2f | ≤ 0.25 | %s |\n", zRatio, verdict(zRatio <= 0.25))
	floorRows(&b, "zstd", zFloor, median(zImports))
	fmt.Fprintf(&b, "| full reads of the tenant's layer by imagepipe, per digest | %d | 1 | %s |\n", reads, verdict(reads == 1))
	fmt.Fprintf(&b, "| 4 verifications at once (4 tenants): slowest | %.2f s | | |\n", slowest(parallel))
	fmt.Fprintf(&b, "| gate peak memory with 4 at once (gate and children, PSS) | %.0f MiB | ≤ 256 MiB | %s |\n", peak, verdict(peak <= 256))
	return b.String()
}

// floorRows are the floor of any verifier of the layer, next to the import
// it is a share of.
func floorRows(b *strings.Builder, comp string, f floor, importSecs float64) {
	fmt.Fprintf(b, "| floor, %s: decompressing the layer alone, one stream | %.2f s = %.2f of the import | | |\n", comp, f.decodeSecs, f.decodeSecs/importSecs)
	fmt.Fprintf(b, "| floor, %s: decompressing and hashing blob and tar, one core | %.2f s = %.2f of the import | | |\n", comp, f.cpuSecs, f.cpuSecs/importSecs)
}

func slowest(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}
