// Package periodic is the one shape of tidemark's periodic components:
// the reconciler, the pruner, the verification and refresh schedules, key
// reconciliation, poll runs and partition precreation. A Job runs, waits,
// and runs again until its context ends: each run bounded by a timeout,
// its failure logged and followed by a backoff rather than a tight loop,
// quiet when the context ends, and stopping the loop only on an error the
// job says is final.
package periodic

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tidemark-dev/tidemark/internal/backoff"
)

// Job is one periodic job.
type Job struct {
	// Name names the job in its log lines ("poll customers").
	Name string
	// Every is the wait between the end of a successful run and the start
	// of the next.
	Every time.Duration
	// FromStart measures the wait (Every, or the backoff) from the start
	// of each run instead of its end, as a ticker does: runs start at a
	// fixed interval, and one that took longer is followed by the next at
	// once.
	FromStart bool
	// Timeout bounds one run; 0 leaves it unbounded.
	Timeout time.Duration
	// Backoff spaces the runs after failures in a row (reset by a
	// success); with First zero, a failed run is followed by Every.
	Backoff backoff.Backoff
	// Next, when set, decides the wait after each run instead: it is
	// given the run's error (nil after a success) and the wait Every or
	// Backoff would give. A schedule kept in the warehouse, or a run
	// that found more work, uses it.
	Next func(err error, wait time.Duration) time.Duration
	// Run does one run.
	Run func(ctx context.Context) error
	// Final reports whether a run's error ends the loop: Loop returns
	// it. nil means none does.
	Final func(err error) bool
	// Log receives one line per failed run; nil discards them.
	Log *slog.Logger
}

// Loop runs j at once, then after each wait, until ctx ends (it returns
// nil then) or a run fails with an error Final accepts (it returns that
// error). A failed run is logged at Warn with the wait before the next,
// unless ctx has ended.
func (j *Job) Loop(ctx context.Context) error {
	log := j.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for {
		started := time.Now()
		err := j.once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && j.Final != nil && j.Final(err) {
			return err
		}
		wait := j.Every
		switch {
		case err == nil:
			j.Backoff.Reset()
		case j.Backoff.First > 0:
			wait = j.Backoff.Next()
		}
		if j.FromStart {
			wait -= time.Since(started)
		}
		if j.Next != nil {
			wait = j.Next(err, wait)
		}
		if err != nil {
			log.Warn(j.Name+" failed; trying again", "err", err, "retry_in", wait.Round(time.Millisecond))
		}
		if backoff.Sleep(ctx, max(wait, 0)) != nil {
			return nil
		}
	}
}

// once is one run under the timeout.
func (j *Job) once(ctx context.Context) error {
	if j.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, j.Timeout)
		defer cancel()
	}
	err := j.Run(ctx)
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
