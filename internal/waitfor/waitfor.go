// Package waitfor is the one way tests wait: for a condition, never for a
// length of time. Until polls a condition until it holds and fails the
// test, naming what it waited for, when Timeout passes first. A test that
// needs a state reached inside the code under test uses a hook or a
// channel the code signals instead; Until is for conditions only an
// outside observer can check (rows in a table, a metric, a log line).
package waitfor

import (
	"os"
	"testing"
	"time"
)

// Timeout is how long Until waits: generous, so that a slow, busy machine
// is not taken for a defect. TIDEMARK_TEST_WAIT (a Go duration) overrides
// it.
var Timeout = timeout()

// interval is how often Until checks the condition.
const interval = 10 * time.Millisecond

func timeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("TIDEMARK_TEST_WAIT")); err == nil && d > 0 {
		return d
	}
	return 60 * time.Second
}

// Until calls cond until it returns true and fails tb when Timeout passes
// first, saying "waited ... for <what>".
func Until(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	Within(tb, Timeout, what, cond)
}

// Within is Until with a limit of its own, for a condition whose time is
// part of what the test checks (a deadline the code must meet).
func Within(tb testing.TB, limit time.Duration, what string, cond func() bool) {
	tb.Helper()
	if err := Poll(limit, cond); err != nil {
		tb.Fatalf("waited %s for %s", limit, what)
	}
}

// ErrTimeout is returned by Poll when the limit passed first.
var ErrTimeout = errTimeout{}

type errTimeout struct{}

func (errTimeout) Error() string { return "the condition did not hold in time" }

// Poll calls cond until it returns true and returns nil, or ErrTimeout
// when limit passes first: for callers that cannot fail a test from where
// they run (a property test's own failure function, a goroutine).
func Poll(limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return ErrTimeout
		}
		time.Sleep(interval)
	}
	return nil
}
