package backfill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/raw"
)

// ErrNoShadow means a partition has no shadow build that can be
// published: none was recorded, or it is older than the ledger retention.
var ErrNoShadow = errors.New("no shadow build to publish")

// ErrShadowChanged means the shadow table no longer holds the rows a
// build wrote of a partition (it was emptied, dropped and made again, or
// written by hand), so publishing it would not publish what was compared.
var ErrShadowChanged = errors.New("the shadow table no longer holds what was built")

// ErrPublished means a partition's shadow build has been published
// already: it is not published twice. A publish skips such partitions,
// and refuses a range holding nothing else.
var ErrPublished = errors.New("the shadow build has been published already")

const (
	// recordBuildSQL records the shadow build of partition [$2, $3) by
	// run $4, replacing the previous one, in the build's transaction.
	recordBuildSQL = `
INSERT INTO tidemark.shadow_builds AS b (aggregate, partition_start, partition_end, run_id, snapshot_xmin, rows, archived, built_at)
VALUES ($1, $2, $3, $4, $5::text::xid8, $6, $7, $8)
ON CONFLICT (aggregate, partition_start) DO UPDATE SET
    partition_end = EXCLUDED.partition_end, run_id = EXCLUDED.run_id, snapshot_xmin = EXCLUDED.snapshot_xmin,
    rows = EXCLUDED.rows, archived = EXCLUDED.archived, built_at = EXCLUDED.built_at,
    published_at = NULL, published_run = NULL`

	// buildSQL reads the build of a partition and locks it until the
	// publishing transaction ends, so two publishes cannot both take it.
	buildSQL = `
SELECT run_id, snapshot_xmin::text, rows, built_at, published_at, published_run
FROM tidemark.shadow_builds WHERE aggregate = $1 AND partition_start = $2
FOR UPDATE`

	// buildsSQL lists the builds of the partitions starting in [$2, $3).
	buildsSQL = `
SELECT partition_start, run_id, built_at, published_at, published_run
FROM tidemark.shadow_builds WHERE aggregate = $1 AND partition_start >= $2 AND partition_start < $3`

	markPublishedSQL = `
UPDATE tidemark.shadow_builds SET published_at = $3, published_run = $4
WHERE aggregate = $1 AND partition_start = $2`

	// requeueSQL queues partition [$2, $3) again.
	requeueSQL = `
INSERT INTO tidemark.pending_partitions (aggregate, partition_start, partition_end, reason, queued_at)
VALUES ($1, $2, $3, 'published', $4)
ON CONFLICT (aggregate, partition_start) DO NOTHING`
)

// recordBuild records, in tx (the build's), that run built s of p into
// the shadow table: the build publish may publish, once.
func recordBuild(ctx context.Context, tx pgx.Tx, d *aggregate.Definition, p aggregate.Partition, run int64, s aggregate.Shadow, now time.Time) error {
	if _, err := tx.Exec(ctx, recordBuildSQL, d.Name, p.Start, p.End, run, s.Watermark, s.Fresh, s.Archived, now); err != nil {
		return fmt.Errorf("shadow %s %s: record the build: %w", d.Name, p, err)
	}
	return nil
}

// build is a recorded shadow build of a partition.
type build struct {
	run          int64
	built        time.Time
	published    *time.Time
	publishedRun *int64
}

// publishedNote says which run published b, and when.
func (b build) publishedNote() string {
	return fmt.Sprintf("the build of run %d was published by run %d at %s", b.run, *b.publishedRun,
		b.published.UTC().Format(time.RFC3339))
}

// PlanPublish plans a publish of the range: Plan with every chunk run,
// except the chunks whose every partition's latest shadow build has been
// published already (a publish run again, or resumed after an
// interruption). It refuses, before anything is published, a range
// holding a partition with no shadow build, or with one built longer ago
// than maxAge (when positive) before now: ErrNoShadow, naming them and the
// shadow run that builds them.
func PlanPublish(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, r Range, span time.Duration, now time.Time, maxAge time.Duration) ([]Chunk, error) {
	plan, err := Plan(ctx, pool, d, r, span, Completed)
	if err != nil || len(plan) == 0 {
		return plan, err
	}
	rows, err := pool.Query(ctx, buildsSQL, d.Name, plan[0].Start, plan[len(plan)-1].End)
	if err != nil {
		return nil, fmt.Errorf("publish %s: read shadow builds: %w", d.Name, err)
	}
	builds := map[int64]build{}
	var start time.Time
	var b build
	if _, err := pgx.ForEachRow(rows, []any{&start, &b.run, &b.built, &b.published, &b.publishedRun}, func() error {
		builds[start.UnixMicro()] = b
		return nil
	}); err != nil {
		return nil, fmt.Errorf("publish %s: read shadow builds: %w", d.Name, err)
	}
	var missing, stale []aggregate.Partition
	for i := range plan {
		c := &plan[i]
		published := 0
		var last build
		for _, p := range c.Partitions {
			b, ok := builds[p.Start.UnixMicro()]
			switch {
			case !ok:
				missing = append(missing, p)
			case b.published != nil:
				published, last = published+1, b
			case maxAge > 0 && b.built.Before(now.Add(-maxAge)):
				stale = append(stale, p)
			}
		}
		if published == len(c.Partitions) {
			reason := "already published: " + last.publishedNote() + " (backfill --shadow builds it again)"
			if c.Archived > 0 {
				c.forced, c.forcedReason = false, reason
			} else {
				c.Run, c.Reason = false, reason
			}
		}
	}
	if len(missing)+len(stale) == 0 {
		return plan, nil
	}
	var why []string
	if len(missing) > 0 {
		why = append(why, fmt.Sprintf("%s no shadow build", partitionsOf(missing, "has", "have")))
	}
	if len(stale) > 0 {
		why = append(why, fmt.Sprintf("%s built longer ago than retention.ledger (%s), so loads since then may be gone from the ledger",
			partitionsOf(stale, "was", "were"), maxAge))
	}
	all := slices.Concat(missing, stale)
	lo, hi := all[0], all[0]
	for _, p := range all {
		if p.Start.Before(lo.Start) {
			lo = p
		}
		if p.Start.After(hi.Start) {
			hi = p
		}
	}
	return nil, fmt.Errorf("publish %s: %w: %s; build them first (tidemark backfill --aggregate %s --from %s --to %s --shadow), or narrow --from and --to",
		d.Name, ErrNoShadow, joinAnd(why), d.Name, day(lo, d), day(hi, d))
}

// partitionsOf names ps (in order) for a sentence whose verb is one or
// many.
func partitionsOf(ps []aggregate.Partition, one, many string) string {
	if len(ps) == 1 {
		return fmt.Sprintf("partition %s %s", ps[0].Label(), one)
	}
	return fmt.Sprintf("%d partitions in %s .. %s %s", len(ps), ps[0].Label(), ps[len(ps)-1].Label(), many)
}

// day is the first day of p in the aggregate's zone, as --from and --to
// take it.
func day(p aggregate.Partition, d *aggregate.Definition) string {
	return p.Start.In(d.Calendar.Loc).Format(time.DateOnly)
}

func joinAnd(parts []string) string {
	if len(parts) == 2 {
		return parts[0] + ", and " + parts[1]
	}
	return parts[0]
}

// publish swaps in partition p as its latest shadow build wrote it (see
// aggregate.PublishShadow), in tx, marks the build published by run, and
// queues p for the reconciler when data arrived after the build, which
// the shadow lacks: what was compared is exactly what is published, once,
// and the next reconcile run adds what came since. A build published
// already is left alone (ErrPublished).
func publish(ctx context.Context, tx pgx.Tx, d *aggregate.Definition, p aggregate.Partition, run int64, opts Options) (int64, error) {
	var xmin string
	var want int64
	var b build
	err := tx.QueryRow(ctx, buildSQL, d.Name, p.Start).Scan(&b.run, &xmin, &want, &b.built, &b.published, &b.publishedRun)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("publish %s %s: %w: no shadow run built it; run backfill --shadow over it first", d.Name, p, ErrNoShadow)
	}
	if err != nil {
		return 0, fmt.Errorf("publish %s %s: %w", d.Name, p, err)
	}
	if b.published != nil {
		return 0, fmt.Errorf("publish %s %s: %w: %s", d.Name, p, ErrPublished, b.publishedNote())
	}
	if opts.ShadowMaxAge > 0 && b.built.Before(opts.Now().Add(-opts.ShadowMaxAge)) {
		return 0, fmt.Errorf("publish %s %s: %w: its shadow was built at %s, longer ago than retention.ledger (%s), "+
			"so loads since then may be gone from the ledger; run backfill --shadow over it again",
			d.Name, p, ErrNoShadow, b.built.UTC().Format(time.RFC3339), opts.ShadowMaxAge)
	}
	res, err := aggregate.PublishShadow(ctx, tx, d, p, xmin, opts.Now(), aggregate.AllowArchived(opts.Force))
	if err != nil {
		return 0, err
	}
	if res.Rows != want {
		return 0, fmt.Errorf("publish %s %s: %w: run %d built %d rows, the shadow table holds %d; run backfill --shadow over it again",
			d.Name, p, ErrShadowChanged, b.run, want, res.Rows)
	}
	if _, err := tx.Exec(ctx, markPublishedSQL, d.Name, p.Start, opts.Now(), run); err != nil {
		return 0, fmt.Errorf("publish %s %s: mark the build published: %w", d.Name, p, err)
	}
	// A table source's loads have no transaction ids: queue it always.
	since := !d.Ledger
	if !since {
		if since, err = raw.LoadedSince(ctx, tx, d.Source, p.Start, p.End, xmin); err != nil {
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
