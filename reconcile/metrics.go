package reconcile

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/internal/promreg"
)

// Lateness labels of tidemark_reconcile_late_events_total: how long after
// the end of its partition an event was ingested.
var latenessBuckets = []struct {
	label string
	upTo  float64 // seconds; the last bucket has no bound
}{
	{"on_time", 0}, {"under_1h", 3600}, {"under_6h", 6 * 3600}, {"under_24h", 24 * 3600},
	{"under_72h", 72 * 3600}, {"under_7d", 7 * 24 * 3600}, {"over_7d", -1},
}

func latenessLabel(seconds float64) string {
	for _, b := range latenessBuckets {
		if b.upTo < 0 || seconds <= b.upTo {
			return b.label
		}
	}
	return "over_7d"
}

type metrics struct {
	runs          *prometheus.CounterVec
	rebuilt       *prometheus.CounterVec
	rebuildErrors *prometheus.CounterVec
	rebuildSecs   *prometheus.HistogramVec
	queued        *prometheus.GaugeVec
	failing       *prometheus.GaugeVec
	late          *prometheus.CounterVec
	beyond        *prometheus.CounterVec
	completeness  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, aggregates []string, policies map[string]string) *metrics {
	m := &metrics{
		runs: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_reconcile_runs_total",
			Help: "Reconcile runs per aggregate by result (ok, error, busy: another instance held the aggregate and this one only rebuilt queued partitions beside it).",
		}, []string{"aggregate", "result"})),
		rebuilt: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_reconcile_partitions_rebuilt_total",
			Help: "Aggregate partitions rebuilt.",
		}, []string{"aggregate"})),
		rebuildErrors: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_reconcile_rebuild_errors_total",
			Help: "Failed partition rebuilds; the partition stays queued and is tried again after a growing delay.",
		}, []string{"aggregate"})),
		rebuildSecs: promreg.Shared(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tidemark_reconcile_rebuild_seconds",
			Help:    "Duration of successful partition rebuilds, each in its own transaction.",
			Buckets: prometheus.ExponentialBuckets(0.005, 3, 10),
		}, []string{"aggregate"})),
		queued: promreg.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_reconcile_queued_partitions",
			Help: "Partitions claimed for rebuilding and not yet rebuilt, after the last run.",
		}, []string{"aggregate"})),
		failing: promreg.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_reconcile_failing_partitions",
			Help: "Queued partitions whose last rebuild failed, after the last run; they are tried again with a growing delay.",
		}, []string{"aggregate"})),
		late: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_reconcile_late_events_total",
			Help: "Events read by the reconciler by lateness: ingestion time minus the end of the event's partition.",
		}, []string{"aggregate", "lateness"})),
		beyond: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_reconcile_beyond_horizon_events_total",
			Help: "Events ingested after their partition's lateness horizon, by the aggregate's policy.",
		}, []string{"aggregate", "policy"})),
		completeness: promreg.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_partition_completeness_ratio",
			Help: "Estimated share of a partition's eventual rows already loaded, for partitions that are not final.",
		}, []string{"aggregate", "partition"})),
	}
	for _, a := range aggregates {
		for _, r := range []string{"ok", "error", "busy"} {
			m.runs.WithLabelValues(a, r)
		}
		m.rebuilt.WithLabelValues(a)
		m.rebuildErrors.WithLabelValues(a)
		m.queued.WithLabelValues(a)
		m.failing.WithLabelValues(a)
		for _, b := range latenessBuckets {
			m.late.WithLabelValues(a, b.label)
		}
		m.beyond.WithLabelValues(a, policies[a])
	}
	return m
}
