package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
)

// Options configure a run.
type Options struct {
	// Kind is "backfill" or "refresh", as recorded.
	Kind string
	// Chunk is the span of one chunk (default one day).
	Chunk time.Duration
	// Concurrency is how many chunks are rebuilt at once (default 1).
	Concurrency int
	// Reprocess selects the chunks to rebuild (default Missing).
	Reprocess Reprocess
	// Now is the service clock, recorded as the partitions' rebuild time;
	// default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Report is what a run did.
type Report struct {
	RunID   int64
	Chunks  []Chunk // the plan
	Done    int
	Rows    int64
	Failed  []Failure
	Skipped int
}

// Failure is a chunk that could not be rebuilt.
type Failure struct {
	Chunk Chunk
	Err   error
}

// ErrBusy means another backfill or refresh of the aggregate is running.
var ErrBusy = errors.New("another backfill or refresh of the aggregate is running")

const (
	// lockSQL keeps one backfill or refresh per aggregate at a time. It is
	// not the reconciler's lock: the reconciler keeps running, and the
	// per-partition lock in aggregate.Rebuild keeps the two from
	// rebuilding one partition at once.
	lockSQL   = `SELECT pg_try_advisory_lock(hashtextextended('tidemark.backfill.' || $1, 0))`
	unlockSQL = `SELECT pg_advisory_unlock(hashtextextended('tidemark.backfill.' || $1, 0))`

	insertRunSQL = `
INSERT INTO tidemark.backfill_runs (aggregate, kind, range_start, range_end, chunk, reprocess, concurrency, status, chunks, started_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', $8, $9) RETURNING id`
	insertChunkSQL = `
INSERT INTO tidemark.backfill_chunks (run_id, chunk_start, chunk_end, partitions, status) VALUES ($1, $2, $3, $4, 'pending')`
	startChunkSQL = `
UPDATE tidemark.backfill_chunks SET status = 'running', started_at = $3 WHERE run_id = $1 AND chunk_start = $2`
	finishChunkSQL = `
WITH c AS (
    UPDATE tidemark.backfill_chunks SET status = $3, rows = $4, error = $5, finished_at = $6
    WHERE run_id = $1 AND chunk_start = $2
)
UPDATE tidemark.backfill_runs SET chunks_done = chunks_done + ($3 = 'done')::int, chunks_failed = chunks_failed + ($3 = 'failed')::int
WHERE id = $1`
	finishRunSQL = `UPDATE tidemark.backfill_runs SET status = $2, finished_at = $3 WHERE id = $1`
)

// Run rebuilds the chunks of the range that the plan selects, at most
// opts.Concurrency at once, oldest first. Each chunk is one transaction
// that rebuilds its partitions with aggregate.Rebuild; a chunk that fails
// is recorded with its error and the run goes on with the others. The
// load watermark is not touched. When ctx ends, chunks not yet started
// stay pending and the run is recorded as interrupted. d must be
// prepared (aggregate.Prepare).
func Run(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, r Range, opts Options) (*Report, error) {
	opts = withDefaults(opts)
	lock, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("backfill %s: %w", d.Name, err)
	}
	defer lock.Release()
	var got bool
	if err := lock.QueryRow(ctx, lockSQL, d.Name).Scan(&got); err != nil {
		return nil, fmt.Errorf("backfill %s: lock: %w", d.Name, err)
	}
	if !got {
		return nil, fmt.Errorf("backfill %s: %w", d.Name, ErrBusy)
	}
	defer func() { _, _ = lock.Exec(context.WithoutCancel(ctx), unlockSQL, d.Name) }()

	plan, err := Plan(ctx, pool, d, r, opts.Chunk, opts.Reprocess)
	if err != nil {
		return nil, err
	}
	rep := &Report{Chunks: plan}
	var todo []Chunk
	for _, c := range plan {
		if c.Run {
			todo = append(todo, c)
		} else {
			rep.Skipped++
		}
	}
	lo, hi := r.bounds(d.Calendar)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, insertRunSQL, d.Name, opts.Kind, lo, hi, config.Duration(opts.Chunk).String(),
			string(opts.Reprocess), opts.Concurrency, len(todo), opts.Now()).Scan(&rep.RunID); err != nil {
			return err
		}
		for _, c := range todo {
			if _, err := tx.Exec(ctx, insertChunkSQL, rep.RunID, c.Start, c.End, len(c.Partitions)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("backfill %s: record run: %w", d.Name, err)
	}
	opts.Logger.Info("backfill started", "aggregate", d.Name, "run", rep.RunID, "kind", opts.Kind,
		"chunks", len(todo), "skipped", rep.Skipped, "concurrency", opts.Concurrency)

	work := make(chan Chunk)
	var mu sync.Mutex
	var bookErr error
	var wg sync.WaitGroup
	for range min(opts.Concurrency, max(len(todo), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				rows, err := rebuildChunk(ctx, pool, d, rep.RunID, c, opts)
				status, msg := "done", any(nil)
				if err != nil {
					status, msg = "failed", err.Error()
				}
				if ctx.Err() != nil && err != nil {
					status, msg = "pending", nil
				}
				// The outcome is recorded even when ctx has ended.
				stored := any(nil)
				if status == "done" {
					stored = rows
				}
				_, bErr := pool.Exec(context.WithoutCancel(ctx), finishChunkSQL, rep.RunID, c.Start, status, stored, msg, opts.Now())
				mu.Lock()
				switch {
				case bErr != nil:
					bookErr = errors.Join(bookErr, bErr)
				case status == "done":
					rep.Done++
					rep.Rows += rows
					opts.Logger.Info("chunk rebuilt", "aggregate", d.Name, "run", rep.RunID, "chunk", c.Label(), "rows", rows)
				case status == "failed":
					rep.Failed = append(rep.Failed, Failure{c, err})
					opts.Logger.Error("chunk failed; the run goes on", "aggregate", d.Name, "run", rep.RunID, "chunk", c.Label(), "err", err)
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for _, c := range todo {
		select {
		case work <- c:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()

	status := "done"
	switch {
	case ctx.Err() != nil:
		status = "interrupted"
	case len(rep.Failed) > 0:
		status = "failed"
	}
	if _, err := pool.Exec(context.WithoutCancel(ctx), finishRunSQL, rep.RunID, status, opts.Now()); err != nil {
		bookErr = errors.Join(bookErr, err)
	}
	if bookErr != nil {
		return rep, fmt.Errorf("backfill %s: record outcome: %w", d.Name, bookErr)
	}
	if status == "interrupted" {
		return rep, fmt.Errorf("backfill %s: interrupted (run %d; --reprocess failed resumes it): %w", d.Name, rep.RunID, ctx.Err())
	}
	return rep, nil
}

// rebuildChunk rebuilds the partitions of c in one transaction.
func rebuildChunk(ctx context.Context, pool *pgxpool.Pool, d *aggregate.Definition, run int64, c Chunk, opts Options) (int64, error) {
	if _, err := pool.Exec(ctx, startChunkSQL, run, c.Start, opts.Now()); err != nil {
		return 0, err
	}
	var rows int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, p := range c.Partitions {
			res, err := aggregate.Rebuild(ctx, tx, d, p, opts.Now())
			if err != nil {
				return err
			}
			rows += res.Rows
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return rows, nil
}

func withDefaults(o Options) Options {
	if o.Kind == "" {
		o.Kind = "backfill"
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
