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

// interval is the pause between two checks of a condition. A check that
// takes longer (a query over a whole table, a request to the service) is
// followed by a pause as long as it took, so that waiting takes at most
// half of a core from the code waited for.
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

// Within is Until with a limit of its own: for a condition whose time is
// part of what the test checks (a deadline the code must meet), or for
// one that the size of the work makes take longer than Timeout (a
// benchmark's load, a backlog built up across crashes).
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
// they run (a property test's own failure function, a goroutine), and for
// those that say more on failure than what they waited for (the last
// state seen, the output of the process under test).
func Poll(limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for {
		began := time.Now()
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return ErrTimeout
		}
		time.Sleep(max(interval, time.Since(began)))
	}
}
