package backoff_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/backoff"
)

func TestDelay(t *testing.T) {
	for _, tt := range []struct {
		failures int
		want     time.Duration
	}{{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {5, 16 * time.Second}, {6, 30 * time.Second}, {60, 30 * time.Second}} {
		if got := backoff.Delay(time.Second, 30*time.Second, tt.failures); got != tt.want {
			t.Errorf("Delay after %d failures = %s, want %s", tt.failures, got, tt.want)
		}
	}
}

// TestNext: the delays double up to the cap, each within its jitter, and
// Reset starts over.
func TestNext(t *testing.T) {
	b := backoff.Backoff{First: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		got := b.Next()
		if got > want || got < want/2 {
			t.Errorf("delay %d = %s, want in [%s, %s]", i+1, got, want/2, want)
		}
	}
	if b.Failures() != 6 {
		t.Errorf("Failures = %d, want 6", b.Failures())
	}
	b.Reset()
	if got := b.Next(); got > 100*time.Millisecond {
		t.Errorf("after Reset: %s", got)
	}
}

// TestWaitEndsWithContext: a cancelled context ends the wait at once.
func TestWaitEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := backoff.Backoff{First: time.Hour, Max: time.Hour}
	if err := b.Wait(ctx); err != context.Canceled {
		t.Errorf("Wait = %v, want context.Canceled", err)
	}
}
