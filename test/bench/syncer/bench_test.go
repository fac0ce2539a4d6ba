//go:build linux

package syncer

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/imagepipe/imagepipe/internal/cdi"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
	"github.com/imagepipe/imagepipe/test/harness"
	"github.com/imagepipe/imagepipe/test/testenv"

	"github.com/imagepipe/imagepipe/internal/need"
)

// The workloads and the targets.
const (
	// Latency: pushes spread over latencyRepos repositories of tenant acme, latencyTags each,
	// watched on two hubs; every DataVolume must appear within latencyDeadline.
	latencyRepos    = 20
	latencyTags     = 10
	latencyTarget   = time.Second // p99
	latencyDeadline = 2 * time.Minute

	// Resync: resyncRepos repositories of resyncTags tags each, all at one digest, polled every
	// resyncPoll; resyncPasses fast passes are measured once the initial sync settled (within
	// settleTimeout). 15 passes of 2 s span 30 s, so every BaseImage's periodic recheck of its
	// import in progress falls in the window too.
	resyncRepos         = 100
	resyncTags          = 50
	resyncPoll          = 2 * time.Second
	resyncPasses        = 15
	settleTimeout       = 10 * time.Minute
	populateConcurrency = 8
	targetReqsPerRepo   = 1.0
	targetKubeWrites    = 0
	targetInitialSync   = time.Minute
	targetReqsPerImage  = 1.0
)

// gateArgs run the gate as a provider would: the registry notifies it, and
// it polls at its default interval, not every 2 s as the tests' gates do.
var gateArgs = []string{"--poll-interval", "5m"}

// TestMain builds imagectl and image-syncer for the bench (unless the
// Makefile built them: $IMAGECTL, $IMAGE_SYNCER), and nothing otherwise.
func TestMain(m *testing.M) {
	if os.Getenv("IMAGEPIPE_BENCH") != "1" {
		os.Exit(m.Run()) // TestSyncerBench skips itself
	}
	os.Exit(testenv.MainWithSyncer(m))
}

// TestSyncerBench measures the image-syncer against the targets and writes a Markdown
// section to standard output, and to $IMAGEPIPE_BENCH_OUT when set. It fails only when the
// measurement itself cannot be made; a missed target is reported, not failed.
func TestSyncerBench(t *testing.T) {
	need.OptIn(t, "IMAGEPIPE_BENCH", "run this benchmark (make bench does)")
	start := time.Now()
	// Either part can be run alone (-run TestSyncerBench/latency); the section then holds it
	// only. A part that skips itself (a tool is missing) skips the whole, so that no partial
	// section passes for a full one.
	run := func(name string, f func(*testing.T)) bool {
		skipped := false
		ok := t.Run(name, func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			f(t)
		})
		if skipped {
			need.Missing(t, "the %s part was skipped", name)
		}
		return ok
	}
	var lat *latencyResult
	var rs *resyncResult
	if !run("latency", func(t *testing.T) { lat = benchLatency(t) }) {
		return
	}
	if !run("resync", func(t *testing.T) { rs = benchResync(t) }) {
		return
	}
	section := render(lat, rs, time.Since(start))
	fmt.Fprint(os.Stdout, section)
	if out := os.Getenv("IMAGEPIPE_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(section), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// keepLogs copies the named files into $IMAGEPIPE_BENCH_LOGS/part when that is set, for a look
// at where the time went; the originals go with the test's temporary directories.
func keepLogs(t *testing.T, part string, files map[string]string) {
	t.Helper()
	root := os.Getenv("IMAGEPIPE_BENCH_LOGS")
	if root == "" {
		return
	}
	dir := filepath.Join(root, part)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, src := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("logs kept in %s", dir)
}

// ---- 1. webhook → DataVolume latency on two hubs ----

// latencyResult holds what the latency measurement found.
type latencyResult struct {
	pushes   int
	pushWall time.Duration
	exitLag  []time.Duration // imagectl's exit after the registry completed the tag's PUT
	hubs     []hubLatency
	// retries counts the registry's failed notification deliveries ("retryingsink: error
	// writing event, retrying") by endpoint, with one of the errors.
	retries    map[string]int
	retryError string
	load       [2]string // /proc/loadavg before the pushes and after the last DataVolume
	// toVerdict is manifest PUT → the gate's "verdict given" log line, per push.
	toVerdict []time.Duration
	// cpu is the CPU time each program used from the first push to the last DataVolume.
	cpu map[string]time.Duration
}

// hubLatency is one hub's view of the pushes.
type hubLatency struct {
	name string
	// total is manifest PUT → DataVolume ADDED on the watch; toBaseImage manifest PUT →
	// BaseImage ADDED; toSeen manifest PUT → the applier's seen-at stamp on the BaseImage;
	// reconcile BaseImage ADDED → DataVolume ADDED; afterVerdict the gate's verdict →
	// DataVolume ADDED.
	total, toBaseImage, toSeen, reconcile, afterVerdict []time.Duration
	hist                                                histogram // the syncer's sync_latency
	events                                              float64   // webhook events received
	// reconciles counts the BaseImage controller's reconciles by result (success, error,
	// requeue, requeue_after), from controller-runtime's own metric.
	reconciles map[string]float64
	// slowWrites of writes counts the apiserver's BaseImage and DataVolume writes (POST, PUT)
	// that took over slowWrite.
	slowWrites, writes float64
	peakKiB            int64
	warmUp             time.Duration // of the unmeasured first push
}

// push is one image pushed: when the registry completed the PUT of its tag's manifest (from
// its log; the notifications go out then), and when imagectl exited.
type push struct {
	repo, tag, digest string
	put, exited       time.Time
}

func benchLatency(t *testing.T) *latencyResult {
	hubs := []*hub{startHub(t, "hub-a"), startHub(t, "hub-b")}
	syncers := []*syncer{reserveSyncer(t), reserveSyncer(t)}
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, GateArgs: gateArgs,
		NotifyURL: syncers[0].WebhookURL, NotifyURLs: []string{syncers[1].WebhookURL}, NotifyToken: webhookToken,
	})
	for i, s := range syncers {
		// Only webhooks drive the syncers: the one poll at start sees an empty registry.
		s.start(t, hubs[i], reg.Host, "--poll-interval", "1h")
	}
	for i, s := range syncers {
		harness.WaitUntil(t, hubs[i].Name+": syncer leading and its first poll done", time.Minute, 50*time.Millisecond, func() (bool, error) {
			return s.metrics(t).sum("imagepipe_syncer_polls_total", "kind", "full", "result", "ok") >= 1, nil
		})
	}

	obs := make([]*observer, len(hubs))
	for i, h := range hubs {
		obs[i] = observe(t, h)
	}

	// One unmeasured push first: the first writes of a syncer just started, to an apiserver
	// just started, can take seconds (see the report). Its latency is reported on its own.
	dvName := func(p push) string { return cdi.DataVolumeName(cdi.ImageName(p.repo), p.digest) }
	disk := filepath.Join(t.TempDir(), "disk.raw")
	warm := push{repo: "acme/warm-up", tag: "v0"}
	rawDisk(t, disk, "warm-up ")
	warm.digest = importImage(t, disk, reg.Host+"/"+warm.repo+":"+warm.tag).Digest
	waitForDataVolumes(t, hubs, obs, []string{dvName(warm)})
	var ok bool
	if warm.put, ok = manifestPuts(t, reg.LogPath())[warm.repo+":"+warm.tag]; !ok {
		t.Fatalf("the registry's log has no manifest PUT of %s:%s", warm.repo, warm.tag)
	}
	warmUp := make([]time.Duration, len(obs))
	for i, o := range obs {
		at, _ := o.dvAt(dvName(warm))
		warmUp[i] = at.Sub(warm.put)
	}

	n := latencyRepos * latencyTags
	pushes := make([]push, 0, n)
	load0, cpu0 := loadavg(t), cpuByProgram(t)
	t.Logf("pushing %d images to %d repositories with imagectl import", n, latencyRepos)
	begin := time.Now()
	for i := range n {
		p := push{repo: fmt.Sprintf("acme/lat-%02d", i%latencyRepos), tag: fmt.Sprintf("v%d", i/latencyRepos)}
		rawDisk(t, disk, fmt.Sprintf("latency push %d ", i))
		res := importImage(t, disk, reg.Host+"/"+p.repo+":"+p.tag)
		p.exited, p.digest = time.Now(), res.Digest
		pushes = append(pushes, p)
	}
	pushWall := time.Since(begin)
	t.Logf("pushed %d images in %s", n, pushWall.Round(time.Millisecond))
	puts := manifestPuts(t, reg.LogPath())
	exitLag := make([]time.Duration, 0, n)
	for i := range pushes {
		p := &pushes[i]
		var ok bool
		if p.put, ok = puts[p.repo+":"+p.tag]; !ok {
			t.Fatalf("the registry's log has no manifest PUT of %s:%s", p.repo, p.tag)
		}
		exitLag = append(exitLag, p.exited.Sub(p.put))
	}

	names := make([]string, len(pushes))
	for i, p := range pushes {
		names[i] = dvName(p)
	}
	waitForDataVolumes(t, hubs, obs, names)

	res := &latencyResult{pushes: n, pushWall: pushWall, exitLag: exitLag, load: [2]string{load0, loadavg(t)}, cpu: map[string]time.Duration{}}
	for prog, d := range cpuByProgram(t) {
		if d -= cpu0[prog]; d > 0 {
			res.cpu[prog] = d
		}
	}
	given := verdictsGiven(t, reg.Gate.LogPath)
	verdictAt := make([]time.Time, len(pushes))
	for i, p := range pushes {
		at, ok := given[p.repo+"@"+p.digest]
		if !ok {
			t.Fatalf("the gate's log has no verdict on %s@%s", p.repo, p.digest)
		}
		verdictAt[i] = at
		res.toVerdict = append(res.toVerdict, at.Sub(p.put))
	}
	for i, h := range hubs {
		res.hubs = append(res.hubs, hubLatency{name: h.Name, warmUp: warmUp[i]})
	}
	res.retries, res.retryError = notificationRetries(t, reg.LogPath(), syncers)
	for i, o := range obs {
		hl := &res.hubs[i]
		for j, p := range pushes {
			dvAt, _ := o.dvAt(dvName(p))
			hl.total = append(hl.total, dvAt.Sub(p.put))
			hl.afterVerdict = append(hl.afterVerdict, dvAt.Sub(verdictAt[j]))
			bi, ok := o.baseImage(cdi.BaseImageName(p.repo, p.tag))
			if !ok || bi.digest != p.digest {
				t.Fatalf("%s: no BaseImage ADDED for %s:%s at %s (saw %+v)", hubs[i].Name, p.repo, p.tag, p.digest, bi)
			}
			hl.toBaseImage = append(hl.toBaseImage, bi.at.Sub(p.put))
			hl.toSeen = append(hl.toSeen, bi.seenAt.Sub(p.put))
			hl.reconcile = append(hl.reconcile, dvAt.Sub(bi.at))
		}
		m := syncers[i].metrics(t)
		hl.hist = readHistogram(m, "imagepipe_syncer_sync_latency_seconds")
		hl.events = m.sum("imagepipe_syncer_events_total", "source", "distribution", "result", "received")
		hl.reconciles = map[string]float64{}
		for _, result := range []string{"success", "error", "requeue", "requeue_after"} {
			hl.reconciles[result] = m.sum("controller_runtime_reconcile_total", "controller", "baseimage", "result", result)
		}
		hl.peakKiB, _ = syncers[i].memory(t)
		hl.slowWrites, hl.writes = slowWrites(hubs[i].apiserverMetrics(t))
	}
	keepLatencyLogs(t, pushes, res, reg, syncers, hubs)
	return res
}

// keepLatencyLogs keeps, with IMAGEPIPE_BENCH_LOGS, the registry's and syncers' logs and a CSV
// of one line per push: when the registry completed the PUT, and each hub's milestones after it
// in milliseconds.
func keepLatencyLogs(t *testing.T, pushes []push, res *latencyResult, reg *harness.Registry, syncers []*syncer, hubs []*hub) {
	t.Helper()
	if os.Getenv("IMAGEPIPE_BENCH_LOGS") == "" {
		return
	}
	var csv strings.Builder
	csv.WriteString("repository,tag,put,imagectl_exit_ms")
	for _, hl := range res.hubs {
		fmt.Fprintf(&csv, ",%[1]s_seen_ms,%[1]s_baseimage_ms,%[1]s_datavolume_ms", hl.name)
	}
	csv.WriteString("\n")
	for i, p := range pushes {
		fmt.Fprintf(&csv, "%s,%s,%s,%d", p.repo, p.tag, p.put.Format(time.RFC3339Nano), res.exitLag[i].Milliseconds())
		for _, hl := range res.hubs {
			fmt.Fprintf(&csv, ",%d,%d,%d", hl.toSeen[i].Milliseconds(), hl.toBaseImage[i].Milliseconds(), hl.total[i].Milliseconds())
		}
		csv.WriteString("\n")
	}
	path := filepath.Join(t.TempDir(), "pushes.csv")
	if err := os.WriteFile(path, []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"pushes.csv": path, "registry.log": reg.LogPath(), "image-gate.log": reg.Gate.LogPath}
	for i, s := range syncers {
		files["syncer-"+hubs[i].Name+".log"] = s.LogPath
		if log := hubs[i].LogPaths()[1]; fileExists(log) {
			files["kube-apiserver-"+hubs[i].Name+".log"] = log
		}
	}
	keepLogs(t, "latency", files)
}

// waitForDataVolumes waits until every hub's observer saw each of the DataVolumes.
func waitForDataVolumes(t *testing.T, hubs []*hub, obs []*observer, names []string) {
	t.Helper()
	for i, o := range obs {
		harness.WaitUntil(t, fmt.Sprintf("%s: %d DataVolumes", hubs[i].Name, len(names)), latencyDeadline, 50*time.Millisecond, func() (bool, error) {
			if err := o.failed(); err != nil {
				return false, err
			}
			for _, n := range names {
				if _, ok := o.dvAt(n); !ok {
					return false, nil
				}
			}
			return true, nil
		})
	}
}

// observer records when BaseImages and DataVolumes of the tenant namespace first appear on a
// hub, through watches opened before the pushes.
type observer struct {
	mu  sync.Mutex
	dvs map[string]time.Time
	bis map[string]baseImageSeen
	err error
}

// baseImageSeen is a BaseImage's ADDED event: when it arrived, the digest, and the applier's
// seen-at stamp.
type baseImageSeen struct {
	at, seenAt time.Time
	digest     string
}

func observe(t *testing.T, h *hub) *observer {
	t.Helper()
	o := &observer{dvs: map[string]time.Time{}, bis: map[string]baseImageSeen{}}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	watchers := []struct {
		list    client.ObjectList
		onAdded func(client.Object, time.Time)
	}{
		{&cdiv1.DataVolumeList{}, func(obj client.Object, at time.Time) {
			if _, ok := o.dvs[obj.GetName()]; !ok {
				o.dvs[obj.GetName()] = at
			}
		}},
		{&v1alpha1.BaseImageList{}, func(obj client.Object, at time.Time) {
			bi := obj.(*v1alpha1.BaseImage)
			if _, ok := o.bis[bi.Name]; !ok {
				seen, _ := time.Parse(time.RFC3339Nano, bi.Annotations[v1alpha1.AnnotationSeenAt])
				o.bis[bi.Name] = baseImageSeen{at: at, seenAt: seen, digest: bi.Spec.Digest}
			}
		}},
	}
	for _, w := range watchers {
		// Open the watch here, so that it is established before the pushes start.
		wi, err := h.Client.Watch(ctx, w.list, client.InNamespace(tenantNS))
		if err != nil {
			t.Fatalf("hub %s: watching %T: %v", h.Name, w.list, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := o.follow(ctx, h, wi, w.list, w.onAdded); err != nil && ctx.Err() == nil {
				o.mu.Lock()
				o.err = errors.Join(o.err, fmt.Errorf("hub %s: watching %T: %w", h.Name, w.list, err))
				o.mu.Unlock()
			}
		}()
	}
	return o
}

// follow records ADDED events until ctx ends, reopening the watch from the last resource
// version when the apiserver closes it.
func (o *observer) follow(ctx context.Context, h *hub, w watch.Interface, list client.ObjectList, onAdded func(client.Object, time.Time)) error {
	rv := ""
	for {
		for ev := range w.ResultChan() {
			at := time.Now()
			if ev.Type == watch.Error {
				w.Stop()
				return apierrors.FromObject(ev.Object)
			}
			obj, ok := ev.Object.(client.Object)
			if !ok {
				continue
			}
			rv = obj.GetResourceVersion()
			if ev.Type == watch.Added {
				o.mu.Lock()
				onAdded(obj, at)
				o.mu.Unlock()
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return nil
		}
		var err error
		w, err = h.Client.Watch(ctx, list, client.InNamespace(tenantNS), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			return err
		}
	}
}

func (o *observer) dvAt(name string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.dvs[name]
	return at, ok
}

func (o *observer) baseImage(name string) (baseImageSeen, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	bi, ok := o.bis[name]
	return bi, ok
}

func (o *observer) failed() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// manifestPuts reads, from the registry's log, when each manifest PUT by tag completed
// ("response completed", nanosecond timestamps), keyed by "repository:tag".
func manifestPuts(t *testing.T, path string) map[string]time.Time {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]time.Time{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="response completed"`) || !strings.Contains(line, " http.request.method=PUT ") {
			continue
		}
		uri := logfmtValue(line, "http.request.uri")
		repo, ref, ok := strings.Cut(strings.TrimPrefix(uri, "/v2/"), "/manifests/")
		if !ok || strings.HasPrefix(ref, "sha256:") {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, logfmtValue(line, "time"))
		if err != nil {
			t.Fatalf("registry log line %q: %v", line, err)
		}
		out[repo+":"+ref] = at
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// notificationRetries counts the registry's failed notification deliveries by syncer
// ("hub-N"), and returns one of their errors.
func notificationRetries(t *testing.T, path string, syncers []*syncer) (map[string]int, string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	var sample string
	for line := range strings.Lines(string(data)) {
		if !strings.Contains(line, "retryingsink: error writing event") {
			continue
		}
		for i, s := range syncers {
			if strings.Contains(line, s.WebhookURL) {
				out[fmt.Sprintf("syncer %d", i+1)]++
			}
		}
		if sample == "" {
			sample = logfmtValue(strings.TrimSpace(line), "error")
		}
	}
	return out, sample
}

// slowWrite is where slowWrites draws the line, one of the bucket bounds of the apiserver's
// apiserver_request_duration_seconds.
const slowWrite = "0.4"

// slowWrites counts the apiserver's POSTs and PUTs of BaseImages and DataVolumes (status
// included) that took longer than slowWrite, and all of them.
func slowWrites(m metrics) (slow, all float64) {
	match := func(l map[string]string) bool {
		return (l["verb"] == "POST" || l["verb"] == "PUT") && (l["resource"] == "baseimages" || l["resource"] == "datavolumes")
	}
	all = m.sumIf("apiserver_request_duration_seconds_count", match)
	fast := m.sumIf("apiserver_request_duration_seconds_bucket", func(l map[string]string) bool { return match(l) && l["le"] == slowWrite })
	return all - fast, all
}

// loadavg is the first three fields of /proc/loadavg.
func loadavg(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	return strings.Join(f[:min(3, len(f))], " ")
}

// logfmtValue returns the value of key in a logfmt line (quoted or not).
func logfmtValue(line, key string) string {
	i := strings.Index(" "+line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+1:]
	if strings.HasPrefix(v, `"`) {
		for j := 1; j < len(v); j++ {
			switch v[j] {
			case '\\':
				j++
			case '"':
				if u, err := strconv.Unquote(v[:j+1]); err == nil {
					return u
				}
				return v[1:j]
			}
		}
		return ""
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// ---- 2. no-change resync of 5,000 images ----

// resyncResult holds what the resync measurement found.
type resyncResult struct {
	repos, tags                  int
	populate                     time.Duration
	fullPassReqs                 float64
	fullPassLog, initialLog      map[string]int
	initialSyncer                map[string]int // the syncer's requests until its initial sync was done
	fullPassTime                 time.Duration
	settle                       time.Duration
	initialReqs                  float64
	baseImages, dataVolumes      int
	passes                       int
	window                       time.Duration
	reqs                         float64
	reqsByCode                   map[string]float64
	windowLog                    map[string]int
	kubeWrites                   float64
	kubeWritesBy                 map[string]float64
	leaseWrites                  float64
	changedBI, changedDV         int
	reconciles                   float64
	peakKiB, rssKiB, settleRSSKi int64
}

func benchResync(t *testing.T) *resyncResult {
	res := &resyncResult{repos: resyncRepos, tags: resyncTags}
	h := startHub(t, "hub-r")
	reg := harness.StartRegistry(t, harness.RegistryOptions{Gate: testenv.ImageGate, GateArgs: gateArgs})

	// One real containerDisk, then the same manifest under every tag of every repository.
	t.Logf("populating %d repositories × %d tags", resyncRepos, resyncTags)
	begin := time.Now()
	disk := filepath.Join(t.TempDir(), "disk.raw")
	rawDisk(t, disk, "resync seed ")
	seed := importImage(t, disk, reg.Host+"/acme/res-000:t00")
	populate(t, reg.Host, "acme/res-000", seed.Digest)
	res.populate = time.Since(begin)
	t.Logf("populated in %s", res.populate.Round(time.Millisecond))

	startPos := fileSize(t, reg.LogPath())
	s := reserveSyncer(t)
	// One tenant holds all the tags here: the bound on one tenant's BaseImages is raised
	// above them, so that its count (at every create) is part of what is measured.
	s.start(t, h, reg.Host, "--poll-interval", resyncPoll.String(), "--digest-resync-interval", "1h", "--max-images-per-tenant", strconv.Itoa(2*resyncRepos*resyncTags))
	ready := time.Now()

	// The first pass is a full one. Its events reach the intake only after it is counted, so
	// the requests counted at that moment are the pass's own, or very nearly: revalidations
	// start right after, and the next (fast) pass follows at once when this one took longer
	// than the poll interval. The registry's log, read later, tells them apart.
	var m metrics
	harness.WaitUntil(t, "the first (full) poll", 2*time.Minute, 10*time.Millisecond, func() (bool, error) {
		m = s.metrics(t)
		return m.sum("imagepipe_syncer_polls_total", "kind", "full", "result", "ok") >= 1, nil
	})
	res.fullPassTime = time.Since(ready)
	res.fullPassReqs = m.sum("imagepipe_syncer_registry_requests_total")
	if e := m.sum("imagepipe_syncer_polls_total", "result", "error"); e > 0 {
		t.Fatalf("%v polls failed", e)
	}

	t.Log("waiting for the initial sync to settle")
	var donePos int64
	res.settle = waitSettled(t, h, s, seed.Digest, ready, func() { donePos = fileSize(t, reg.LogPath()) }).Sub(ready)
	res.baseImages, res.dataVolumes = resyncRepos*resyncTags, resyncRepos
	// Revalidations GET manifests and blobs; the poll only HEADs manifests.
	res.fullPassLog = registryLog(t, reg.LogPath(), startPos, 0, 2, func(r accessLine) bool {
		return bySyncer(r) && !strings.Contains(r.uri, "/blobs/") && (r.method != "GET" || !strings.Contains(r.uri, "/manifests/"))
	})
	_, res.settleRSSKi = s.memory(t)
	t.Logf("settled %s after the syncer became ready", res.settle.Round(time.Second))

	// The window: from just after one fast pass was counted to just after resyncPasses more.
	// The short pause lets the registry finish logging the pass; the next pass is a poll
	// interval away.
	fastOK := func(m metrics) float64 { return m.sum("imagepipe_syncer_polls_total", "kind", "fast", "result", "ok") }
	afterPass := func(want float64) metrics {
		// Fast passes wait while the reconciler's rechecks are queued
		// (at most daemon.MaxSkippedPasses in a row), so allow for that.
		harness.WaitUntil(t, "the fast passes", 5*time.Minute, 10*time.Millisecond, func() (bool, error) {
			return fastOK(s.metrics(t)) >= want, nil
		})
		time.Sleep(200 * time.Millisecond)
		return s.metrics(t)
	}
	m0 := afterPass(fastOK(s.metrics(t)) + 1)
	t0 := time.Now()
	a0 := h.apiserverMetrics(t)
	logPos := fileSize(t, reg.LogPath())
	res.initialReqs = m0.sum("imagepipe_syncer_registry_requests_total")
	res.initialLog = registryLog(t, reg.LogPath(), startPos, logPos, 0, nil)
	res.initialSyncer = registryLog(t, reg.LogPath(), startPos, donePos, 0, bySyncer)
	bis0, dvs0, err := listResync(t, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measuring %d fast passes", resyncPasses)
	m1 := afterPass(fastOK(m0) + resyncPasses)
	res.window = time.Since(t0)
	a1 := h.apiserverMetrics(t)
	res.windowLog = registryLog(t, reg.LogPath(), logPos, 0, 0, bySyncer)
	bis1, dvs1, err := listResync(t, h)
	if err != nil {
		t.Fatal(err)
	}
	res.peakKiB, res.rssKiB = s.memory(t)

	res.passes = int(fastOK(m1) - fastOK(m0))
	if full := m1.sum("imagepipe_syncer_polls_total", "kind", "full") - m0.sum("imagepipe_syncer_polls_total", "kind", "full"); full != 0 {
		t.Fatalf("%v full passes ran in the window", full)
	}
	if e := m1.sum("imagepipe_syncer_polls_total", "result", "error") - m0.sum("imagepipe_syncer_polls_total", "result", "error"); e != 0 {
		t.Fatalf("%v polls failed in the window", e)
	}
	res.reqs = m1.sum("imagepipe_syncer_registry_requests_total") - m0.sum("imagepipe_syncer_registry_requests_total")
	res.reqsByCode = map[string]float64{}
	for _, smp := range m1 {
		if smp.name == "imagepipe_syncer_registry_requests_total" {
			k := smp.labels["method"] + " " + smp.labels["code"]
			res.reqsByCode[k] = smp.value - m0.sum("imagepipe_syncer_registry_requests_total", "method", smp.labels["method"], "code", smp.labels["code"])
		}
	}
	res.reconciles = m1.sum("controller_runtime_reconcile_total", "controller", "baseimage") - m0.sum("controller_runtime_reconcile_total", "controller", "baseimage")

	// Writes, as the apiserver counts them. Leases are renewed every few seconds by design
	// (the syncer's leader lease, the apiserver's own identity lease) and are left out.
	w0, w1 := writes(a0), writes(a1)
	res.kubeWritesBy = map[string]float64{}
	for k, v := range w1 {
		d := v - w0[k]
		switch {
		case d == 0:
		case strings.HasPrefix(k, "coordination.k8s.io/"):
			res.leaseWrites += d
		default:
			res.kubeWrites += d
			res.kubeWritesBy[k] += d
		}
	}
	res.changedBI = changed(versions(bis0.Items), versions(bis1.Items))
	res.changedDV = changed(versions(dvs0.Items), versions(dvs1.Items))
	return res
}

// writes sums the apiserver's write requests by "group/resource[/subresource] VERB". Leases
// are renewed every few seconds by design (the syncer's leader lease, the apiserver's own
// identity lease); the caller tells them apart by their group.
func writes(m metrics) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m {
		if s.name != "apiserver_request_total" {
			continue
		}
		l := s.labels
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY":
			out[strings.TrimLeft(l["group"]+"/"+l["resource"], "/")+strings.TrimRight("/"+l["subresource"], "/")+" "+l["verb"]] += s.value
		}
	}
	return out
}

// waitSettled waits until the initial sync is done and then quiet. Done: every BaseImage
// created, revalidated and importing the digest, one DataVolume per repository, the intake
// queue empty; that is the syncer's part, and the moment it was first seen is returned (onDone
// is called then). Quiet:
// no BaseImage written across two more fast passes. Between the two, CDI's controller writes
// the DataVolumes' status (claims, importer pods) at its own pace, and the syncer mirrors the
// import's progress into the BaseImages: changes, not idle writes.
func waitSettled(t *testing.T, h *hub, s *syncer, digest string, ready time.Time, onDone func()) time.Time {
	t.Helper()
	var doneAt time.Time
	wantBI, wantDV := resyncRepos*resyncTags, resyncRepos
	fastOK := func(m metrics) float64 { return m.sum("imagepipe_syncer_polls_total", "kind", "fast", "result", "ok") }
	lastLog := time.Now()
	var rvBI map[string]string
	harness.WaitUntil(t, "the initial sync to settle", settleTimeout, 250*time.Millisecond, func() (bool, error) {
		m := s.metrics(t)
		importing := m.sum("imagepipe_syncer_images", "phase", string(v1alpha1.PhaseImporting))
		intake, queue := m.sum("imagepipe_syncer_queue_depth"), m.sum("workqueue_depth", "name", "baseimage")
		if time.Since(lastLog) > 15*time.Second {
			t.Logf("  %s: %v of %d BaseImages importing, intake queue %v, reconcile queue %v",
				time.Since(ready).Round(time.Second), importing, wantBI, intake, queue)
			lastLog = time.Now()
		}
		// The reconcile queue is never empty for long: every Importing
		// BaseImage is rechecked every 30 s, without writes.
		if int(importing) != wantBI || intake != 0 {
			return false, nil
		}
		at := time.Now()
		bis, dvs, err := listResync(t, h)
		if err != nil {
			return false, err
		}
		if len(bis.Items) != wantBI || len(dvs.Items) != wantDV {
			return false, nil
		}
		for _, bi := range bis.Items {
			if bi.Spec.Digest != digest || bi.Status.ObservedDigest != digest || bi.Status.Phase != v1alpha1.PhaseImporting {
				return false, nil
			}
		}
		if doneAt.IsZero() {
			doneAt = at
			onDone()
		}
		nowBI := versions(bis.Items)
		quiet := sameVersions(rvBI, nowBI)
		rvBI = nowBI
		if !quiet { // look again two passes on
			passes := fastOK(m)
			harness.WaitUntil(t, "two fast passes", time.Minute, 50*time.Millisecond, func() (bool, error) {
				return fastOK(s.metrics(t)) >= passes+2, nil
			})
		}
		return quiet, nil
	})
	return doneAt
}

// populate puts the image digest of seedRepo under resyncTags tags of each of resyncRepos
// repositories (acme/res-NNN:tNN): one write per repository, which mounts the blobs from
// seedRepo, then one manifest PUT per further tag.
func populate(t *testing.T, host, seedRepo, digest string) {
	t.Helper()
	ctx := t.Context()
	src, err := name.NewDigest(host + "/" + seedRepo + "@" + digest)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(src, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	pusher, err := remote.NewPusher(remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	var g errgroup.Group
	g.SetLimit(populateConcurrency)
	for r := range resyncRepos {
		g.Go(func() error {
			repo, err := name.NewRepository(fmt.Sprintf("%s/acme/res-%03d", host, r))
			if err != nil {
				return err
			}
			for i := range resyncTags {
				tag := repo.Tag(fmt.Sprintf("t%02d", i))
				if repo.RepositoryStr() == seedRepo && i == 0 {
					continue // imagectl pushed it
				}
				if i == 0 {
					err = remote.Write(tag, img, remote.Reuse(pusher))
				} else {
					err = remote.Tag(tag, img, remote.Reuse(pusher))
				}
				if err != nil {
					return fmt.Errorf("pushing %s: %w", tag, err)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

func listResync(t *testing.T, h *hub) (*v1alpha1.BaseImageList, *cdiv1.DataVolumeList, error) {
	var bis v1alpha1.BaseImageList
	var dvs cdiv1.DataVolumeList
	if err := h.Client.List(t.Context(), &bis, client.InNamespace(tenantNS)); err != nil {
		return nil, nil, err
	}
	if err := h.Client.List(t.Context(), &dvs, client.InNamespace(tenantNS)); err != nil {
		return nil, nil, err
	}
	return &bis, &dvs, nil
}

// versions maps each object's name to its resourceVersion.
func versions[T any, PT interface {
	*T
	client.Object
}](items []T) map[string]string {
	out := make(map[string]string, len(items))
	for i := range items {
		o := PT(&items[i])
		out[o.GetName()] = o.GetResourceVersion()
	}
	return out
}

func sameVersions(a, b map[string]string) bool {
	if a == nil || b == nil || len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// changed counts objects created, deleted or written between two version maps.
func changed(before, after map[string]string) int {
	n := 0
	for k, v := range after {
		if before[k] != v {
			n++
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			n++
		}
	}
	return n
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// accessLine is one request in the registry's access log.
type accessLine struct{ method, uri, agent string }

// kind names what a request was for.
func (a accessLine) kind() string {
	switch {
	case a.uri == "/v2/":
		return "GET /v2/"
	case strings.HasPrefix(a.uri, "/v2/_catalog"):
		return a.method + " catalog"
	case strings.Contains(a.uri, "/tags/list"):
		return a.method + " tag listing"
	case strings.Contains(a.uri, "/manifests/"):
		return a.method + " manifest"
	case strings.Contains(a.uri, "/blobs/"):
		return a.method + " blob"
	}
	return a.method + " other"
}

// bySyncer keeps the syncer's requests: the gate beside the registry polls it too.
func bySyncer(a accessLine) bool { return strings.HasPrefix(a.agent, "image-syncer/") }

// registryLog counts the requests in the registry's access log (its combined-log-format
// lines) between the offsets from and to (to ≤ 0: the end), by kind, keeping those keep accepts
// (nil: all). With stopAtCatalog above 0 it stops before the kept catalog request of that number:
// polls run one at a time and each begins with one, so this cuts the log where a pass starts.
func registryLog(t *testing.T, path string, from, to int64, stopAtCatalog int, keep func(accessLine) bool) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if to <= 0 {
		to = math.MaxInt64
	}
	out := map[string]int{}
	sc := bufio.NewScanner(io.NewSectionReader(f, from, to-from))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	catalogs := 0
	for sc.Scan() {
		// 127.0.0.1 - - [date] "GET /v2/... HTTP/1.1" 200 816 "" "agent"
		line := sc.Text()
		i := strings.Index(line, `] "`)
		if i < 0 || strings.HasPrefix(line, "time=") {
			continue
		}
		req, rest, ok := strings.Cut(line[i+3:], `" `)
		f := strings.Fields(req)
		if !ok || len(f) != 3 {
			continue
		}
		a := accessLine{method: f[0], uri: f[1]}
		if j := strings.LastIndex(strings.TrimSuffix(rest, `"`), `"`); j >= 0 {
			a.agent = strings.TrimSuffix(rest[j+1:], `"`)
		}
		if keep != nil && !keep(a) {
			continue
		}
		if strings.HasPrefix(a.uri, "/v2/_catalog") {
			if catalogs++; catalogs == stopAtCatalog {
				break
			}
		}
		out[a.kind()]++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ---- statistics and the report ----

// quantile is the nearest-rank q-quantile of ds (p99 of 200 samples is the 198th smallest).
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func maxOf(ds []time.Duration) time.Duration { return slices.Max(ds) }

// histogram is a Prometheus histogram: cumulative counts by upper bound.
type histogram struct {
	bounds []float64
	counts []float64
	count  float64
	sum    float64
}

func readHistogram(m metrics, name string) histogram {
	var h histogram
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, s := range m {
		if s.name == name+"_bucket" {
			le, err := strconv.ParseFloat(s.labels["le"], 64)
			if err == nil {
				bs = append(bs, bucket{le, s.value})
			}
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	for _, b := range bs {
		h.bounds, h.counts = append(h.bounds, b.le), append(h.counts, b.n)
	}
	h.count, h.sum = m.sum(name+"_count"), m.sum(name+"_sum")
	return h
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile does: linear within
// the bucket that holds it.
func (h histogram) quantile(q float64) float64 {
	if h.count == 0 || len(h.bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, ub := range h.bounds {
		if h.counts[i] >= rank {
			if math.IsInf(ub, 1) {
				return lower // above the highest finite bucket: its bound
			}
			in := h.counts[i] - below
			if in == 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/in
		}
		lower, below = ub, h.counts[i]
	}
	return lower
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func mib(kib int64) string { return fmt.Sprintf("%.1f", float64(kib)/1024) }

// sortedCounts renders a count map as "k n, k n" in key order.
func sortedCounts[V int | float64](m map[string]V) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v != 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %v", k, m[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func toolVersion(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// render writes the Markdown section, in the style of import.sh's; a part that did not run
// (nil) is left out.
func render(lat *latencyResult, rs *resyncResult, took time.Duration) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	bin := harness.BinDir()
	p("\n## image-syncer: webhook → DataVolume latency and no-change resync\n\n")
	p("- image-syncer: %s; imagectl: %s\n", testenv.ImageSyncer, testenv.Imagectl)
	p("- registry: %s; %s; etcd %s (from %s)\n", toolVersion(filepath.Join(bin, "registry"), "--version"),
		toolVersion(filepath.Join(bin, "kube-apiserver"), "--version"), strings.TrimPrefix(toolVersion(filepath.Join(bin, "etcd"), "--version"), "etcd Version: "), bin)
	p("- hubs: etcd + kube-apiserver + CDI's controller each, the node stand-in paused (CDI's importer pods stay Pending: imports run on worker nodes, not on the two cores measured here, and the created DataVolume ends the measured path); the gate beside the registry verifies every push, and the syncer imports only what it verified; the syncer runs as the hub user \"syncer\" bound to config/syncer/rbac.yaml, with its defaults (--workers 4, --kube-qps 500, --kube-burst 1000)\n")
	p("- whole syncer bench: %s wall, hub start-ups included\n", took.Round(time.Second))
	if lat != nil {
		renderLatency(p, lat)
	}
	if rs != nil {
		renderResync(p, rs)
	}
	p("\nCommands:\n\n")
	p("- bench: `bash test/bench/syncer.sh`, which runs `IMAGEPIPE_BENCH=1 go test ./test/bench/syncer -run TestSyncerBench -count=1 -v -timeout 30m`\n")
	p("- syncer (latency, per hub): `image-syncer --kubeconfig HUB/syncer.kubeconfig --registry 127.0.0.1:PORT --webhook-listen ... --webhook-token-file ... --metrics-listen ... --health-listen ... --leader-election-namespace imagepipe-system --storage-class shared-rwx --log-format text --poll-interval 1h`\n")
	p("- syncer (resync): the same with `--poll-interval %s --digest-resync-interval 1h --max-images-per-tenant %d`\n", resyncPoll, 2*resyncRepos*resyncTags)
	p("- push: `IMAGEPIPE_CACHE=$(mktemp -d) imagectl import --quiet -o json DISK 127.0.0.1:PORT/acme/lat-NN:vN`\n")
	return b.String()
}

func renderLatency(p func(string, ...any), lat *latencyResult) {
	p("- latency method: two hubs, one syncer each (`--poll-interval 1h`: after the first, empty poll only webhooks drive them), the registry notifying both (distribution notifications, one endpoint per syncer: timeout 5s, threshold 3, backoff 1s). %d images of different content (1 MiB raw disks) pushed one after another with `imagectl import` after one unmeasured warm-up push (its DataVolume awaited on both hubs), to %d repositories × %d tags of tenant acme (%s wall for all pushes). A watch on BaseImages and one on DataVolumes per hub, opened before the first push, timestamp each ADDED event; latency is from the moment the registry completed the PUT of the tag's manifest (its log's \"response completed\" timestamp; notifications go out then; imagectl exited %s ms later at the median) to the ADDED event of the DataVolume named cdi.DataVolumeName(image, digest). p50/p99 are nearest-rank over the %d pushes (p99 is the 3rd slowest of 200). The syncer's own imagepipe_syncer_sync_latency_seconds (seen-at stamp → DataVolume created) is shown as a cross-check, estimated from its buckets as histogram_quantile does\n\n",
		lat.pushes, latencyRepos, latencyTags, lat.pushWall.Round(time.Millisecond), fmt.Sprintf("%.0f", quantile(lat.exitLag, 0.5).Seconds()*1000), lat.pushes)
	p("| case | pushes | p50 (s) | p99 (s) | max (s) | target | met | syncer histogram p50 / p99 (s) | syncer peak RSS (MiB) |\n")
	p("|---|---:|---:|---:|---:|---|---|---:|---:|\n")
	letter := 'i'
	for _, h := range lat.hubs {
		p99 := quantile(h.total, 0.99)
		p("| (%c) push → DataVolume on %s | %d | %s | %s | %s | p99 ≤ %g s | %s | %.3f / %.3f (%v observations, the warm-up's included) | %s |\n",
			letter, h.name, len(h.total), secs(quantile(h.total, 0.5)), secs(p99), secs(maxOf(h.total)),
			latencyTarget.Seconds(), yesNo(p99 <= latencyTarget), h.hist.quantile(0.5), h.hist.quantile(0.99), h.hist.count, mib(h.peakKiB))
		letter++
	}
	p("\nWhere the time goes (p50 / p99 / max, seconds after the registry completed the manifest PUT; the seen-at stamp is the applier's clock when it wrote the BaseImage, so it comes after the notification's delivery and the wait in the intake queue):\n\n")
	stage := func(ds []time.Duration) string {
		return fmt.Sprintf("%s / %s / %s", secs(quantile(ds, 0.5)), secs(quantile(ds, 0.99)), secs(maxOf(ds)))
	}
	p("- the gate's verdict published (its \"verdict given\" log line, millisecond stamps): %s\n", stage(lat.toVerdict))
	for _, h := range lat.hubs {
		p("- %s: seen-at stamp %s; BaseImage ADDED %s; BaseImage ADDED → DataVolume ADDED (the wait for the verdict, its look-up, the DataVolume create) %s; the gate's verdict → DataVolume ADDED %s; manifest push events received %v (2 per import, the build-key tag and the tag; the warm-up's included); the apiserver's BaseImage and DataVolume writes over %s s: %v of %v; BaseImage reconciles: %v successes, %v requeues through the backoff, %v rechecks, %v errors\n",
			h.name, stage(h.toSeen), stage(h.toBaseImage), stage(h.reconcile), stage(h.afterVerdict), h.events, slowWrite, h.slowWrites, h.writes,
			h.reconciles["success"], h.reconciles["requeue"], h.reconciles["requeue_after"], h.reconciles["error"])
	}
	p("- the unmeasured warm-up push before them (the first after the hubs and syncers started):")
	for i, h := range lat.hubs {
		sep := ","
		if i == len(lat.hubs)-1 {
			sep = ""
		}
		p(" %s %s s%s", h.name, secs(h.warmUp), sep)
	}
	p("\n- the registry's failed notification deliveries, by endpoint (distribution retries each at once, with a 1 s back-off once 3 in a row failed; an event whose response was lost is delivered twice): %s", sortedCounts(lat.retries))
	if lat.retryError != "" {
		p(", e.g. %q", lat.retryError)
	}
	p("\n- load average (1, 5, 15 min) before the pushes: %s; after the last DataVolume: %s\n", lat.load[0], lat.load[1])
	var total time.Duration
	for _, d := range lat.cpu {
		total += d
	}
	p("- CPU seconds from the first push to the last DataVolume, by program (two hubs' of each; a program's children that ended count as its own: the gate's verifications as image-gate's, the imagectl imports as syncer.test's): %.1f in all; %s\n",
		total.Seconds(), cpuTable(lat.cpu))
}

// verdictsGiven reads the gate's log: when it published a verdict, by REPO@DIGEST.
func verdictsGiven(t *testing.T, path string) map[string]time.Time {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("reading the gate's log: %v", err)
	}
	defer f.Close()
	out := map[string]time.Time{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if logfmtValue(line, "msg") != "verdict given" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, logfmtValue(line, "time"))
		if err != nil {
			t.Fatalf("the gate's log line %q has no time: %v", line, err)
		}
		ref, err := name.NewDigest(logfmtValue(line, "subject"))
		if err != nil {
			t.Fatalf("the gate's log line %q names no subject: %v", line, err)
		}
		out[ref.RepositoryStr()+"@"+ref.DigestStr()] = at
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the gate's log: %v", err)
	}
	return out
}

// cpuByProgram sums, by program name, the CPU time of every process on the machine and of
// its children that ended (utime, stime, cutime and cstime of /proc/PID/stat).
func cpuByProgram(t *testing.T) map[string]time.Duration {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	const tick = 10 * time.Millisecond // USER_HZ, 100 on Linux
	out := map[string]time.Duration{}
	for _, path := range dirs {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the process ended since the glob
		}
		open, end := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(string(b[end+1:]))
		if len(f) < 15 {
			continue
		}
		var sum int64
		for _, v := range f[11:15] { // fields 14 to 17: utime stime cutime cstime
			n, _ := strconv.ParseInt(v, 10, 64)
			sum += n
		}
		out[string(b[open+1:end])] += time.Duration(sum) * tick
	}
	return out
}

// cpuTable is the programs that used at least half a CPU second, most first.
func cpuTable(cpu map[string]time.Duration) string {
	progs := slices.Collect(maps.Keys(cpu))
	slices.SortFunc(progs, func(a, b string) int { return cmp.Compare(cpu[b], cpu[a]) })
	var parts []string
	for _, prog := range progs {
		if cpu[prog] >= 500*time.Millisecond {
			parts = append(parts, fmt.Sprintf("%s %.1f", prog, cpu[prog].Seconds()))
		}
	}
	return strings.Join(parts, ", ")
}

func renderResync(p func(string, ...any), rs *resyncResult) {
	lists := rs.windowLog["GET tag listing"]
	perPass := func(v float64) float64 { return v / float64(rs.passes) }
	perRepo := perPass(float64(lists)) / float64(rs.repos)
	p("\n- resync method: one hub, one syncer (`--poll-interval %s --digest-resync-interval 1h`), the registry without notifications. %d tags = %d repositories × %d tags, all pointing at one imagectl-imported containerDisk (pushed once, then its manifest PUT under every tag, blobs mounted; %s). The syncer's first pass is a full one; the bench then waits until the initial sync settled (all %d BaseImages revalidated and importing, %d DataVolumes — one per repository and digest —, the intake queue empty: %s after the syncer was ready; then no BaseImage resourceVersion changing across two passes, CDI's controller having written the DataVolumes' status and the syncer having mirrored their progress) and measures %d fast passes (%s): registry requests from the syncer's imagepipe_syncer_registry_requests_total and, independently, from the registry's access log; Kubernetes writes from the apiserver's apiserver_request_total (POST, PUT, PATCH, DELETE), leases left out (the syncer's leader lease and the apiserver's identity lease are renewed every few seconds by design: %v lease writes in the window), cross-checked with the resourceVersions of every BaseImage and DataVolume before and after; RSS from /proc/PID/status of the syncer. No import runs here (the node takes no pod), so every BaseImage stays Importing and is rechecked every 30 s: the window spans those rechecks (%v reconciles in it)\n\n",
		resyncPoll, rs.repos*rs.tags, rs.repos, rs.tags, rs.populate.Round(time.Millisecond), rs.baseImages, rs.dataVolumes, rs.settle.Round(time.Second), rs.passes, rs.window.Round(time.Millisecond), rs.leaseWrites, rs.reconciles)
	p("| case | value | target | met |\n")
	p("|---|---:|---|---|\n")
	p("| (k) the syncer's registry requests per repository per fast pass (tag listings, from the registry's log) | %.2f | ≤ %g | %s |\n", perRepo, targetReqsPerRepo, yesNo(perRepo <= targetReqsPerRepo))
	p("| (l) all registry requests per fast pass (syncer's counter), and per repository | %.1f (%.2f) | — (info: %d tag listings + 1 catalog page) | — |\n", perPass(rs.reqs), perPass(rs.reqs)/float64(rs.repos), rs.repos)
	p("| (m) Kubernetes writes during %d fast passes (leases excluded) | %v (BaseImages changed: %d, DataVolumes changed: %d) | %d | %s |\n", rs.passes, rs.kubeWrites, rs.changedBI, rs.changedDV, targetKubeWrites,
		yesNo(rs.kubeWrites == targetKubeWrites && rs.changedBI == 0 && rs.changedDV == 0))
	p("| (n) syncer RSS with %d BaseImages: peak (VmHWM, includes the initial sync) / after the passes | %s / %s MiB | — (info) | — |\n", rs.baseImages, mib(rs.peakKiB), mib(rs.rssKiB))
	p("| (o) first (full) pass: registry requests per repository (syncer's counter) | %.2f (%v requests, counted %s after the syncer was ready) | — (info) | — |\n", rs.fullPassReqs/float64(rs.repos), rs.fullPassReqs, rs.fullPassTime.Round(time.Millisecond))
	p("| (p) initial sync of %d images: syncer ready → every BaseImage importing, every DataVolume made | %s | ≤ %s | %s |\n", rs.baseImages, rs.settle.Round(time.Second), targetInitialSync, yesNo(rs.settle <= targetInitialSync))
	beyond := 0
	for k, n := range rs.initialSyncer {
		if k != "GET catalog" {
			beyond += n
		}
	}
	perImage := float64(beyond) / float64(rs.baseImages)
	syncLists := rs.initialSyncer["GET tag listing"]
	p("| (q) the syncer's registry requests in the initial sync per image, beyond the catalog (registry's log, by User-Agent) | %.2f (%d, of which %d tag listings of fast passes at the bench's %s interval) | about %g | %s |\n",
		perImage, beyond, syncLists, resyncPoll, targetReqsPerImage, yesNo(perImage <= targetReqsPerImage*1.1))
	own := float64(beyond-syncLists) / float64(rs.baseImages)
	p("| (q′) the same without the fast passes' tag listings | %.2f | about %g | %s |\n", own, targetReqsPerImage, yesNo(own <= targetReqsPerImage*1.1))
	p("\nNotes:\n\n")
	p("- fast-pass requests in the window by method and code (syncer's counter): %s; by kind (registry's log): %s\n", sortedCounts(rs.reqsByCode), sortedCounts(rs.windowLog))
	p("- first (full) pass by kind (registry's log up to the next pass's catalog request; the revalidations' manifest GETs and blob requests, which overlap it, left out, but not their GET /v2/): %s\n", sortedCounts(rs.fullPassLog))
	p("- initial sync by kind (registry's log from the syncer's start): the syncer's until it was done, %s; all clients (the gate's verifications too) until the measured window, %s\n", sortedCounts(rs.initialSyncer), sortedCounts(rs.initialLog))
	if rs.kubeWrites > 0 {
		p("- Kubernetes writes in the window by resource and verb: %s\n", sortedCounts(rs.kubeWritesBy))
	}
	p("- syncer RSS when the initial sync had settled: %s MiB\n", mib(rs.settleRSSKi))
}
