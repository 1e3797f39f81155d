package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/lateness"
	"github.com/tidemark-dev/tidemark/raw"
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

	// notFinalSQL lists the partitions that are not final, with their
	// age (service time since their end).
	notFinalSQL = `
SELECT partition_start, extract(epoch FROM $2::timestamptz - partition_end)::float8
FROM tidemark.partitions WHERE aggregate = $1 AND state NOT IN ('final', 'archived')`

	// storeCompletenessSQL stores the estimates of partitions.
	storeCompletenessSQL = `
UPDATE tidemark.partitions p SET completeness = u.c
FROM unnest($2::timestamptz[], $3::float8[]) AS u (s, c)
WHERE p.aggregate = $1 AND p.partition_start = u.s`

	openPartitionsSQL = `
SELECT partition_key, completeness FROM tidemark.partitions WHERE aggregate = $1 AND state NOT IN ('final', 'archived')`
)

// SourceWatermark computes the event-time watermark of the aggregate's
// source: for Kafka sources from the stored per-partition event times (see
// raw.EventTimeWatermark); for other sources the largest event time
// read so far minus the allowed out-of-orderness (for a poll source, minus
// its lookback when that is larger).
func (r *Reconciler) sourceWatermark(ctx context.Context, conn *pgx.Conn, d *aggregate.Definition, w *window, now time.Time) (pgtype.Timestamptz, error) {
	src := r.cfg.Sources[d.Source]
	if src.Kind().Kafka() {
		parts, err := raw.PartitionStates(ctx, conn, r.cfg.Kafka.Group)
		if err != nil {
			return pgtype.Timestamptz{}, err
		}
		wm, ok := raw.EventTimeWatermark(src, parts, now)
		return pgtype.Timestamptz{Time: wm, Valid: ok}, nil
	}
	var stored pgtype.Timestamptz
	if err := conn.QueryRow(ctx, readSourceWatermarkSQL, d.Source).Scan(&stored); err != nil && err != pgx.ErrNoRows {
		return pgtype.Timestamptz{}, err
	}
	holdBack := src.Watermark.OutOfOrderness.Duration()
	if src.Kind() == config.KindPoll {
		// As the poller computes it: rows found through the lookback are
		// up to that much older than the newest one read.
		holdBack = max(holdBack, src.Poll.Lookback.Duration())
	}
	if !w.maxEvent.IsZero() {
		if c := w.maxEvent.Add(-holdBack); !stored.Valid || c.After(stored.Time) {
			stored = pgtype.Timestamptz{Time: c, Valid: true}
		}
	}
	return stored, nil
}

// estimate stores the completeness of each partition of d that is not
// final: the share of its eventual rows already loaded, estimated as the
// arrival curve of the latest final partitions (lateness.Curve) read at
// its age. Without a final partition that has an arrival history, there
// is no estimate.
func (r *Reconciler) estimate(ctx context.Context, conn *pgx.Conn, d *aggregate.Definition, now time.Time) error {
	curve, err := lateness.Curve(ctx, conn, d.Name, lateness.HistoryPartitions(d.Calendar.By))
	if errors.Is(err, lateness.ErrNoHistory) {
		return nil
	}
	if err != nil {
		return err
	}
	rows, err := conn.Query(ctx, notFinalSQL, d.Name, now)
	if err != nil {
		return err
	}
	var starts []time.Time
	var estimates []float64
	for rows.Next() {
		var start time.Time
		var age float64
		if err := rows.Scan(&start, &age); err != nil {
			rows.Close()
			return err
		}
		starts, estimates = append(starts, start), append(estimates, curve.At(age))
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(starts) == 0 {
		return err
	}
	_, err = conn.Exec(ctx, storeCompletenessSQL, d.Name, starts, estimates)
	return err
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
	if err := r.estimate(ctx, conn, d, now); err != nil {
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
