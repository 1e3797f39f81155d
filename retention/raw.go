package retention

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/raw"
)

const (
	// rawPartitionsSQL lists the partitions of a raw table with their
	// bounds as PostgreSQL prints them and their size with indexes.
	rawPartitionsSQL = `
SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), pg_total_relation_size(c.oid)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)`

	// queuedSQL finds a queued partition of the aggregates that overlaps
	// [$2, $3).
	queuedSQL = `
SELECT aggregate, partition_start FROM tidemark.pending_partitions
WHERE aggregate = ANY($1) AND partition_start < $3 AND partition_end > $2
ORDER BY aggregate, partition_start LIMIT 1`

	// archiveSQL archives the partitions of the aggregates that start
	// before the new retention bound.
	archiveSQL = `
UPDATE tidemark.partitions SET state = 'archived', archived_at = $3, updated_at = $3
WHERE aggregate = ANY($1) AND partition_start < $2 AND state <> 'archived'
RETURNING aggregate`
	toArchiveSQL = `
SELECT aggregate, count(*) FROM tidemark.partitions
WHERE aggregate = ANY($1) AND partition_start < $2 AND state <> 'archived'
GROUP BY aggregate`

	raiseBoundSQL = `
INSERT INTO tidemark.raw_retention AS r (source, retained_from, partitions_dropped, bytes_dropped, updated_at)
VALUES ($1, $2, 1, $3, $4)
ON CONFLICT (source) DO UPDATE SET
    retained_from = greatest(r.retained_from, EXCLUDED.retained_from),
    partitions_dropped = r.partitions_dropped + 1,
    bytes_dropped = r.bytes_dropped + EXCLUDED.bytes_dropped,
    updated_at = EXCLUDED.updated_at`

	lockRetentionSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
)

// boundRe reads a range partition's bounds as pg_get_expr prints them in a
// session whose time zone is UTC.
var boundRe = regexp.MustCompile(`^FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)$`)

// RawPartitions lists the partitions of the source's raw table, oldest
// first, with their bounds and their size with indexes (Rows is not
// counted). None when the table does not exist.
func RawPartitions(ctx context.Context, q raw.Querier, source string) ([]Partition, error) {
	table := raw.TableIdent(source)
	rows, err := q.Query(ctx, rawPartitionsSQL, table)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", table, err)
	}
	var out []Partition
	var name, bound string
	var size int64
	_, err = pgx.ForEachRow(rows, []any{&name, &bound, &size}, func() error {
		m := boundRe.FindStringSubmatch(bound)
		if m == nil {
			return fmt.Errorf("partition %s has bounds %q, not a range of event times", name, bound)
		}
		p := Partition{Name: name, Bytes: size}
		for i, into := range []*time.Time{&p.Start, &p.End} {
			t, err := time.Parse("2006-01-02 15:04:05-07", m[i+1])
			if err != nil {
				return fmt.Errorf("partition %s: bound %q: %w", name, m[i+1], err)
			}
			*into = t.UTC()
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", table, err)
	}
	sortPartitions(out)
	return out, nil
}

// errKept ends a drop transaction that found the partition still needed.
var errKept = errors.New("kept")

// pruneRaw drops the raw partitions of src that its retention no longer
// keeps, oldest first, and stops at the first one still needed.
func (p *Pruner) pruneRaw(ctx context.Context, conn *pgx.Conn, v view, src *config.Source, now time.Time, dryRun bool, archived map[string]int64) (Source, error) {
	out := Source{Name: src.Name}
	parts, err := RawPartitions(ctx, conn, src.Name)
	if err != nil {
		return out, fmt.Errorf("prune: %w", err)
	}
	aggs := v.names(src.Name)
	cutoff := now.Add(-src.Retention.Raw.Duration())
	kept := 0
	for _, part := range parts {
		if part.End.After(cutoff) {
			break
		}
		if out.Kept != "" {
			kept++
			continue
		}
		why, err := p.needed(ctx, conn, v, src.Name, part, now)
		switch {
		case err != nil:
			return out, err
		case why != "":
		case dryRun:
			err = conn.QueryRow(ctx, measureSQL(part.Name), raw.TableIdent(part.Name)).Scan(&part.Rows, &part.Bytes)
		default:
			why, err = p.drop(ctx, conn, v, src, &part, now, archived)
		}
		if err != nil {
			return out, fmt.Errorf("prune: %s: %w", part.Name, err)
		}
		if why != "" {
			out.Kept = fmt.Sprintf("%s (%s .. %s) is kept: %s", part.Name, day(part.Start), day(part.End), why)
			kept++
			continue
		}
		out.Dropped = append(out.Dropped, part)
	}
	p.m.kept.WithLabelValues(src.Name).Set(float64(kept))
	if dryRun && len(out.Dropped) > 0 {
		rows, err := conn.Query(ctx, toArchiveSQL, aggs, out.Dropped[len(out.Dropped)-1].End)
		if err != nil {
			return out, fmt.Errorf("prune: partitions to archive: %w", err)
		}
		var agg string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&agg, &n}, func() error { archived[agg] += n; return nil }); err != nil {
			return out, fmt.Errorf("prune: partitions to archive: %w", err)
		}
	}
	out.RetainedFrom, err = aggregate.RetainedFrom(ctx, conn, src.Name)
	if err != nil {
		return out, err
	}
	if dryRun && len(out.Dropped) > 0 && out.Dropped[len(out.Dropped)-1].End.After(out.RetainedFrom) {
		out.RetainedFrom = out.Dropped[len(out.Dropped)-1].End
	}
	return out, nil
}

// needed says why raw partition part of source must stay, or "" when it
// may go: an aggregate partition it feeds is not final yet or is queued,
// or an aggregate has not read a load into it. Every aggregate of the
// view counts, configured or only registered.
func (p *Pruner) needed(ctx context.Context, q aggregate.Row, v view, source string, part Partition, now time.Time) (string, error) {
	aggs := v.bySource[source]
	for _, d := range aggs {
		if d.Calendar.Loc == nil {
			continue // registered without a definition: its horizon is not known
		}
		ps := d.Calendar.Overlapping(part.Start, part.End.Add(-time.Nanosecond))
		if last := ps[len(ps)-1]; now.Before(d.HorizonEnd(last)) {
			return fmt.Sprintf("%s partition %s is final only at %s", v.who(d), last, d.HorizonEnd(last).UTC().Format(time.RFC3339)), nil
		}
	}
	if len(aggs) == 0 {
		return "", nil
	}
	var agg string
	var start time.Time
	err := q.QueryRow(ctx, queuedSQL, v.names(source), part.Start, part.End).Scan(&agg, &start)
	switch {
	case err == nil:
		for _, d := range aggs {
			if d.Name == agg {
				agg = v.who(d)
			}
		}
		return fmt.Sprintf("%s has partition starting %s queued for a rebuild", agg, start.UTC().Format(time.RFC3339)), nil
	case !errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("prune: queued partitions: %w", err)
	}
	for _, d := range aggs {
		var xid string
		err := q.QueryRow(ctx, loadWatermarkSQL, d.Name).Scan(&xid)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Sprintf("%s has not run yet", v.who(d)), nil
		case err != nil:
			return "", fmt.Errorf("prune: load watermark of %s: %w", d.Name, err)
		}
		unread, err := raw.LoadedSince(ctx, q, source, part.Start, part.End, xid)
		if err != nil {
			return "", fmt.Errorf("prune: %w", err)
		}
		if unread {
			return fmt.Sprintf("%s has not read every load into it yet", v.who(d)), nil
		}
	}
	return "", nil
}

// drop drops one raw partition in a transaction of its own: under the
// source's retention lock and an exclusive lock on the raw table (both
// waited for at most retention.lock_timeout, so no writer is mid-load),
// it checks again that nothing needs the partition, drops it, archives the
// aggregate partitions it fed and raises the source's retention bound. It
// returns why the partition stays when it cannot go now.
func (p *Pruner) drop(ctx context.Context, conn *pgx.Conn, v view, src *config.Source, part *Partition, now time.Time, archived map[string]int64) (string, error) {
	aggs := v.names(src.Name)
	var why string
	counts := map[string]int64{}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		timeout := fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", p.cfg.Retention.LockTimeout.Duration().Milliseconds())
		steps := []struct {
			sql  string
			args []any
		}{
			{timeout, nil},
			{lockRetentionSQL, []any{aggregate.RetentionLockKey(src.Name)}},
			{"LOCK TABLE " + raw.TableIdent(src.Name) + " IN ACCESS EXCLUSIVE MODE", nil},
		}
		for _, s := range steps {
			if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
				return err
			}
		}
		var err error
		if why, err = p.needed(ctx, tx, v, src.Name, *part, now); err != nil || why != "" {
			return errors.Join(err, errKept)
		}
		name := raw.TableIdent(part.Name)
		if err := tx.QueryRow(ctx, measureSQL(part.Name), name).Scan(&part.Rows, &part.Bytes); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DROP TABLE "+name); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, archiveSQL, aggs, part.End, now)
		if err != nil {
			return err
		}
		var agg string
		if _, err := pgx.ForEachRow(rows, []any{&agg}, func() error { counts[agg]++; return nil }); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, raiseBoundSQL, src.Name, part.End, part.Bytes, now)
		return err
	})
	switch {
	case errors.Is(err, errKept) && why != "":
		return why, nil
	case pgerr.LockNotAvailable(err):
		p.m.busy.WithLabelValues(src.Name).Inc()
		return fmt.Sprintf("the raw table was busy for longer than retention.lock_timeout (%s); tried again at the next run", p.cfg.Retention.LockTimeout), nil
	case err != nil:
		return "", fmt.Errorf("drop: %w", err)
	}
	for agg, n := range counts {
		archived[agg] += n
		p.m.archived.WithLabelValues(agg).Add(float64(n))
	}
	p.m.partitions.WithLabelValues(src.Name).Inc()
	p.m.rows.WithLabelValues("raw." + src.Name).Add(float64(part.Rows))
	p.m.bytes.WithLabelValues("raw." + src.Name).Add(float64(part.Bytes))
	p.log.Info("dropped raw partition", "source", src.Name, "partition", part.Name, "rows", part.Rows, "bytes", part.Bytes,
		"archived", len(counts))
	return "", nil
}

// measureSQL counts the rows of a raw partition and measures it with its
// indexes; $1 is its quoted name.
func measureSQL(name string) string {
	return "SELECT (SELECT count(*) FROM " + raw.TableIdent(name) + "), pg_total_relation_size($1::text::regclass)"
}

func day(t time.Time) string { return t.UTC().Format("2006-01-02") }
