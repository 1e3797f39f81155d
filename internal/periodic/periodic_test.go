package periodic_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/periodic"
)

// TestLoop: runs repeat until the context ends, failures back off and do
// not end the loop, a final error does, and each run has its timeout.
func TestLoop(t *testing.T) {
	t.Run("until cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		runs := 0
		j := periodic.Job{Name: "job", Run: func(context.Context) error {
			runs++
			if runs == 3 {
				cancel()
			}
			return nil
		}}
		if err := j.Loop(ctx); err != nil || runs != 3 {
			t.Errorf("Loop = %v after %d runs, want nil after 3", err, runs)
		}
	})
	t.Run("failures back off, a success resets", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var waits []time.Duration
		runs := 0
		j := periodic.Job{Name: "job", Every: time.Hour, Backoff: backoff.Backoff{First: time.Millisecond, Max: 4 * time.Millisecond},
			Run: func(context.Context) error {
				runs++
				if runs == 6 {
					cancel()
				}
				if runs == 4 {
					return nil
				}
				return errors.New("down")
			},
			Next: func(err error, wait time.Duration) time.Duration {
				waits = append(waits, wait)
				if err == nil {
					return 0
				}
				return wait
			}}
		if err := j.Loop(ctx); err != nil {
			t.Fatal(err)
		}
		want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, time.Hour, time.Millisecond}
		if len(waits) != len(want) {
			t.Fatalf("waits %v, want %v", waits, want)
		}
		for i := range want {
			if waits[i] != want[i] {
				t.Errorf("wait %d = %s, want %s", i, waits[i], want[i])
			}
		}
	})
	t.Run("from the start of each run", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		const took = 20 * time.Millisecond
		var waits []time.Duration
		runs := 0
		j := periodic.Job{Name: "job", Every: time.Hour, FromStart: true,
			Run: func(context.Context) error {
				runs++
				if runs == 2 {
					cancel()
				}
				time.Sleep(took) // the run's own work, which the wait leaves out
				return nil
			},
			Next: func(_ error, wait time.Duration) time.Duration {
				waits = append(waits, wait)
				return 0
			}}
		if err := j.Loop(ctx); err != nil {
			t.Fatal(err)
		}
		if len(waits) != 1 || waits[0] > time.Hour-took || waits[0] < time.Hour-time.Minute {
			t.Errorf("waits %v, want one of an hour less the run's %s", waits, took)
		}
	})
	t.Run("at once after a run longer than Every", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var waits []time.Duration
		j := periodic.Job{Name: "job", Every: time.Millisecond, FromStart: true,
			Run: func(context.Context) error {
				time.Sleep(5 * time.Millisecond) // the run's own work, longer than Every: not a wait
				return nil
			},
			Next: func(_ error, wait time.Duration) time.Duration {
				waits = append(waits, wait)
				cancel()
				return wait
			}}
		if err := j.Loop(ctx); err != nil {
			t.Fatal(err)
		}
		if len(waits) != 1 || waits[0] > 0 {
			t.Errorf("waits %v, want one of none", waits)
		}
	})
	t.Run("a final error ends it", func(t *testing.T) {
		final := errors.New("misconfigured")
		j := periodic.Job{Name: "job", Run: func(context.Context) error { return final },
			Final: func(err error) bool { return errors.Is(err, final) }}
		if err := j.Loop(context.Background()); !errors.Is(err, final) {
			t.Errorf("Loop = %v, want %v", err, final)
		}
	})
	t.Run("each run has its timeout", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		j := periodic.Job{Name: "job", Timeout: time.Millisecond, Run: func(rctx context.Context) error {
			<-rctx.Done() // ends by the run's timeout, not the loop's context
			cancel()
			return rctx.Err()
		}}
		if err := j.Loop(ctx); err != nil {
			t.Errorf("Loop = %v", err)
		}
	})
}
