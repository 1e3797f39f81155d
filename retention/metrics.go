package retention

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/raw"
)

type metrics struct {
	runs        *prometheus.CounterVec
	rows        *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	partitions  *prometheus.CounterVec
	archived    *prometheus.CounterVec
	busy        *prometheus.CounterVec
	kept        *prometheus.GaugeVec
	lastSuccess prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		runs: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_prune_runs_total",
			Help: "Retention runs by result (ok, error, busy: another process was pruning).",
		}, []string{"result"})),
		rows: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_prune_rows_deleted_total",
			Help: "Rows removed by retention, per table (raw tables: the rows of dropped partitions).",
		}, []string{"table"})),
		bytes: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_prune_deleted_bytes_total",
			Help: "Bytes removed by retention, per table: dropped raw partitions with their indexes, and the row data of deleted rows.",
		}, []string{"table"})),
		partitions: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_prune_partitions_dropped_total",
			Help: "Raw partitions dropped by retention, per source.",
		}, []string{"source"})),
		archived: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_prune_partitions_archived_total",
			Help: "Aggregate partitions archived because raw rows they were built from were dropped.",
		}, []string{"aggregate"})),
		busy: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_prune_lock_timeouts_total",
			Help: "Raw partition drops put off because the raw table stayed locked longer than retention.lock_timeout.",
		}, []string{"source"})),
		kept: promreg.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_prune_kept_partitions",
			Help: "Raw partitions past their retention that the last run kept because something still needs them (see tidemark prune --dry-run).",
		}, []string{"source"})),
		lastSuccess: promreg.Shared(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tidemark_prune_last_success_timestamp_seconds",
			Help: "Service time of the last retention run that completed.",
		})),
	}
	m.runs.WithLabelValues("ok")
	m.runs.WithLabelValues("error")
	m.runs.WithLabelValues("busy")
	return m
}

const (
	// stateSizesSQL measures each table of the tidemark and raw schemas, a
	// partitioned raw table with all its partitions: live rows as the
	// statistics collector counts them, and bytes with indexes and TOAST.
	stateSizesSQL = `
SELECT n.nspname || '.' || c.relname,
       coalesce((SELECT sum(s.n_live_tup) FROM pg_stat_all_tables s
                 WHERE s.relid = c.oid OR s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = c.oid)), 0)::float8,
       (pg_total_relation_size(c.oid)
        + coalesce((SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = c.oid), 0))::float8
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname IN ('tidemark', 'raw') AND c.relkind IN ('r', 'p') AND NOT c.relispartition`

	retainedFromAllSQL = `SELECT source, extract(epoch FROM retained_from)::float8 FROM tidemark.raw_retention`
)

// Collector exports, at scrape time, the size of every state table and
// each source's retention bound.
type Collector struct {
	q         raw.Querier
	rows      *prometheus.Desc
	bytes     *prometheus.Desc
	retention *prometheus.Desc
}

// NewCollector returns the collector reading through q.
func NewCollector(q raw.Querier) *Collector {
	return &Collector{q: q,
		rows: prometheus.NewDesc("tidemark_state_table_rows",
			"Live rows of a table of the tidemark and raw schemas (a raw table with its partitions), as PostgreSQL's statistics estimate them.",
			[]string{"table"}, nil),
		bytes: prometheus.NewDesc("tidemark_state_table_bytes",
			"Disk size of a table of the tidemark and raw schemas with its indexes and TOAST (a raw table with its partitions).",
			[]string{"table"}, nil),
		retention: prometheus.NewDesc("tidemark_raw_retained_from_timestamp_seconds",
			"The source's retention bound: raw rows with an earlier event time have been dropped, and aggregate partitions starting before it are archived.",
			[]string{"source"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rows
	ch <- c.bytes
	ch <- c.retention
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.q.Query(ctx, stateSizesSQL)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.bytes, err)
		return
	}
	for rows.Next() {
		var table string
		var n, size float64
		if err := rows.Scan(&table, &n, &size); err != nil {
			rows.Close()
			ch <- prometheus.NewInvalidMetric(c.bytes, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, n, table)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, size, table)
	}
	rows.Close()
	r, err := c.q.Query(ctx, retainedFromAllSQL)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.retention, err)
		return
	}
	defer r.Close()
	for r.Next() {
		var source string
		var at float64
		if err := r.Scan(&source, &at); err != nil {
			ch <- prometheus.NewInvalidMetric(c.retention, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.retention, prometheus.GaugeValue, at, source)
	}
}
