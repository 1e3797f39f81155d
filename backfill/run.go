package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/progress"
)

// Options configure a run.
type Options struct {
	// Kind is "backfill" or "refresh", as recorded; Shadow makes it
	// "shadow".
	Kind string
	// Shadow builds every chunk of the range into the aggregate's shadow
	// table (aggregate.BuildShadow) instead of publishing it, whatever
	// Reprocess says, and reports each partition against the published
	// one.
	Shadow bool
	// Chunk is the span of one chunk (default one day).
	Chunk time.Duration
	// Concurrency is how many chunks are rebuilt at once (default 1).
	Concurrency int
	// Reprocess selects the chunks to rebuild (default Missing).
	Reprocess Reprocess
	// Publish swaps in what the latest shadow run built of each
	// partition instead of rebuilding it (see publish); it makes the kind
	// "publish" and reprocesses every chunk. ShadowMaxAge refuses shadows
	// built longer ago than that (the ledger retention), whose later loads
	// the ledger may no longer hold.
	Publish      bool
	ShadowMaxAge time.Duration
	// Force rebuilds archived partitions too, from the raw rows retention
	// left. Without it a range holding an archived partition is refused
	// (ErrArchivedRange), unless SkipArchived leaves them alone.
	Force        bool
	SkipArchived bool
	// Now is the service clock, recorded as the partitions' rebuild time;
	// default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Progress shows the run's progress, in chunks, through Logger or as
	// a bar; nil shows nothing.
	Progress *progress.Display
}

// Report is what a run did.
type Report struct {
	RunID   int64
	Chunks  []Chunk // the plan
	Done    int
	Rows    int64
	Failed  []Failure
	Skipped int
	// Shadow holds, for a shadow run, each partition built against the
	// published one, in partition order.
	Shadow []Check
}

// Failure is a chunk that could not be rebuilt.
type Failure struct {
	Chunk Chunk
	Err   error
}

// ErrArchivedRange means the range holds archived partitions, which a
// backfill rebuilds only when forced.
var ErrArchivedRange = errors.New("the range holds archived partitions")

// ErrBusy means another backfill or refresh of the aggregate is running.
var ErrBusy = errors.New("another backfill or refresh of the aggregate is running")

const (
	// lockSQL keeps one backfill or refresh per aggregate at a time. It is
	// not the reconciler's lock: the reconciler keeps running, and the
	// per-partition lock in aggregate.Rebuild keeps the two from
	// rebuilding one partition at once.
	lockSQL   = `SELECT pg_try_advisory_lock(hashtextextended('tidemark.backfill.' || $1, 0))`
	unlockSQL = `SELECT pg_advisory_unlock(hashtextextended('tidemark.backfill.' || $1, 0))`

	// abandonRunsSQL closes the runs of an aggregate that died without
	// finishing (no run can be alive while the lock is held), and makes
	// their chunks in progress pending again.
	abandonRunsSQL = `
WITH r AS (
    UPDATE tidemark.backfill_runs SET status = 'interrupted'
    WHERE aggregate = $1 AND status = 'running' RETURNING id
)
UPDATE tidemark.backfill_chunks SET status = 'pending', started_at = NULL
WHERE run_id IN (SELECT id FROM r) AND status = 'running'`

	insertRunSQL = `
INSERT INTO tidemark.backfill_runs (aggregate, kind, range_start, range_end, chunk, reprocess, concurrency, status, chunks, started_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', $8, $9) RETURNING id`
	insertChunksSQL = `
INSERT INTO tidemark.backfill_chunks (run_id, chunk_start, chunk_end, partitions, status)
SELECT $1, s, e, n, 'pending' FROM unnest($2::timestamptz[], $3::timestamptz[], $4::int[]) AS c (s, e, n)`
	startChunkSQL = `
UPDATE tidemark.backfill_chunks SET status = 'running', started_at = $3
WHERE run_id = $1 AND chunk_start = $2`
	finishChunkSQL = `
WITH c AS (
    UPDATE tidemark.backfill_chunks SET status = $3, rows = $4, error = $5,
        finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE $6::timestamptz END,
        started_at = CASE WHEN $3 = 'pending' THEN NULL ELSE started_at END
    WHERE run_id = $1 AND chunk_start = $2
)
UPDATE tidemark.backfill_runs SET chunks_done = chunks_done + ($3 = 'done')::int, chunks_failed = chunks_failed + ($3 = 'failed')::int
WHERE id = $1`
	finishRunSQL = `UPDATE tidemark.backfill_runs SET status = $2, finished_at = $3 WHERE id = $1`
)

// Run rebuilds the chunks of the range that the plan selects, at most
// opts.Concurrency at once, oldest first. Each partition of a chunk is
// rebuilt with aggregate.Rebuild in a transaction of its own, as the
// reconciler rebuilds it (so a backfill never holds the status rows of
// several partitions against the reconciler). A chunk that the warehouse
// refuses is recorded with its error, and the run goes on with the
// others; one that fails because the warehouse cannot be reached ends the
// run. The load watermark is not touched. When ctx ends or the run ends
// early, chunks not finished stay pending and the run is recorded as
// interrupted. d must be prepared (aggregate.Prepare).
func Run(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, r Range, opts Options) (*Report, error) {
	opts = opts.withDefaults()
	if !d.Prepared() {
		return nil, fmt.Errorf("backfill %s: %w", d.Name, aggregate.ErrNotPrepared)
	}
	unlock, err := lockAggregate(ctx, pool, d)
	if err != nil {
		return nil, err
	}
	defer unlock()
	plan, err := planRun(ctx, pool, d, r, opts)
	if err != nil {
		return nil, err
	}
	rep := &Report{Chunks: plan}
	var todo []Chunk
	for _, c := range plan {
		if !c.Run {
			rep.Skipped++
			continue
		}
		todo = append(todo, c)
	}
	if err := recordRun(ctx, pool, d, r, todo, opts, rep); err != nil {
		return nil, err
	}
	opts.Logger.Info("backfill started", "aggregate", d.Name, "run", rep.RunID, "kind", opts.Kind,
		"chunks", len(todo), "skipped", rep.Skipped, "concurrency", opts.Concurrency)
	tr := opts.Progress.Start(opts.Logger.With("aggregate", d.Name, "run", rep.RunID),
		progress.Job{Label: opts.Kind, Unit: "chunks", Total: int64(len(todo))})
	defer tr.Finish(false)

	// stop ends the feeding of chunks when the warehouse cannot be reached.
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	w := &chunkWork{pool: pool, d: d, opts: opts, rep: rep, tr: tr, stop: stop}
	w.run(ctx, runCtx, todo)
	tr.Finish(rep.Done+len(rep.Failed) == len(todo))
	return finishRun(ctx, runCtx, pool, d, rep, len(todo), w.bookErr, opts)
}

// lockAggregate takes the aggregate's backfill lock on a connection of its
// own (ErrBusy when another backfill or refresh holds it) and closes the
// runs that died without finishing. The returned function releases the
// lock and the connection.
func lockAggregate(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition) (unlock func(), err error) {
	lock, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("backfill %s: %w", d.Name, err)
	}
	var got bool
	if err := lock.QueryRow(ctx, lockSQL, d.Name).Scan(&got); err != nil {
		lock.Release()
		return nil, fmt.Errorf("backfill %s: lock: %w", d.Name, err)
	}
	if !got {
		lock.Release()
		return nil, fmt.Errorf("backfill %s: %w", d.Name, ErrBusy)
	}
	unlock = func() {
		cctx, cancel := pgconnect.Cleanup(ctx)
		defer cancel()
		_, _ = lock.Exec(cctx, unlockSQL, d.Name)
		lock.Release()
	}
	if _, err := lock.Exec(ctx, abandonRunsSQL, d.Name); err != nil {
		unlock()
		return nil, fmt.Errorf("backfill %s: close abandoned runs: %w", d.Name, err)
	}
	return unlock, nil
}

// planRun plans the run's chunks (see Plan and PlanPublish), refuses a
// plan the options do not allow (archived partitions, a publish with
// nothing left to publish), and creates the shadow table of a shadow run.
func planRun(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, r Range, opts Options) ([]Chunk, error) {
	var plan []Chunk
	var err error
	if opts.Publish {
		plan, err = PlanPublish(ctx, pool, d, r, opts.Chunk, opts.Now(), opts.ShadowMaxAge)
	} else {
		plan, err = Plan(ctx, pool, d, r, opts.Chunk, opts.Reprocess)
	}
	if err != nil {
		return nil, err
	}
	if err := archivedIn(d, plan, opts); err != nil {
		return nil, err
	}
	if opts.Publish && !slices.ContainsFunc(plan, func(c Chunk) bool { return c.Run }) {
		return nil, fmt.Errorf("publish %s: %w: every partition of the range was published from its shadow build; "+
			"to publish a new build, run backfill --shadow over the range first", d.Name, ErrPublished)
	}
	if opts.Shadow {
		if err := aggregate.CreateShadow(ctx, pool, d); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

// recordRun records the run and its chunks to do, all pending, and sets
// rep.RunID.
func recordRun(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, r Range, todo []Chunk, opts Options, rep *Report) error {
	var starts, ends []time.Time
	var counts []int32
	for _, c := range todo {
		starts, ends, counts = append(starts, c.Start), append(ends, c.End), append(counts, int32(len(c.Partitions)))
	}
	lo, hi := r.bounds(d.Calendar)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, insertRunSQL, d.Name, opts.Kind, lo, hi, config.Duration(opts.Chunk).String(),
			string(opts.Reprocess), opts.Concurrency, len(todo), opts.Now()).Scan(&rep.RunID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insertChunksSQL, rep.RunID, starts, ends, counts)
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill %s: record run: %w", d.Name, err)
	}
	return nil
}

// chunkWork is what the workers of one run share.
type chunkWork struct {
	pool *pgxpool.Pool
	d    *aggregate.Definition
	opts Options
	tr   *progress.Tracker
	// stop ends the feeding of chunks, with the cause.
	stop context.CancelCauseFunc

	mu      sync.Mutex
	rep     *Report // under mu once the workers start
	bookErr error   // the errors of recording outcomes, under mu
}

// run feeds todo to opts.Concurrency workers until every chunk is taken
// or runCtx ends, and waits for them.
func (w *chunkWork) run(ctx, runCtx context.Context, todo []Chunk) {
	work := make(chan Chunk)
	var wg sync.WaitGroup
	for range min(w.opts.Concurrency, max(len(todo), 1)) {
		wg.Go(func() {
			for c := range work {
				w.chunk(ctx, runCtx, c)
			}
		})
	}
feed:
	for _, c := range todo {
		select {
		case work <- c:
		case <-runCtx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
}

// chunk rebuilds c, records its outcome (even when ctx has ended) and
// adds it to the report. A chunk cancelled, or stopped because the
// warehouse cannot be reached (which stops the run), stays pending; one
// the warehouse refused is recorded as failed.
func (w *chunkWork) chunk(ctx, runCtx context.Context, c Chunk) {
	d, rep := w.d, w.rep
	rows, checks, err := rebuildChunk(runCtx, w.pool, d, rep.RunID, c, w.opts)
	status, msg, stored := "done", any(nil), any(rows)
	switch {
	case err == nil:
	case runCtx.Err() != nil:
		// Cancelled (the server reports a cancelled statement as an SQL
		// error): not finished.
		status, stored = "pending", nil
	case !chunkFault(err):
		// The warehouse cannot be reached: the chunks after this one
		// would fail the same way.
		w.stop(err)
		status, stored = "pending", nil
	default:
		status, msg, stored = "failed", err.Error(), nil
	}
	bctx, cancel := pgconnect.Cleanup(ctx)
	_, bErr := w.pool.Exec(bctx, finishChunkSQL, rep.RunID, c.Start, status, stored, msg, w.opts.Now())
	cancel()
	w.mu.Lock()
	if bErr != nil {
		w.bookErr = errors.Join(w.bookErr, fmt.Errorf("chunk %s: %w", c.Label(), bErr))
	}
	switch status {
	case "done":
		rep.Done++
		rep.Shadow = append(rep.Shadow, checks...)
		rep.Rows += rows
		w.opts.Logger.Info("chunk done", "aggregate", d.Name, "run", rep.RunID, "chunk", c.Label(), "rows", rows)
	case "failed":
		rep.Failed = append(rep.Failed, Failure{c, err})
		w.opts.Logger.Error("chunk failed; the run goes on", "aggregate", d.Name, "run", rep.RunID, "chunk", c.Label(), "err", err)
	}
	w.mu.Unlock()
	if status != "pending" {
		w.tr.Add(1)
	}
}

// finishRun records the run's status, done, failed or interrupted (some
// of todo chunks not finished), and returns the report with the error
// that ended the run early, if any.
func finishRun(ctx, runCtx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, rep *Report, todo int, bookErr error, opts Options) (*Report, error) {
	status := "done"
	switch {
	case rep.Done+len(rep.Failed) < todo:
		status = "interrupted"
	case len(rep.Failed) > 0 || bookErr != nil:
		status = "failed"
	}
	slices.SortFunc(rep.Shadow, func(a, b Check) int { return a.Partition.Start.Compare(b.Partition.Start) })
	fctx, cancel := pgconnect.Cleanup(ctx)
	if _, err := pool.Exec(fctx, finishRunSQL, rep.RunID, status, opts.Now()); err != nil {
		bookErr = errors.Join(bookErr, err)
	}
	cancel()
	switch {
	case bookErr != nil:
		return rep, fmt.Errorf("backfill %s: record outcome: %w", d.Name, bookErr)
	case status == "interrupted" && ctx.Err() != nil:
		return rep, fmt.Errorf("backfill %s: interrupted (run %d; --reprocess failed resumes it): %w", d.Name, rep.RunID, ctx.Err())
	case status == "interrupted":
		return rep, fmt.Errorf("backfill %s: stopped (run %d; --reprocess failed resumes it): %w", d.Name, rep.RunID, context.Cause(runCtx))
	}
	return rep, nil
}

// chunkFault reports whether a chunk failed through its own fault (see
// aggregate.PartitionFault): only such a chunk is recorded as failed; a
// warehouse that cannot work stops the run.
func chunkFault(err error) bool {
	return aggregate.PartitionFault(err) || errors.Is(err, ErrNoShadow) || errors.Is(err, ErrShadowChanged)
}

// rebuildChunk rebuilds the partitions of c (or for a shadow run builds
// them into the shadow table), each in its own transaction, and marks the
// chunk running first.
func rebuildChunk(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, run int64, c Chunk, opts Options) (int64, []Check, error) {
	if _, err := pool.Exec(ctx, startChunkSQL, run, c.Start, opts.Now()); err != nil {
		return 0, nil, fmt.Errorf("mark chunk %s running: %w", c.Label(), err)
	}
	var rows int64
	var checks []Check
	for _, p := range c.Partitions {
		for attempt := 1; ; attempt++ {
			var n int64
			var check Check
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if opts.Shadow {
					s, err := aggregate.BuildShadow(ctx, tx, d, p, aggregate.AllowArchived(opts.Force))
					if err != nil {
						return err
					}
					check, n = Check{Partition: p, Comparison: s.Comparison, Archived: s.Archived}, s.Fresh
					return recordBuild(ctx, tx, d, p, run, s, opts.Now())
				}
				if opts.Publish {
					var err error
					n, err = publish(ctx, tx, d, p, run, opts)
					return err
				}
				res, err := aggregate.Rebuild(ctx, tx, d, p, opts.Now(), aggregate.AllowArchived(opts.Force))
				n = res.Rows
				return err
			})
			if err != nil && attempt < aggregate.RebuildAttempts && pgerr.Retryable(err) {
				continue
			}
			if errors.Is(err, ErrPublished) {
				// Published by an earlier run of this publish, which
				// was interrupted: nothing left to do for it.
				opts.Logger.Info("partition already published", "aggregate", d.Name, "partition", p.Label(), "err", err)
				break
			}
			if err != nil {
				return rows, checks, err
			}
			rows += n
			if opts.Shadow {
				checks = append(checks, check)
			}
			break
		}
	}
	return rows, checks, nil
}

// withDefaults fills the options left empty.
func (o Options) withDefaults() Options {
	if o.Kind == "" {
		o.Kind = "backfill"
	}
	if o.Shadow {
		o.Kind, o.Reprocess = "shadow", Completed
	}
	if o.Publish {
		o.Kind, o.Reprocess = "publish", Completed
	}
	if o.Chunk <= 0 {
		o.Chunk = 24 * time.Hour
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.Reprocess == "" {
		o.Reprocess = Missing
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// archivedIn refuses a plan with archived partitions unless opts force
// them (which makes their chunks run as they would without them) or skip
// them.
func archivedIn(d *aggregate.Definition, plan []Chunk, opts Options) error {
	var first, last *Chunk
	n := 0
	for i := range plan {
		c := &plan[i]
		if c.Archived == 0 {
			continue
		}
		if opts.Force {
			c.force()
		}
		if first == nil {
			first = c
		}
		last, n = c, n+c.Archived
	}
	if n == 0 || opts.Force || opts.SkipArchived {
		return nil
	}
	return fmt.Errorf("backfill %s: %w: %d partitions in %s .. %s; retention dropped raw rows they were built from, "+
		"so a rebuild would replace their published rows with what is left: narrow --from, or add --force to rebuild them anyway",
		d.Name, ErrArchivedRange, n, first.Partitions[0].Label(), last.Partitions[len(last.Partitions)-1].Label())
}
