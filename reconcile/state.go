package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/ingest"
)

const (
	readSourceWatermarkSQL = `SELECT event_time_watermark FROM tidemark.source_watermarks WHERE source = $1`

	storeSourceWatermarkSQL = `
INSERT INTO tidemark.source_watermarks AS w (source, event_time_watermark, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (source) DO UPDATE SET
    event_time_watermark = greatest(w.event_time_watermark, EXCLUDED.event_time_watermark),
    updated_at = EXCLUDED.updated_at`

	// partitionStatesSQL moves partitions through open -> closed -> final:
	// closed once the source's event-time watermark passes their end,
	// final once the service clock passes their end plus the horizon.
	partitionStatesSQL = `
UPDATE tidemark.partitions SET
    state = CASE WHEN $2 >= final_at THEN 'final'
                 WHEN $3::timestamptz IS NOT NULL AND $3 >= partition_end THEN 'closed'
                 ELSE 'open' END,
    completeness = CASE WHEN $2 >= final_at THEN 1 ELSE completeness END,
    updated_at = $2
WHERE aggregate = $1 AND state NOT IN ('final', 'archived')`

	// completenessSQL estimates, for each partition that is not final, the
	// share of its eventual rows already loaded: for each of the latest
	// final partitions, the share of its rows that had arrived at the same
	// age (time since the partition's end), averaged.
	completenessSQL = `
WITH finals AS (
    SELECT partition_start FROM tidemark.partitions
    WHERE aggregate = $1 AND state IN ('final', 'archived')
    ORDER BY partition_start DESC LIMIT $3
), totals AS (
    SELECT a.partition_start, sum(a.rows)::float8 AS total
    FROM tidemark.partition_arrivals a JOIN finals f USING (partition_start)
    WHERE a.aggregate = $1
    GROUP BY 1 HAVING sum(a.rows) > 0
), current AS (
    SELECT partition_start, extract(epoch FROM $2::timestamptz - partition_end) AS age
    FROM tidemark.partitions WHERE aggregate = $1 AND state NOT IN ('final', 'archived')
), estimates AS (
    SELECT c.partition_start,
           avg(coalesce((SELECT sum(a.rows) FROM tidemark.partition_arrivals a
                         WHERE a.aggregate = $1 AND a.partition_start = t.partition_start AND a.age_seconds <= c.age), 0)
               / t.total) AS estimate
    FROM current c CROSS JOIN totals t
    GROUP BY 1
)
UPDATE tidemark.partitions p SET completeness = e.estimate
FROM estimates e
WHERE p.aggregate = $1 AND p.partition_start = e.partition_start`

	openPartitionsSQL = `
SELECT partition_key, completeness FROM tidemark.partitions WHERE aggregate = $1 AND state NOT IN ('final', 'archived')`
)

// HistoryPartitions is how many recent final partitions the completeness
// estimate learns from; retention keeps their arrival histories.
func HistoryPartitions(by string) int {
	switch by {
	case aggregate.Hour:
		return 24
	case aggregate.Month:
		return 3
	}
	return 7
}

// SourceWatermark computes the event-time watermark of the aggregate's
// source: for Kafka sources from the stored per-partition event times (see
// ingest.EventTimeWatermark); for other sources the largest event time
// read so far minus the allowed out-of-orderness (for a poll source, minus
// its lookback when that is larger).
func (r *Reconciler) sourceWatermark(ctx context.Context, conn *pgx.Conn, d *aggregate.Definition, w *window, now time.Time) (pgtype.Timestamptz, error) {
	src := r.cfg.Sources[d.Source]
	if src.Kafka != nil {
		parts, err := ingest.PartitionStates(ctx, conn, r.cfg.Kafka.Group)
		if err != nil {
			return pgtype.Timestamptz{}, err
		}
		wm, ok := ingest.EventTimeWatermark(src, parts, now)
		return pgtype.Timestamptz{Time: wm, Valid: ok}, nil
	}
	var stored pgtype.Timestamptz
	if err := conn.QueryRow(ctx, readSourceWatermarkSQL, d.Source).Scan(&stored); err != nil && err != pgx.ErrNoRows {
		return pgtype.Timestamptz{}, err
	}
	holdBack := src.Watermark.OutOfOrderness.D()
	if src.Poll != nil {
		// As the poller computes it: rows found through the lookback are
		// up to that much older than the newest one read.
		holdBack = max(holdBack, src.Poll.Lookback.D())
	}
	if !w.maxEvent.IsZero() {
		if c := w.maxEvent.Add(-holdBack); !stored.Valid || c.After(stored.Time) {
			stored = pgtype.Timestamptz{Time: c, Valid: true}
		}
	}
	return stored, nil
}

// updateStates stores the source's event-time watermark, moves the
// aggregate's partitions through their states and refreshes completeness.
func (r *Reconciler) updateStates(ctx context.Context, conn *pgx.Conn, d *aggregate.Definition, w *window) error {
	now := r.now()
	wm, err := r.sourceWatermark(ctx, conn, d, w, now)
	if err != nil {
		return fmt.Errorf("reconcile %s: event-time watermark: %w", d.Name, err)
	}
	if wm.Valid {
		if _, err := conn.Exec(ctx, storeSourceWatermarkSQL, d.Source, wm, now); err != nil {
			return fmt.Errorf("reconcile %s: store event-time watermark: %w", d.Name, err)
		}
	}
	if _, err := conn.Exec(ctx, partitionStatesSQL, d.Name, now, wm); err != nil {
		return fmt.Errorf("reconcile %s: partition states: %w", d.Name, err)
	}
	if _, err := conn.Exec(ctx, completenessSQL, d.Name, now, HistoryPartitions(d.Calendar.By)); err != nil {
		return fmt.Errorf("reconcile %s: completeness: %w", d.Name, err)
	}
	rows, err := conn.Query(ctx, openPartitionsSQL, d.Name)
	if err != nil {
		return fmt.Errorf("reconcile %s: %w", d.Name, err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	for rows.Next() {
		var label string
		var c pgtype.Float8
		if err := rows.Scan(&label, &c); err != nil {
			return fmt.Errorf("reconcile %s: %w", d.Name, err)
		}
		if c.Valid {
			r.m.completeness.WithLabelValues(d.Name, label).Set(c.Float64)
			seen[label] = true
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reconcile %s: %w", d.Name, err)
	}
	for label := range r.exported[d.Name] {
		if !seen[label] {
			r.m.completeness.DeleteLabelValues(d.Name, label)
		}
	}
	r.exported[d.Name] = seen
	return nil
}
