package aggregate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrArchived means a partition is archived: retention dropped raw rows it
// was built from, so its published rows are the only copy and a rebuild
// from what is left would lose them.
var ErrArchived = errors.New("the partition is archived: retention dropped raw rows it was built from")

// RetentionLockKey names the advisory lock that orders rebuilds and the
// dropping of a source's raw partitions: a rebuild holds it shared from
// its check of the retention bound to its commit, and retention holds it
// exclusively while it drops a partition and raises the bound.
func RetentionLockKey(source string) string { return "tidemark.retention." + source }

const (
	retainedFromSQL = `SELECT retained_from FROM tidemark.raw_retention WHERE source = $1`
	shareRetention  = `SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))`
)

// Row reads one row: a connection, a pool or a transaction.
type Row interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// RetainedFrom is the source's retention bound: raw rows with an event
// time before it have been dropped. It is the zero time while retention
// has dropped nothing.
func RetainedFrom(ctx context.Context, q Row, source string) (time.Time, error) {
	var t time.Time
	err := q.QueryRow(ctx, retainedFromSQL, source).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("read the retention bound of source %s: %w", source, err)
	}
	return t, nil
}

// ArchivedBefore reports whether partition p lies before the retention
// bound retainedFrom, which makes it archived: some of its raw rows are
// gone.
func ArchivedBefore(p Partition, retainedFrom time.Time) bool {
	return !retainedFrom.IsZero() && p.Start.Before(retainedFrom)
}

// retained refuses an archived partition with ErrArchived, unless allow,
// and reports whether p is archived. It holds the source's retention lock
// shared until tx ends, so the bound it reads cannot rise, nor raw rows
// go, before tx has read them.
func retained(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, allow bool) (bool, error) {
	if _, err := tx.Exec(ctx, shareRetention, RetentionLockKey(d.Source)); err != nil {
		return false, fmt.Errorf("rebuild %s %s: retention lock: %w", d.Name, p, err)
	}
	from, err := RetainedFrom(ctx, tx, d.Source)
	if err != nil {
		return false, fmt.Errorf("rebuild %s %s: %w", d.Name, p, err)
	}
	archived := ArchivedBefore(p, from)
	if !allow && archived {
		return true, fmt.Errorf("rebuild %s %s: %w (raw rows of source %s are kept from %s)", d.Name, p, ErrArchived,
			d.Source, from.UTC().Format(time.RFC3339))
	}
	return archived, nil
}

// RebuildOption changes what Rebuild and BuildShadow allow.
type RebuildOption func(*rebuildOptions)

type rebuildOptions struct {
	allowArchived bool
}

// AllowArchived, when allow is true, lets an archived partition be rebuilt
// from the raw rows that are left (backfill --force). Its published rows
// are then replaced by what those rows give.
func AllowArchived(allow bool) RebuildOption {
	return func(o *rebuildOptions) { o.allowArchived = allow }
}

func rebuildOpts(opts []RebuildOption) rebuildOptions {
	var o rebuildOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}
