package cdc

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/mirror"
)

// An operator pauses a CDC source (tidemark pause) to stop reading it
// without stopping the process or the other sources. The run under way
// ends as a stop does: what it applied is applied and confirmed, what it
// had not is read again after the resume. Then no reader of the source
// reads the slot, holds its lock or writes heartbeats; the slot stays,
// keeping the source's WAL from the position the warehouse stored, and
// each paused reader reads the slot's lag and wal_status every
// pausedSlotEvery so that the slot's metrics and alerts still show what
// it keeps.

// errPaused ends a run of a paused source.
var errPaused = errors.New("the source is paused")

// pauseCheck is how often a run asks whether its source was paused, and
// a paused reader whether it was resumed.
const pauseCheck = time.Second

// pausedSlotEvery is how often a paused reader reads the slot's metrics.
const pausedSlotEvery = 10 * time.Second

// paused reports whether an operator paused the source.
func (r *Reader) paused() bool { return r.opts.Paused != nil && r.opts.Paused(r.conf.Source) }

// watchPause ends the run of ctx with errPaused (through lose) once the
// source is paused; the returned function stops the watch and waits for
// it.
func (r *Reader) watchPause(ctx context.Context, lose context.CancelCauseFunc) (stop func()) {
	if r.opts.Paused == nil {
		return func() {}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	job := periodic.Job{Name: "pause check", Every: pauseCheck, FromStart: true,
		Run: func(context.Context) error {
			if r.paused() {
				return errPaused
			}
			return nil
		},
		Final: func(err error) bool { return errors.Is(err, errPaused) },
	}
	go func() {
		defer close(done)
		if err := job.Loop(wctx); err != nil {
			lose(err)
		}
	}()
	return func() { cancel(); <-done }
}

// waitResumed returns at once when the source is not paused; otherwise it
// logs the pause, reads the slot's metrics every pausedSlotEvery while it
// lasts, and returns once the source is resumed, or with ctx's error.
func (r *Reader) waitResumed(ctx context.Context) error {
	if !r.paused() {
		return nil
	}
	r.log.Info("source paused: the reader does not read the slot, which keeps the source's WAL", "slot", r.conf.Slot)
	var (
		src  *pgx.Conn
		read time.Time
	)
	defer func() {
		if src != nil {
			pgconnect.Close(ctx, src)
		}
	}()
	job := periodic.Job{Name: "pause check", Every: pauseCheck, FromStart: true,
		Run: func(ctx context.Context) error {
			if !r.paused() {
				return errResumed
			}
			if time.Since(read) < pausedSlotEvery {
				return nil
			}
			read = time.Now()
			if src == nil {
				c, err := mirror.Connect(ctx, r.conf.DSN, "tidemark-cdc")
				if err != nil {
					return nil // the metrics stand as they are until the source answers
				}
				src = c
			}
			r.slotMetrics(ctx, src)
			if src.IsClosed() {
				src = nil
			}
			return nil
		},
		Final: func(err error) bool { return errors.Is(err, errResumed) },
	}
	if err := job.Loop(ctx); err == nil {
		return ctx.Err()
	}
	r.log.Info("source resumed: the reader reads the slot again", "slot", r.conf.Slot)
	return nil
}

// errResumed ends the wait of a paused reader.
var errResumed = errors.New("the source is resumed")
