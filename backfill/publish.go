package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/ingest"
)

// ErrNoShadow means a partition has no shadow build that can be
// published: none finished, or it is older than the ledger retention.
var ErrNoShadow = errors.New("no shadow build to publish")

const (
	// shadowBuildSQL finds the latest finished chunk of a shadow run that
	// holds partition [$2, $3): the snapshot it was built in, and when.
	shadowBuildSQL = `
SELECT c.snapshot_xmin::text, c.started_at FROM tidemark.backfill_chunks c
JOIN tidemark.backfill_runs r ON r.id = c.run_id
WHERE r.aggregate = $1 AND r.kind = 'shadow' AND c.status = 'done' AND c.snapshot_xmin IS NOT NULL
  AND c.chunk_start <= $2 AND c.chunk_end >= $3
ORDER BY r.id DESC LIMIT 1`

	// requeueSQL queues partition [$2, $3) again.
	requeueSQL = `
INSERT INTO tidemark.pending_partitions (aggregate, partition_start, partition_end, reason, queued_at)
VALUES ($1, $2, $3, 'published', $4)
ON CONFLICT (aggregate, partition_start) DO NOTHING`
)

// publish swaps in partition p as the latest shadow run built it (see
// aggregate.PublishShadow), in tx, and queues p for the reconciler when
// data arrived after the shadow was built, which the shadow lacks: what
// was compared is exactly what is published, and the next reconcile run
// adds what came since.
func publish(ctx context.Context, tx pgx.Tx, d *aggregate.Definition, p aggregate.Partition, opts Options) (int64, error) {
	var xmin string
	var built time.Time
	err := tx.QueryRow(ctx, shadowBuildSQL, d.Name, p.Start, p.End).Scan(&xmin, &built)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("publish %s %s: %w: no finished shadow run holds it; run backfill --shadow over it first", d.Name, p, ErrNoShadow)
	}
	if err != nil {
		return 0, fmt.Errorf("publish %s %s: %w", d.Name, p, err)
	}
	if opts.ShadowMaxAge > 0 && built.Before(opts.Now().Add(-opts.ShadowMaxAge)) {
		return 0, fmt.Errorf("publish %s %s: %w: its shadow was built at %s, longer ago than retention.ledger (%s), "+
			"so loads since then may be gone from the ledger; run backfill --shadow over it again",
			d.Name, p, ErrNoShadow, built.UTC().Format(time.RFC3339), opts.ShadowMaxAge)
	}
	res, err := aggregate.PublishShadow(ctx, tx, d, p, xmin, opts.Now(), aggregate.AllowArchived(opts.Force))
	if err != nil {
		return 0, err
	}
	// A table source's loads have no transaction ids: queue it always.
	since := !d.Ledger
	if !since {
		if since, err = ingest.LoadedSince(ctx, tx, d.Source, p.Start, p.End, xmin); err != nil {
			return 0, fmt.Errorf("publish %s %s: %w", d.Name, p, err)
		}
	}
	if since {
		if _, err := tx.Exec(ctx, requeueSQL, d.Name, p.Start, p.End, opts.Now()); err != nil {
			return 0, fmt.Errorf("publish %s %s: queue loads since the shadow: %w", d.Name, p, err)
		}
	}
	return res.Rows, nil
}
