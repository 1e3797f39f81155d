package waitfor_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestPollHolds: Poll returns nil as soon as the condition holds, also
// when it holds at the first check.
func TestPollHolds(t *testing.T) {
	if err := waitfor.Poll(time.Minute, func() bool { return true }); err != nil {
		t.Fatalf("a condition that holds: %v", err)
	}
	calls := 0
	if err := waitfor.Poll(time.Minute, func() bool { calls++; return calls == 3 }); err != nil || calls != 3 {
		t.Fatalf("a condition that holds at the third check: %v after %d checks", err, calls)
	}
}

// TestPollTimeout: Poll returns ErrTimeout once the limit has passed, and
// not before.
func TestPollTimeout(t *testing.T) {
	const limit = 100 * time.Millisecond
	began := time.Now()
	err := waitfor.Poll(limit, func() bool { return false })
	if took := time.Since(began); !errors.Is(err, waitfor.ErrTimeout) || took < limit {
		t.Fatalf("a condition that never holds: %v after %s, want ErrTimeout after at least %s", err, took, limit)
	}
}

// TestPollSlowCondition: a condition whose check takes a while is not
// checked back to back: Poll pauses as long as the check took.
func TestPollSlowCondition(t *testing.T) {
	const check, limit = 40 * time.Millisecond, 400 * time.Millisecond
	calls := 0
	_ = waitfor.Poll(limit, func() bool {
		calls++
		time.Sleep(check) // the work of a slow check, not a wait
		return false
	})
	// A check and its pause take at least 80 ms: checks start at 0, 80,
	// ... 400 ms at the latest, six of them; back to back there would be
	// eleven.
	if calls > 6 {
		t.Errorf("%d checks of %s in %s, want at most 6", calls, check, limit)
	}
}

// TestUntil: Until returns once the condition holds.
func TestUntil(t *testing.T) {
	at := time.Now().Add(30 * time.Millisecond)
	waitfor.Until(t, "the time to come", func() bool { return time.Now().After(at) })
	if time.Now().Before(at) {
		t.Error("Until returned before the condition held")
	}
}
