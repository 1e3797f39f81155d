package cdc

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tidemark-dev/tidemark/internal/promreg"
)

// metrics are the Prometheus series of one CDC source.
type metrics struct {
	changes   *prometheus.CounterVec
	mirrored  *prometheus.CounterVec
	txns      prometheus.Counter
	applyLag  prometheus.Observer
	applied   prometheus.Gauge
	confirmed prometheus.Gauge
	slotLag   prometheus.Gauge
	walStatus *prometheus.GaugeVec
	streaming prometheus.Gauge

	snapshotPlanned prometheus.Gauge
	snapshotCopied  prometheus.Gauge
	snapshotRows    prometheus.Counter
	resyncRows      prometheus.Counter
	// resyncCopied and resyncPlanned are the progress of the resync this
	// instance copies, by table.
	resyncCopied  *prometheus.GaugeVec
	resyncPlanned *prometheus.GaugeVec
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// slotVecs returns new vectors of the slot series.
func slotVecs() (slotLag, walStatus, streaming *prometheus.GaugeVec) {
	slotLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_slot_lag_bytes",
		Help: "pg_current_wal_lsn() minus the slot's confirmed_flush_lsn on the source: WAL the slot keeps, as of the last status update.",
	}, []string{"source"})
	walStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_slot_wal_status",
		Help: "1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others.",
	}, []string{"source", "status"})
	streaming = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_streaming",
		Help: "1 while this process holds the slot's lock and streams from it, 0 otherwise; the slot series are those of the last status update.",
	}, []string{"source"})
	return slotLag, walStatus, streaming
}

// sharedSlotVecs returns the slot vectors registered with reg, registering
// them first if no reader has.
func sharedSlotVecs(reg prometheus.Registerer) (slotLag, walStatus, streaming *prometheus.GaugeVec) {
	slotLag, walStatus, streaming = slotVecs()
	return promreg.Shared(reg, slotLag), promreg.Shared(reg, walStatus), promreg.Shared(reg, streaming)
}

// SlotReading is a CDC source's replication slot as a reader of this
// process last read it.
type SlotReading struct {
	// LagBytes is the WAL the slot keeps on the source.
	LagBytes float64
	// WALStatus is the slot's wal_status: reserved, extended, unreserved
	// or lost.
	WALStatus string
	// Streaming says that the reader holds the slot and streams from it.
	Streaming bool
}

// SlotReadings returns, per source, the slot reading that this process's CDC
// readers registered with reg last exported; a source whose reader never
// read its slot's status (another instance streams) is absent. It reads
// only the slot series, not the whole registry.
func SlotReadings(reg prometheus.Registerer) map[string]SlotReading {
	slotLag, walStatus, streaming := sharedSlotVecs(reg)
	out := map[string]SlotReading{}
	each(slotLag, func(l map[string]string, v float64) {
		s := out[l["source"]]
		s.LagBytes = v
		out[l["source"]] = s
	})
	each(walStatus, func(l map[string]string, v float64) {
		if v == 1 {
			s := out[l["source"]]
			s.WALStatus = l["status"]
			out[l["source"]] = s
		}
	})
	each(streaming, func(l map[string]string, v float64) {
		s := out[l["source"]]
		s.Streaming = v == 1
		out[l["source"]] = s
	})
	for src, s := range out {
		if s.WALStatus == "" && !s.Streaming {
			delete(out, src)
		}
	}
	return out
}

// each calls f with the labels and value of every series of the gauge
// vector v.
func each(v *prometheus.GaugeVec, f func(labels map[string]string, value float64)) {
	ch := make(chan prometheus.Metric, 16)
	go func() {
		v.Collect(ch)
		close(ch)
	}()
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		f(labels, pb.GetGauge().GetValue())
	}
}

func newMetrics(reg prometheus.Registerer, source string) *metrics {
	changes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tidemark_cdc_changes_applied_total",
		Help: "Row changes written to the warehouse (raw change rows), by operation; counted when their group commits.",
	}, []string{"source", "op"})
	mirrored := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tidemark_cdc_mirror_rows_total",
		Help: "Mirror rows written, by how: copied (keys a chunk inserted, COPYed straight into the mirror), merged (other upserts, staged and merged), deleted (staged deletes, flagged or removed), after a chunk's changes to each key are folded into one. Counted when their group commits.",
	}, []string{"source", "how"})
	txns := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tidemark_cdc_transactions_total",
		Help: "Source transactions applied.",
	}, []string{"source"})
	lag := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "tidemark_cdc_apply_lag_seconds",
		Help:    "Time from the source commit of a group's last transaction to the warehouse commit of the group.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 18), // 5ms to about 11 minutes
	}, []string{"source"})
	applied := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_applied_lsn",
		Help: "End LSN of the last source transaction committed to the warehouse, as a number.",
	}, []string{"source"})
	confirmed := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_confirmed_lsn",
		Help: "LSN last confirmed to the replication slot, as a number.",
	}, []string{"source"})
	slotLag, walStatus, streaming := slotVecs()
	planned := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_snapshot_chunks_planned",
		Help: "Key-range chunks of the initial snapshot in progress or last taken.",
	}, []string{"source"})
	copied := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_snapshot_chunks_copied",
		Help: "Chunks of the initial snapshot committed to the warehouse.",
	}, []string{"source"})
	resyncRows := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tidemark_cdc_resync_rows_total",
		Help: "Rows read by resyncs (tidemark resync, tables added to a running source), per source.",
	}, []string{"source"})
	resyncCopied := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_resync_rows_copied",
		Help: "Rows the resync under way has copied into the mirror (tidemark.cdc_resyncs.rows_copied), for the table this instance copies; absent when it copies none.",
	}, []string{"source", "table"})
	resyncPlanned := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_cdc_resync_rows_planned",
		Help: "The source's estimate of the rows of the table the resync under way copies (pg_class.reltuples when it began); absent when it copies none or the source has no estimate.",
	}, []string{"source", "table"})
	snapRows := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tidemark_cdc_snapshot_rows_total",
		Help: "Rows copied into mirrors by initial snapshots.",
	}, []string{"source"})
	if reg != nil {
		slotLag, walStatus, streaming = sharedSlotVecs(reg)
		planned = promreg.Shared(reg, planned)
		copied = promreg.Shared(reg, copied)
		snapRows = promreg.Shared(reg, snapRows)
		resyncRows = promreg.Shared(reg, resyncRows)
		resyncCopied = promreg.Shared(reg, resyncCopied)
		resyncPlanned = promreg.Shared(reg, resyncPlanned)
		changes = promreg.Shared(reg, changes)
		mirrored = promreg.Shared(reg, mirrored)
		txns = promreg.Shared(reg, txns)
		lag = promreg.Shared(reg, lag)
		applied = promreg.Shared(reg, applied)
		confirmed = promreg.Shared(reg, confirmed)
	}
	for _, op := range []string{opInsert, opUpdate, opDelete, opTruncate, opSnapshot} {
		changes.WithLabelValues(source, op)
	}
	for _, how := range []string{"copied", "merged", "deleted"} {
		mirrored.WithLabelValues(source, how)
	}
	return &metrics{
		changes:   changes.MustCurryWith(prometheus.Labels{"source": source}),
		mirrored:  mirrored.MustCurryWith(prometheus.Labels{"source": source}),
		txns:      txns.WithLabelValues(source),
		applyLag:  lag.WithLabelValues(source),
		applied:   applied.WithLabelValues(source),
		confirmed: confirmed.WithLabelValues(source),
		slotLag:   slotLag.WithLabelValues(source),
		walStatus: walStatus.MustCurryWith(prometheus.Labels{"source": source}),
		streaming: streaming.WithLabelValues(source),

		snapshotPlanned: planned.WithLabelValues(source),
		snapshotCopied:  copied.WithLabelValues(source),
		snapshotRows:    snapRows.WithLabelValues(source),
		resyncRows:      resyncRows.WithLabelValues(source),
		resyncCopied:    resyncCopied.MustCurryWith(prometheus.Labels{"source": source}),
		resyncPlanned:   resyncPlanned.MustCurryWith(prometheus.Labels{"source": source}),
	}
}

// resyncEnded removes the progress series of the resync of table: this
// instance no longer copies it.
func (m *metrics) resyncEnded(table string) {
	m.resyncCopied.DeleteLabelValues(table)
	m.resyncPlanned.DeleteLabelValues(table)
}
