package pgconnect

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// ErrNoProgress is the cause of a Watchdog's context when it fired.
var ErrNoProgress = fmt.Errorf("no progress")

// Watchdog is a deadline that moves on with progress: its context ends
// when Touch has not been called for its timeout. It bounds work made of
// many bounded steps (the chunks of a poll run, the chunks and commit of
// a CDC group) without bounding the work as a whole.
type Watchdog struct {
	d      time.Duration
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	t      *time.Timer
}

// WithWatchdog returns a context that ends with ctx, or with ErrNoProgress
// once d passes without a Touch.
func WithWatchdog(ctx context.Context, d time.Duration) (context.Context, *Watchdog) {
	wctx, cancel := context.WithCancelCause(ctx)
	w := &Watchdog{d: d, cancel: cancel}
	w.t = time.AfterFunc(d, func() { cancel(fmt.Errorf("%w within %s", ErrNoProgress, d)) })
	return wctx, w
}

// Touch records progress: the deadline is d from now again.
func (w *Watchdog) Touch() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Reset(w.d)
}

// Stop ends the context and the timer.
func (w *Watchdog) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Stop()
	w.cancel(context.Canceled)
}

// CleanupTimeout bounds the cleanup done after a caller stopped waiting
// for its work (a rollback, an unlock, a final status write, closing a
// connection). Each is quick on a live server; on a stalled or dead one
// the bound gives the connection up, which the server treats as a
// rollback and a release of the session's locks.
const CleanupTimeout = 5 * time.Second

// Cleanup returns a context for cleanup after ctx: one that ctx's end
// does not cancel, bounded by CleanupTimeout.
func Cleanup(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
}

// Rollback rolls tx back within CleanupTimeout, whether or not ctx has
// ended; a rollback after a commit does nothing.
func Rollback(ctx context.Context, tx interface {
	Rollback(context.Context) error
}) {
	cctx, cancel := Cleanup(ctx)
	defer cancel()
	_ = tx.Rollback(cctx)
}

// Close closes a connection within CleanupTimeout, whether or not ctx
// has ended.
func Close(ctx context.Context, conn interface {
	Close(context.Context) error
}) {
	cctx, cancel := Cleanup(ctx)
	defer cancel()
	_ = conn.Close(cctx)
}
