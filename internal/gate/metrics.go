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
	cpu      *prometheus.CounterVec
	bytes    *prometheus.CounterVec
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
		cpu: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imagepipe_gate_tenant_cpu_seconds_total", Help: "CPU time of verifications, by tenant: what tenant budgets bound.",
		}, []string{"tenant"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "imagepipe_gate_tenant_bytes_total", Help: "Bytes verifications decompressed and spooled, by tenant and what.",
		}, []string{"tenant", "what"}),
	}
	for _, c := range []prometheus.Collector{m.verdicts, m.seconds, m.failures, m.waiting, m.cpu, m.bytes} {
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

func (m *Metrics) spent(tenant string, c Cost) {
	if m == nil {
		return
	}
	m.cpu.WithLabelValues(tenant).Add(c.CPU.Seconds())
	m.bytes.WithLabelValues(tenant, "decompressed").Add(float64(c.Decompressed))
	m.bytes.WithLabelValues(tenant, "spooled").Add(float64(c.Spooled))
}
