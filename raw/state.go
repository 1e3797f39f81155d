package raw

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/config"
)

// Querier is the part of a pgx connection or pool that reads.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PartitionState is what the warehouse holds for one Kafka partition.
type PartitionState struct {
	Source       string
	Topic        string
	Partition    int32
	NextOffset   int64 // -1: nothing stored yet
	MaxEventTime *time.Time
	LastEventAt  *time.Time // service time of the last good event
	Records      int64
	RowsWritten  int64
	Duplicates   int64
	DeadLetters  int64
	UpdatedAt    time.Time
}

const partitionStatesSQL = `
SELECT source, topic, partition, next_offset, max_event_time, last_event_at,
       records, rows_written, duplicates, dead_letters, updated_at
FROM tidemark.kafka_offsets
WHERE consumer_group = $1
ORDER BY source, topic, partition`

// PartitionStates reads the stored state of every partition of the group.
func PartitionStates(ctx context.Context, q Querier, group string) ([]PartitionState, error) {
	rows, err := q.Query(ctx, partitionStatesSQL, group)
	if err != nil {
		return nil, fmt.Errorf("read kafka_offsets: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionState, error) {
		var s PartitionState
		err := r.Scan(&s.Source, &s.Topic, &s.Partition, &s.NextOffset, &s.MaxEventTime, &s.LastEventAt,
			&s.Records, &s.RowsWritten, &s.Duplicates, &s.DeadLetters, &s.UpdatedAt)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read kafka_offsets: %w", err)
	}
	return out, nil
}

// EventTimeWatermark computes a source's event-time watermark from its
// partitions: the smallest of their largest event times, ignoring
// partitions idle for longer than the idle timeout (all of them, when all
// are idle), minus the allowed out-of-orderness. ok is false while no
// partition has seen an event.
func EventTimeWatermark(src *config.Source, parts []PartitionState, now time.Time) (wm time.Time, ok bool) {
	var active, all time.Time
	var haveActive, haveAll bool
	for _, p := range parts {
		if p.Source != src.Name || p.MaxEventTime == nil {
			continue
		}
		t := *p.MaxEventTime
		if !haveAll || t.After(all) {
			all, haveAll = t, true
		}
		idle := p.LastEventAt == nil || now.Sub(*p.LastEventAt) > src.Watermark.IdleTimeout.Duration()
		if !idle && (!haveActive || t.Before(active)) {
			active, haveActive = t, true
		}
	}
	switch {
	case haveActive:
		return active.Add(-src.Watermark.OutOfOrderness.Duration()), true
	case haveAll:
		return all.Add(-src.Watermark.OutOfOrderness.Duration()), true
	}
	return time.Time{}, false
}

// WatermarkCollector exports each Kafka source's event-time watermark,
// read from the warehouse at scrape time so that every instance reports
// the group's value, not only its own partitions'.
type WatermarkCollector struct {
	cfg  *config.Config
	q    Querier
	now  func() time.Time
	desc *prometheus.Desc
}

// NewWatermarkCollector returns the collector; now is the service clock.
func NewWatermarkCollector(cfg *config.Config, q Querier, now func() time.Time) *WatermarkCollector {
	return &WatermarkCollector{cfg: cfg, q: q, now: now, desc: prometheus.NewDesc(
		"tidemark_source_event_time_watermark_seconds",
		"Event-time watermark per source as a unix time: events older than this are late.",
		[]string{"source"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *WatermarkCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *WatermarkCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	parts, err := PartitionStates(ctx, c.q, c.cfg.Kafka.Group)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	now := c.now()
	for _, name := range c.cfg.SourceNames() {
		src := c.cfg.Sources[name]
		if !src.Kind().Kafka() {
			// Stored by the reconciler as it reads a table source, and by
			// each run of a poll source.
			c.collectStored(ctx, ch, name)
			continue
		}
		if wm, ok := EventTimeWatermark(src, parts, now); ok {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(wm.UnixMicro())/1e6, name)
		}
	}
}

const storedWatermarkSQL = `SELECT event_time_watermark FROM tidemark.source_watermarks WHERE source = $1 AND event_time_watermark IS NOT NULL`

func (c *WatermarkCollector) collectStored(ctx context.Context, ch chan<- prometheus.Metric, source string) {
	rows, err := c.q.Query(ctx, storedWatermarkSQL, source)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var wm time.Time
		if err := rows.Scan(&wm); err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(wm.UnixMicro())/1e6, source)
	}
}
