package poll

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/internal/promreg"
)

// pollMetrics are the Prometheus series of poll sources. Pollers sharing a
// registerer share one set.
type pollMetrics struct {
	read        *prometheus.CounterVec
	merged      *prometheus.CounterVec
	runs        *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
	watermark   *prometheus.GaugeVec
	window      *prometheus.GaugeVec
	lastSuccess *prometheus.GaugeVec
	age         *watermarkAge
}

func newPollMetrics(reg prometheus.Registerer) *pollMetrics {
	m := &pollMetrics{
		read: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_poll_rows_read_total",
			Help: "Source rows read by committed poll runs, including rows re-read inside the lookback window.",
		}, []string{"source"}),
		merged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_poll_rows_merged_total",
			Help: "Rows that changed the mirror, by operation (insert, update, delete for soft-deleted source rows).",
		}, []string{"source", "op"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_poll_runs_total",
			Help: "Poll runs by result (ok or error).",
		}, []string{"source", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tidemark_poll_run_seconds",
			Help:    "Duration of successful poll runs, from the checks of the source at a first run to the commit.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
		}, []string{"source"}),
		watermark: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_poll_watermark_timestamp_seconds",
			Help: "The poll source's high watermark: the newest updated_at loaded.",
		}, []string{"source"}),
		window: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_poll_window_seconds",
			Help: "Width of the last run's window (watermark - lookback, upper]; absent until the first watermark.",
		}, []string{"source"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_poll_last_success_timestamp_seconds",
			Help: "Service time at which the last poll run committed.",
		}, []string{"source"}),
		age: &watermarkAge{desc: prometheus.NewDesc("tidemark_poll_watermark_age_seconds",
			"Service time minus the poll source's high watermark: how far the mirror may be behind the source. It also grows while the source is quiet.",
			[]string{"source"}, nil), at: map[string]time.Time{}},
	}
	if reg != nil {
		m.read = promreg.Shared(reg, m.read)
		m.merged = promreg.Shared(reg, m.merged)
		m.runs = promreg.Shared(reg, m.runs)
		m.seconds = promreg.Shared(reg, m.seconds)
		m.watermark = promreg.Shared(reg, m.watermark)
		m.window = promreg.Shared(reg, m.window)
		m.lastSuccess = promreg.Shared(reg, m.lastSuccess)
		m.age = promreg.Shared(reg, m.age)
	}
	return m
}

// register makes the series of source appear before its first run.
func (m *pollMetrics) register(source string, now func() time.Time) {
	m.read.WithLabelValues(source)
	for _, op := range []string{"insert", "update", "delete"} {
		m.merged.WithLabelValues(source, op)
	}
	for _, r := range []string{"ok", "error"} {
		m.runs.WithLabelValues(source, r)
	}
	m.age.mu.Lock()
	m.age.now = now
	m.age.mu.Unlock()
}

func (m *pollMetrics) observe(source string, rep Report, err error, took time.Duration, now time.Time) {
	if err != nil {
		m.runs.WithLabelValues(source, "error").Inc()
		return
	}
	m.runs.WithLabelValues(source, "ok").Inc()
	m.seconds.WithLabelValues(source).Observe(took.Seconds())
	m.read.WithLabelValues(source).Add(float64(rep.Read))
	m.merged.WithLabelValues(source, "insert").Add(float64(rep.Inserted))
	m.merged.WithLabelValues(source, "update").Add(float64(rep.Updated))
	m.merged.WithLabelValues(source, "delete").Add(float64(rep.Deleted))
	m.lastSuccess.WithLabelValues(source).Set(float64(now.UnixMicro()) / 1e6)
	if !rep.Watermark.IsZero() {
		m.watermark.WithLabelValues(source).Set(float64(rep.Watermark.UnixMicro()) / 1e6)
		m.age.set(source, rep.Watermark)
	}
	if !rep.Low.IsZero() {
		m.window.WithLabelValues(source).Set(rep.Upper.Sub(rep.Low).Seconds())
	}
}

// watermarkAge reports service time minus each source's watermark at
// scrape time.
type watermarkAge struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	now  func() time.Time
	at   map[string]time.Time
}

func (w *watermarkAge) set(source string, wm time.Time) {
	w.mu.Lock()
	w.at[source] = wm
	w.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (w *watermarkAge) Describe(ch chan<- *prometheus.Desc) { ch <- w.desc }

// Collect implements prometheus.Collector.
func (w *watermarkAge) Collect(ch chan<- prometheus.Metric) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now
	if w.now != nil {
		now = w.now
	}
	for s, wm := range w.at {
		ch <- prometheus.MustNewConstMetric(w.desc, prometheus.GaugeValue, now().Sub(wm).Seconds(), s)
	}
}
