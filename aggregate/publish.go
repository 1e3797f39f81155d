package aggregate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// PublishShadow replaces partition p of the aggregate table with the
// partition's rows in the shadow table, as BuildShadow wrote and compared
// them, atomically (inside tx), and records it in tidemark.partitions as a
// rebuild reflecting the loads below watermark, the one BuildShadow
// returned. The shadow keeps its rows. Which build may be published, and
// only once, is the caller's to decide (see backfill); the caller also
// queues p again when loads at or above watermark touched it. Like
// Rebuild it takes the partition's lock and refuses an archived partition
// unless opts allow it.
func PublishShadow(ctx context.Context, tx pgx.Tx, d *Definition, p Partition, watermark string, now time.Time, opts ...RebuildOption) (Result, error) {
	if d.columns == nil {
		return Result{}, ErrNotPrepared
	}
	archived, err := lockPartition(ctx, tx, d, p, rebuildOpts(opts))
	if err != nil {
		return Result{}, err
	}
	target, shadow, col, key, list := d.Target.Sanitize(), d.ShadowName().Sanitize(), pgquote.Ident(d.Column), p.keyLiteral(), d.columnList()
	if _, err := tx.Exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE %s = %s", target, col, key)); err != nil {
		return Result{}, fmt.Errorf("publish %s %s: %w", d.Name, p, err)
	}
	tag, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM %s WHERE %s = %s", target, list, list, shadow, col, key))
	if err != nil {
		return Result{}, fmt.Errorf("publish %s %s: %w", d.Name, p, err)
	}
	rows := tag.RowsAffected()
	recorded, err := recordExcluded(ctx, tx, d, p, now)
	if err != nil {
		return Result{}, err
	}
	if err := recordStatus(ctx, tx, d, p, rows, now, watermark, archived); err != nil {
		return Result{}, fmt.Errorf("publish %s %s: %w", d.Name, p, err)
	}
	return Result{Rows: rows, Recorded: recorded}, nil
}
