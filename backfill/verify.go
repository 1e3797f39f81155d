package backfill

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/raw"
)

// Check is the outcome of verifying one partition: the published rows
// against a rebuild's (Missing: rows a rebuild would add; Extra: rows it
// would remove).
type Check struct {
	Partition aggregate.Partition
	aggregate.Comparison
	// Queued says the reconciler has the partition queued for a rebuild,
	// so a difference is expected until it runs.
	Queued bool
	// Unread says loads into the partition have not been read by the
	// reconciler yet, so a difference is expected until it runs.
	Unread bool
	// Archived says the partition is archived: its raw rows are gone, so
	// verify does not compare it (its published rows are the only copy),
	// and a shadow run built it from what is left (--force).
	Archived bool
}

// Drifted reports whether the published rows differ from a rebuild's.
func (c Check) Drifted() bool { return !c.Archived && c.Differs() }

// Unexpected reports a drift that no pending work of the reconciler
// explains: the published rows are wrong.
func (c Check) Unexpected() bool { return c.Drifted() && !c.Queued && !c.Unread }

const (
	// publishedSQL lists the partitions that have been built.
	publishedSQL = `SELECT partition_start FROM tidemark.partitions WHERE aggregate = $1 ORDER BY partition_start`
	queuedSQL    = `SELECT EXISTS (SELECT FROM tidemark.pending_partitions WHERE aggregate = $1 AND partition_start = $2)`

	// loadWatermarkSQL is how far the reconciler has read the ledger for
	// an aggregate ("0" before its first run).
	loadWatermarkSQL = `SELECT coalesce((SELECT load_xid::text FROM tidemark.load_watermarks WHERE aggregate = $1), '0')`
)

// Verify compares each partition of the range (every built partition when
// r is nil) with what a rebuild would write now, each in its own
// transaction that is rolled back. Loads the reconciler has not read yet
// show up as differences too, marked Unread (or Queued once it has read
// them); archived partitions are not compared. d must be prepared.
func Verify(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, r *Range) ([]Check, error) {
	var parts []aggregate.Partition
	if r != nil {
		lo, hi := r.bounds(d.Calendar)
		if hi.After(lo) {
			parts = d.Calendar.Overlapping(lo, hi.Add(-time.Nanosecond))
		}
	} else {
		rows, err := pool.Query(ctx, publishedSQL, d.Name)
		if err != nil {
			return nil, fmt.Errorf("verify %s: %w", d.Name, err)
		}
		starts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
		if err != nil {
			return nil, fmt.Errorf("verify %s: %w", d.Name, err)
		}
		for _, s := range starts {
			parts = append(parts, d.Calendar.At(s))
		}
	}
	retained, err := aggregate.RetainedFrom(ctx, pool, d.Source)
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", d.Name, err)
	}
	out := make([]Check, 0, len(parts))
	for _, p := range parts {
		c := Check{Partition: p, Archived: aggregate.ArchivedBefore(p, retained)}
		if c.Archived {
			out = append(out, c)
			continue
		}
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			return out, fmt.Errorf("verify %s: %w", d.Name, err)
		}
		c.Comparison, err = aggregate.Drift(ctx, tx, d, p)
		if err == nil {
			if err = tx.QueryRow(ctx, queuedSQL, d.Name, p.Start).Scan(&c.Queued); err != nil {
				err = fmt.Errorf("verify %s %s: queued: %w", d.Name, p, err)
			} else {
				c.Unread, err = unread(ctx, tx, d, p)
			}
		}
		pgconnect.Rollback(ctx, tx)
		if err != nil {
			return out, err
		}
		if c.Differs() {
			// Retention may have dropped raw rows of p while it was being
			// compared; the comparison then tells nothing.
			if retained, err = aggregate.RetainedFrom(ctx, pool, d.Source); err != nil {
				return out, fmt.Errorf("verify %s: %w", d.Name, err)
			}
			if aggregate.ArchivedBefore(p, retained) {
				c = Check{Partition: p, Archived: true}
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// FullRange is the range of a full refresh: the days from the earliest to
// the latest event time in the aggregate's raw table, in its time zone
// (to the latest ingestion time under the arrival policy, which counts
// late events in the partition they arrived in), from the source's
// retention bound at the earliest. ok is false when the table holds no
// rows from then on.
func FullRange(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition) (r Range, ok bool, err error) {
	var lo, hi, arrived *time.Time
	et, ia := pgquote.Ident(d.EventTime), pgquote.Ident(d.IngestedAt)
	sql := fmt.Sprintf("SELECT min(%s), max(%s), max(%s) FROM %s", et, et, ia, d.Raw.Sanitize())
	if err := pool.QueryRow(ctx, sql).Scan(&lo, &hi, &arrived); err != nil {
		return Range{}, false, fmt.Errorf("refresh %s: range of %s: %w", d.Name, d.Raw.Sanitize(), err)
	}
	if lo == nil || hi == nil {
		return Range{}, false, nil
	}
	if d.Policy == aggregate.Arrival && arrived != nil && arrived.After(*hi) {
		hi = arrived
	}
	// Days before the retention bound are archived: a refresh skips them.
	retained, err := aggregate.RetainedFrom(ctx, pool, d.Source)
	if err != nil {
		return Range{}, false, fmt.Errorf("refresh %s: %w", d.Name, err)
	}
	if lo.Before(retained) {
		lo = &retained
	}
	if hi.Before(*lo) {
		return Range{}, false, nil
	}
	return Range{From: lo.In(d.Calendar.Loc), To: hi.In(d.Calendar.Loc)}, true, nil
}

// recordVerifySQL records one verification.
const recordVerifySQL = `
INSERT INTO tidemark.verify_runs (aggregate, scheduled, started_at, finished_at, partitions, drifted, skipped_queued, skipped_archived, error)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// Tally counts a verification's checks: compared partitions, unexpected
// drifts, drifts that pending work explains, and archived partitions.
func Tally(checks []Check) (compared, drifted, pending, archived int) {
	for _, c := range checks {
		switch {
		case c.Archived:
			archived++
			continue
		case c.Unexpected():
			drifted++
		case c.Drifted():
			pending++
		}
		compared++
	}
	return compared, drifted, pending, archived
}

// RecordVerify records a verification of the aggregate in
// tidemark.verify_runs, with its error if it failed.
func RecordVerify(ctx context.Context, pool *pgxpool.Pool, name string, scheduled bool, started, finished time.Time, checks []Check, verr error) error {
	compared, drifted, pending, archived := Tally(checks)
	var msg *string
	if verr != nil {
		m := verr.Error()
		msg = &m
	}
	if _, err := pool.Exec(ctx, recordVerifySQL, name, scheduled, started, finished, compared, drifted, pending, archived, msg); err != nil {
		return fmt.Errorf("verify %s: record: %w", name, err)
	}
	return nil
}

// unread reports whether the reconciler has yet to read a load into p:
// one at or above the aggregate's load watermark.
func unread(ctx context.Context, tx pgx.Tx, d *aggregate.Definition, p aggregate.Partition) (bool, error) {
	var xid string
	if err := tx.QueryRow(ctx, loadWatermarkSQL, d.Name).Scan(&xid); err != nil {
		return false, fmt.Errorf("verify %s %s: load watermark: %w", d.Name, p, err)
	}
	loaded, err := raw.LoadedSince(ctx, tx, d.Source, p.Start, p.End, xid)
	if err != nil {
		return false, fmt.Errorf("verify %s %s: %w", d.Name, p, err)
	}
	return loaded, nil
}
