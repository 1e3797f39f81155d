package mirror

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/internal/promreg"
)

// keyMetrics are the Prometheus series of key reconciliation, shared by
// the KeyReconcilers of one registerer.
type keyMetrics struct {
	source      string
	checked     *prometheus.CounterVec
	transferred *prometheus.CounterVec
	found       *prometheus.CounterVec
	runs        *prometheus.CounterVec
	refused     *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
}

func newKeyMetrics(reg prometheus.Registerer, source string) *keyMetrics {
	m := &keyMetrics{
		source: source,
		checked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_keys_checked_total",
			Help: "Keys covered by successful key reconciliation runs, source and mirror keys together.",
		}, []string{"source"}),
		transferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_keys_transferred_total",
			Help: "Keys read from the source or the warehouse by key reconciliation: range bounds, keys of small differing ranges, lookup results.",
		}, []string{"source"}),
		found: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_deletes_found_total",
			Help: "Mirror keys found missing at the source (after the re-check), dry runs included.",
		}, []string{"source"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_runs_total",
			Help: "Key reconciliation runs by result (ok or error).",
		}, []string{"source", "result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_key_reconcile_refused_total",
			Help: "Key reconciliation runs that found more mirror rows missing at the source than mirror.key_reconcile_max_delete allows and applied nothing (also counted as errors).",
		}, []string{"source"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_key_reconcile_last_success_timestamp_seconds",
			Help: "Service time at which the last successful key reconciliation run finished.",
		}, []string{"source"}),
	}
	if reg != nil {
		m.checked = promreg.Shared(reg, m.checked)
		m.transferred = promreg.Shared(reg, m.transferred)
		m.found = promreg.Shared(reg, m.found)
		m.runs = promreg.Shared(reg, m.runs)
		m.refused = promreg.Shared(reg, m.refused)
		m.lastSuccess = promreg.Shared(reg, m.lastSuccess)
	}
	m.checked.WithLabelValues(source)
	m.transferred.WithLabelValues(source)
	m.found.WithLabelValues(source)
	m.runs.WithLabelValues(source, "ok")
	m.runs.WithLabelValues(source, "error")
	m.refused.WithLabelValues(source)
	return m
}

func (m *keyMetrics) observe(rep KeyReport, err error, now time.Time) {
	m.transferred.WithLabelValues(m.source).Add(float64(rep.KeysTransferred))
	if err != nil {
		m.runs.WithLabelValues(m.source, "error").Inc()
		if errors.Is(err, ErrKeyRefused) {
			m.refused.WithLabelValues(m.source).Inc()
		}
		return
	}
	m.runs.WithLabelValues(m.source, "ok").Inc()
	m.checked.WithLabelValues(m.source).Add(float64(rep.SourceKeys + rep.MirrorKeys))
	m.found.WithLabelValues(m.source).Add(float64(rep.Deleted))
	m.lastSuccess.WithLabelValues(m.source).Set(float64(now.UnixNano()) / 1e9)
}
