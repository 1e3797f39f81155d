package kafka

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/promreg"
)

// metrics are the ingester's Prometheus series.
type metrics struct {
	consumed      *prometheus.CounterVec
	written       *prometheus.CounterVec
	duplicates    *prometheus.CounterVec
	duplicateIDs  *prometheus.CounterVec
	deadLetters   *prometheus.CounterVec
	skipped       *prometheus.CounterVec
	batchRows     prometheus.Histogram
	commitSeconds prometheus.Histogram
	writeErrors   *prometheus.CounterVec
	conflicts     prometheus.Counter
	kafkaCommits  *prometheus.CounterVec
	lag           *prometheus.GaugeVec
	assigned      prometheus.Gauge
	stalled       *prometheus.GaugeVec
	topicPaused   *prometheus.GaugeVec
	offsetResets  *prometheus.CounterVec

	registryErrors *prometheus.CounterVec
	registryCache  prometheus.Gauge
}

// newMetrics returns the ingester's series, registered with reg (shared
// with an ingester that registered them before); nil registers them
// nowhere.
func newMetrics(reg prometheus.Registerer, sources []string) *metrics {
	m := &metrics{
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_records_consumed_total",
			Help: "Kafka records read, good or bad, per source.",
		}, []string{"source"}),
		written: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_rows_written_total",
			Help: "Rows committed to raw tables per source.",
		}, []string{"source"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_duplicates_total",
			Help: "Good records dropped because their (event_id, event_time) was already stored, or came earlier in the batch, or their id did (dedupe.by: event_id).",
		}, []string{"source"}),
		duplicateIDs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_duplicate_ids_total",
			Help: "Good records of sources with dedupe.by: event_id dropped because their id was loaded within the window or came earlier in the batch; counted among the duplicates too.",
		}, []string{"source"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_dead_letters_total",
			Help: "Records written to tidemark.dead_letters per source and reason.",
		}, []string{"source", "reason"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_records_skipped_total",
			Help: "Records with nothing to load, neither stored nor dead letters, per source and reason (tombstone: a Debezium tombstone).",
		}, []string{"source", "reason"}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tidemark_ingest_batch_records",
			Help:    "Records per committed warehouse transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tidemark_ingest_commit_seconds",
			Help:    "Duration of successful batch writes, from creating any missing raw partitions to the commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}),
		writeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_write_errors_total",
			Help: "Failed batch transaction attempts by kind (retry: transient, retried with backoff; bad_row: retried checking the source's rows one by one; partition: raw partition recreated; concurrent: an event was stored by another ingester meanwhile, retried at once; stalled: the warehouse refused one source's part, retried at once without it).",
		}, []string{"kind"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tidemark_ingest_offset_conflicts_total",
			Help: "Partitions whose batch was dropped because another group member had already stored them (fencing).",
		}),
		kafkaCommits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_kafka_commits_total",
			Help: "Offset commits to Kafka after warehouse commits, by result. Kafka offsets are informational; the warehouse holds the truth.",
		}, []string{"result"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_ingest_consumer_lag_records",
			Help: "High watermark minus the next offset stored in the warehouse, per assigned partition, updated on every fetch and commit.",
		}, []string{"topic", "partition"}),
		assigned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tidemark_ingest_assigned_partitions",
			Help: "Kafka partitions currently assigned to this ingester.",
		}),
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_ingest_source_stalled",
			Help: "1 while the warehouse refuses a source's writes: its partitions wait, tried again after a backoff, while the other sources go on; 0 otherwise.",
		}, []string{"source"}),
		topicPaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_ingest_topic_paused",
			Help: "1 while this ingester does not fetch the topic because an operator paused its source (tidemark pause); 0 otherwise.",
		}, []string{"source", "topic"}),
		offsetResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_ingest_offset_resets_total",
			Help: "Partitions whose stored position was beyond the end of the broker's log (the topic recreated, or records lost at the broker), read again from kafka.start_offset or where the client resumed, per source.",
		}, []string{"source"}),
		registryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_schema_registry_errors_total",
			Help: "Attempts to get a schema that the schema registry could not answer (unreachable, timed out, an error status, refused credentials, an answer that is not a schema), per source; the records waiting for the schema are read again after a backoff.",
		}, []string{"source"}),
		registryCache: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tidemark_schema_registry_cached_schemas",
			Help: "Compiled schemas held by the schema registry cache.",
		}),
	}
	if reg != nil {
		m.registryErrors = promreg.Shared(reg, m.registryErrors)
		m.registryCache = promreg.Shared(reg, m.registryCache)
		m.consumed = promreg.Shared(reg, m.consumed)
		m.written = promreg.Shared(reg, m.written)
		m.duplicates = promreg.Shared(reg, m.duplicates)
		m.duplicateIDs = promreg.Shared(reg, m.duplicateIDs)
		m.deadLetters = promreg.Shared(reg, m.deadLetters)
		m.skipped = promreg.Shared(reg, m.skipped)
		m.batchRows = promreg.Shared(reg, m.batchRows)
		m.commitSeconds = promreg.Shared(reg, m.commitSeconds)
		m.writeErrors = promreg.Shared(reg, m.writeErrors)
		m.conflicts = promreg.Shared(reg, m.conflicts)
		m.kafkaCommits = promreg.Shared(reg, m.kafkaCommits)
		m.lag = promreg.Shared(reg, m.lag)
		m.assigned = promreg.Shared(reg, m.assigned)
		m.stalled = promreg.Shared(reg, m.stalled)
		m.topicPaused = promreg.Shared(reg, m.topicPaused)
		m.offsetResets = promreg.Shared(reg, m.offsetResets)
	}
	for _, s := range sources {
		m.consumed.WithLabelValues(s)
		m.written.WithLabelValues(s)
		m.duplicates.WithLabelValues(s)
		m.duplicateIDs.WithLabelValues(s)
		m.registryErrors.WithLabelValues(s)
		m.stalled.WithLabelValues(s)
		m.offsetResets.WithLabelValues(s)
		for _, r := range decode.Reasons {
			m.deadLetters.WithLabelValues(s, r)
		}
	}
	for _, k := range []string{"retry", "bad_row", "partition", "concurrent", "stalled"} {
		m.writeErrors.WithLabelValues(k)
	}
	for _, r := range []string{"ok", "error"} {
		m.kafkaCommits.WithLabelValues(r)
	}
	return m
}

func partLabel(p int32) string { return strconv.FormatInt(int64(p), 10) }
