// Package faulttest holds what the fault tests of every component share:
// the standard faults, a PostgreSQL connection string put behind a fault
// proxy, and the check that no goroutine outlives a test.
package faulttest

import (
	"net/url"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// Fault is a network fault injected mid-work: Inject starts it, and the
// test lets the component work for a while before Heal ends it.
type Fault struct {
	Name   string
	Inject func(p *faultproxy.Proxy)
	Heal   func(p *faultproxy.Proxy)
}

// Faults are the faults every component is tested against: latency, a
// stall that heals, a half-open connection, a reset, and refused
// connections that heal.
var Faults = []Fault{
	{"latency", func(p *faultproxy.Proxy) { p.SetLatency(30 * time.Millisecond) }, func(p *faultproxy.Proxy) { p.SetLatency(0) }},
	{"stall then resume", (*faultproxy.Proxy).Stall, (*faultproxy.Proxy).Resume},
	{"half-open", (*faultproxy.Proxy).HalfOpen, func(*faultproxy.Proxy) {}},
	{"reset", (*faultproxy.Proxy).Reset, func(*faultproxy.Proxy) {}},
	{"refuse then resume", func(p *faultproxy.Proxy) { p.Refuse(); p.Reset() }, (*faultproxy.Proxy).Resume},
}

// Front starts a fault proxy in front of the server of dsn (a URL),
// closed when the test ends, and returns dsn through it.
func Front(tb testing.TB, dsn string) (string, *faultproxy.Proxy) {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatalf("faulttest: %v", err)
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		tb.Fatalf("faulttest: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	u.Host = "127.0.0.1:" + strconv.Itoa(p.Port())
	return u.String(), p
}

// leakPatience is how long CheckNoLeaks lets goroutines started by the
// test finish. pgx closes a connection whose context was cancelled in the
// background, after a cancel request; through a proxy that stalled, that
// can outlast goleak's own retries (about 2 s) on a loaded machine. A
// goroutine that still runs after leakPatience is a leak.
const leakPatience = 10 * time.Second

// CheckNoLeaks registers, as the test's first cleanup and so its last, a
// check that no goroutine started during the test outlives it by more than
// leakPatience.
func CheckNoLeaks(tb testing.TB) {
	tb.Helper()
	opts := []goleak.Option{goleak.IgnoreCurrent(),
		// The shared test server, which the first test to need it
		// starts, runs until TestMain ends.
		goleak.IgnoreAnyFunction("github.com/tidemark-dev/tidemark/internal/pgserver.(*Server).start.func1")}
	tb.Cleanup(func() {
		// VerifyNone names the goroutines left after the patience.
		_ = waitfor.Poll(leakPatience, func() bool { return goleak.Find(opts...) == nil })
		goleak.VerifyNone(tb, opts...)
	})
}
