package hub

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/imagepipe/imagepipe/internal/intake"
	"github.com/imagepipe/imagepipe/internal/version"
	"github.com/imagepipe/imagepipe/pkg/api/v1alpha1"
)

// Metrics are the syncer's Prometheus metrics. A nil *Metrics records
// nothing, so that tests and library users need not register any.
type Metrics struct {
	// Events counts registry events by source (distribution, harbor, quay,
	// zot, poll) and result (applied, ignored, retried, malformed,
	// unauthorized).
	Events *prometheus.CounterVec
	// SyncLatency is the time from the syncer learning of a digest to the
	// DataVolume importing it being created.
	SyncLatency prometheus.Histogram
	// Polls counts registry polls by kind (fast, full) and result (ok,
	// error, skipped: a fast pass not run while events were queued).
	Polls *prometheus.CounterVec
	// RegistryRequests counts HTTP requests to the registry by method and code.
	RegistryRequests *prometheus.CounterVec
	images           *prometheus.GaugeVec

	mu     sync.Mutex
	phases map[types.NamespacedName]v1alpha1.Phase
}

var _ intake.Counter = (*Metrics)(nil)

// NewMetrics creates the metrics and registers them, with a queue-depth
// gauge reading queueDepth at each scrape (nil: no such gauge), and the
// gauge imagepipe_syncer_build_info: always 1, its labels version, commit
// and goversion saying which build runs (version.Get), so that a query can
// join any other series to the build that produced it.
func NewMetrics(reg prometheus.Registerer, queueDepth func() int) (*Metrics, error) {
	build := version.Get()
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imagepipe_syncer_events_total",
			Help: "Registry events received, by source and result.",
		}, []string{"source", "result"}),
		SyncLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "imagepipe_syncer_sync_latency_seconds",
			Help:    "Time from learning of a new digest to creating the DataVolume that imports it.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		Polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imagepipe_syncer_polls_total",
			Help: "Registry polls, by kind (fast: tag listings; full: every digest too) and result (ok, error, skipped while events were queued).",
		}, []string{"kind", "result"}),
		RegistryRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imagepipe_syncer_registry_requests_total",
			Help: "HTTP requests sent to the registry, by method and status code.",
		}, []string{"method", "code"}),
		images: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "imagepipe_syncer_images",
			Help: "BaseImages on this hub by phase, as last reconciled by this replica.",
		}, []string{"phase"}),
		phases: map[types.NamespacedName]v1alpha1.Phase{},
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "imagepipe_syncer_build_info",
		Help:        "Always 1; the labels say which build of image-syncer runs.",
		ConstLabels: prometheus.Labels{"version": build.Version, "commit": build.Commit, "goversion": build.GoVersion},
	})
	buildInfo.Set(1)
	collectors := []prometheus.Collector{m.Events, m.SyncLatency, m.Polls, m.RegistryRequests, m.images, buildInfo}
	if queueDepth != nil {
		collectors = append(collectors, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "imagepipe_syncer_queue_depth",
			Help: "Images waiting in the intake queue.",
		}, func() float64 { return float64(queueDepth()) }))
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) event(source, result string) {
	if m != nil {
		m.Events.WithLabelValues(source, result).Inc()
	}
}

// Refused counts one event or request refused by source, with result
// "unauthorized" or "malformed".
func (m *Metrics) Refused(source, result string) { m.event(source, result) }

// Received counts n events received from source.
func (m *Metrics) Received(source string, n int) {
	if m != nil {
		m.Events.WithLabelValues(source, "received").Add(float64(n))
	}
}

// Applied counts the outcome of handling one event: applied, or retried
// when err is not nil.
func (m *Metrics) Applied(e intake.Event, err error) {
	if err != nil {
		m.event(e.Source, "retried")
		return
	}
	m.event(e.Source, "applied")
}

// Polled counts one poll of the registry.
func (m *Metrics) Polled(full bool, err error) {
	if m == nil {
		return
	}
	kind, result := "fast", "ok"
	if full {
		kind = "full"
	}
	if err != nil {
		result = "error"
	}
	m.Polls.WithLabelValues(kind, result).Inc()
}

// PollSkipped counts a fast pass not run because events were still queued.
func (m *Metrics) PollSkipped() {
	if m != nil {
		m.Polls.WithLabelValues("fast", "skipped").Inc()
	}
}

func (m *Metrics) latency(d time.Duration) {
	if m != nil && d >= 0 {
		m.SyncLatency.Observe(d.Seconds())
	}
}

// phase records the phase of one BaseImage; "" forgets it.
func (m *Metrics) phase(key types.NamespacedName, p v1alpha1.Phase) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.phases[key]; ok {
		m.images.WithLabelValues(string(old)).Dec()
		delete(m.phases, key)
	}
	if p != "" {
		m.phases[key] = p
		m.images.WithLabelValues(string(p)).Inc()
	}
}
