package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/progress"
)

// resyncPollEvery is how often `tidemark resync --wait` reads the
// resyncs it follows. Tests shorten it.
var resyncPollEvery = time.Second

// resyncReadLimit bounds each read of the resyncs: a warehouse that does
// not answer ends the wait rather than holding it.
const resyncReadLimit = 30 * time.Second

// followed is a resync that `tidemark resync --wait` follows until it is
// done.
type followed struct {
	table   string
	gen     int64
	tracker *progress.Tracker
	shown   int64 // the rows copied the tracker has counted
	pending bool  // said to wait for the reader
}

// waitResyncs follows the resyncs asked for (or under way already) of
// source until each is done, showing each copy's progress on disp: a bar
// on a terminal, lines through log elsewhere. It prints a line for each
// one done, and ends with ctx (an interrupt) or a failure to read the
// warehouse, saying so.
func waitResyncs(ctx context.Context, db *pgxpool.Pool, source string, asked []cdc.Resync, disp *progress.Display, log *slog.Logger, stdout, stderr io.Writer) int {
	const app = "tidemark resync"
	var open []*followed
	for _, r := range asked {
		open = append(open, &followed{table: r.Table, gen: r.Generation})
	}
	defer func() {
		for _, f := range open {
			f.tracker.Finish(false)
		}
	}()
	tick := time.NewTicker(resyncPollEvery)
	defer tick.Stop()
	for {
		var err error
		if open, err = followResyncs(ctx, db, source, open, disp, log, stdout); err != nil {
			if ctx.Err() == nil {
				return failed(stderr, app, err)
			}
		}
		if len(open) == 0 {
			return exitOK
		}
		select {
		case <-tick.C:
			continue
		case <-ctx.Done():
		}
		why := "interrupted"
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			why = "timed out"
		}
		left := ""
		for i, f := range open {
			if i > 0 {
				left += ", "
			}
			left += f.table
		}
		fmt.Fprintf(stderr, "%s: %s while waiting for %s; the reader goes on with them (tidemark status shows how far they got)\n", app, why, left)
		return exitFailure
	}
}

// followResyncs reads the resyncs of open once, shows their progress, and
// returns those not done. The ones done are handled first, so that the
// bar of the one that ended is closed before the next one's is drawn.
func followResyncs(ctx context.Context, db *pgxpool.Pool, source string, open []*followed, disp *progress.Display, log *slog.Logger, stdout io.Writer) ([]*followed, error) {
	states := make([]cdc.Resync, len(open))
	for i, f := range open {
		rctx, cancel := context.WithTimeout(ctx, resyncReadLimit)
		r, ok, err := cdc.LastResync(rctx, db, source, f.table)
		cancel()
		if err != nil {
			return open, err
		}
		if !ok {
			return open, fmt.Errorf("the resync of %s %s is gone from tidemark.cdc_resyncs", source, f.table)
		}
		states[i] = r
	}
	var (
		left  []*followed
		still []cdc.Resync
	)
	for i, f := range open {
		r := states[i]
		if r.Generation == f.gen && r.State != "done" {
			left, still = append(left, f), append(still, r)
			continue
		}
		f.count(r)
		f.tracker.Finish(true)
		f.tracker = nil
		if r.Generation != f.gen {
			fmt.Fprintf(stdout, "tidemark resync: %s %s done, and asked for again since (generation %d, %s)\n", source, f.table, r.Generation, r.State)
			continue
		}
		took := "-"
		if r.StartedAt != nil && r.FinishedAt != nil {
			took = r.FinishedAt.Sub(*r.StartedAt).Round(time.Second).String()
		}
		fmt.Fprintf(stdout, "tidemark resync: %s %s done in %s: %d rows copied, %d removed\n", source, f.table, took, r.Rows, r.Removed)
	}
	for i, f := range left {
		r := still[i]
		switch {
		case r.State == "pending" && !f.pending:
			f.pending = true
			log.Info("resync waits for the reader streaming the source to copy it", "source", source, "table", f.table)
		case r.State == "copying" && f.tracker == nil:
			var total int64
			if r.Planned != nil {
				total = *r.Planned
			}
			f.tracker = disp.Start(log, progress.Job{Label: "resync " + f.table, Unit: "rows", Total: total, Estimated: true})
		}
		f.count(r)
	}
	return left, nil
}

// count adds to f's tracker the rows copied since it last counted.
func (f *followed) count(r cdc.Resync) {
	if f.tracker != nil && r.Generation == f.gen && r.Rows > f.shown {
		f.tracker.Add(r.Rows - f.shown)
		f.shown = r.Rows
	}
}
