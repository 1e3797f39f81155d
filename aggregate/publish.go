package aggregate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// PublishShadow replaces partition p of the aggregate table with the
// partition's rows in the shadow table, as BuildShadow wrote and compared
// them, atomically (inside tx), and records it in tidemark.partitions as a
// rebuild reflecting the loads below xmin, the snapshot the shadow was
// built in. It then removes p from the shadow, so one build is published
// once. The caller queues p again when loads at or above xmin touched it.
// Like Rebuild it takes the partition's lock and refuses an archived
// partition unless opts allow it.
func PublishShadow(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, xmin string, now time.Time, opts ...RebuildOption) (Result, error) {
	if d.columns == nil {
		return Result{}, ErrNotPrepared
	}
	if err := lockPartition(ctx, tx, d, p, rebuildOpts(opts)); err != nil {
		return Result{}, err
	}
	target, shadow, col, key, list := d.Target.Sanitize(), d.ShadowName().Sanitize(), quote(d.Column), p.keyLiteral(), d.columnList()
	var rows int64
	steps := []struct {
		sql  string
		rows *int64
	}{
		{fmt.Sprintf("DELETE FROM %s WHERE %s = %s", target, col, key), nil},
		{fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM %s WHERE %s = %s", target, list, list, shadow, col, key), &rows},
		{fmt.Sprintf("DELETE FROM %s WHERE %s = %s", shadow, col, key), nil},
	}
	for _, s := range steps {
		tag, err := tx.Exec(ctx, s.sql)
		if err != nil {
			return Result{}, fmt.Errorf("publish %s %s: %w", d.Name, p, err)
		}
		if s.rows != nil {
			*s.rows = tag.RowsAffected()
		}
	}
	if _, err := tx.Exec(ctx, upsertPartitionSQL, d.Name, p.Start, p.End, p.Label(), rows, now, xmin, d.HorizonEnd(p)); err != nil {
		return Result{}, fmt.Errorf("publish %s %s: record status: %w", d.Name, p, err)
	}
	return Result{Rows: rows}, nil
}
