package gate

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/imagepipe/imagepipe/pkg/api"
)

// Metrics are the gate's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	verdicts *prometheus.CounterVec
	seconds  prometheus.Histogram
	failures prometheus.Counter
	waiting  prometheus.Gauge
}

// NewMetrics registers the gate's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imagepipe_gate_verdicts_total", Help: "Verdicts given, by verdict and first reason code.",
		}, []string{"verdict", "reason"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "imagepipe_gate_verification_seconds", Help: "Time to verify, publish and sign one digest.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "imagepipe_gate_verification_failures_total", Help: "Verifications that ended without a verdict (registry errors, interrupts); they are retried.",
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "imagepipe_gate_queue_depth", Help: "Images waiting for a verdict.",
		}),
	}
	for _, c := range []prometheus.Collector{m.verdicts, m.seconds, m.failures, m.waiting} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) verdict(v *api.Verdict, d time.Duration) {
	if m == nil {
		return
	}
	reason := ""
	if len(v.Reasons) > 0 {
		reason = v.Reasons[0].Code
	}
	m.verdicts.WithLabelValues(v.Verdict, reason).Inc()
	m.seconds.Observe(d.Seconds())
}

func (m *Metrics) failed() {
	if m != nil {
		m.failures.Inc()
	}
}

func (m *Metrics) queued(n int) {
	if m != nil {
		m.waiting.Set(float64(n))
	}
}
