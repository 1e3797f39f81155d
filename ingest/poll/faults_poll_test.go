package poll_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// recoveryBound is how soon after a fault heals the component must have
// caught up: the test timeouts (1s write_timeout and session limits) plus
// backoff, with room for a slow machine.
const recoveryBound = 30 * time.Second

// TestPollFaults runs a poll source while the source or the warehouse
// connection misbehaves, and checks that the mirror ends equal to the
// source and the raw table holds each version once, soon after the fault
// heals.
func TestPollFaults(t *testing.T) {
	for _, side := range []string{"source", "warehouse"} {
		for _, f := range faulttest.Faults {
			t.Run(side+"/"+f.Name, func(t *testing.T) {
				faulttest.CheckNoLeaks(t)
				e := newPollEnv(t, customersDDL)
				srcDSN, whDSN := e.srcDSN, e.whDSN
				var px *faultproxy.Proxy
				if side == "source" {
					srcDSN, px = faulttest.Front(t, srcDSN)
				} else {
					whDSN, px = faulttest.Front(t, whDSN)
				}
				cfg := e.config("every: 1s\nsafety_lag: 0s\nchunk_rows: 20")
				cfg.Sources["customers"].Poll.DSN = srcDSN
				cfg.Warehouse.DSN = whDSN
				shortLimits(cfg)
				pool, err := pgconnect.Pool(e.ctx, cfg.Warehouse.Settings(), "tidemark-test")
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				p, err := poll.New(pollConfig(t, cfg, "customers"), pool, poll.Options{Now: e.clock.Now})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(e.ctx)
				done := make(chan error, 1)
				go func() { done <- p.Run(ctx) }()
				defer func() {
					cancel()
					select {
					case err := <-done:
						if err != nil {
							t.Errorf("poll Run: %v", err)
						}
					case <-time.After(30 * time.Second):
						t.Errorf("poller did not stop within 30s")
					}
				}()

				insert := func(from, to int) {
					for i := from; i < to; i++ {
						e.srcExec(`INSERT INTO src_customers VALUES ($1, $2, 'gold', clock_timestamp())`, i, fmt.Sprintf("c%d@example.com", i))
					}
				}
				insert(0, 100)
				waitfor.Until(t, "first rows mirrored", func() bool { return count(t, e, "dw_customers") >= 100 })
				f.Inject(px)
				insert(100, 150)
				time.Sleep(2 * time.Second) // the fault's duration, not a wait
				f.Heal(px)
				healed := time.Now()
				insert(150, 200)
				waitfor.Within(t, recoveryBound, "the mirror to catch up", func() bool { return count(t, e, "dw_customers") == 200 })
				t.Logf("caught up %s after the fault healed", time.Since(healed).Round(time.Millisecond))
				pgtest.Equal(t, "mirror", pgtest.Lines(t, e.wh, `SELECT customer_id, email, tier, updated_at FROM dw_customers ORDER BY 1`),
					pgtest.Lines(t, e.src, `SELECT customer_id, email, tier, updated_at FROM src_customers ORDER BY 1`))
				if n, d := count(t, e, "raw.customers"), distinct(t, e); n != 200 || d != 200 {
					t.Errorf("raw.customers holds %d rows, %d distinct; want 200 each", n, d)
				}
			})
		}
	}
}

// shortLimits sets the client deadline and the session limits of the
// warehouse to a second, so that a stalled connection is given up, and a
// session the client lost ends, within the test's time.
func shortLimits(cfg *config.Config) {
	cfg.Warehouse.WriteTimeout = config.Duration(time.Second)
	idle := config.Duration(time.Second)
	cfg.Warehouse.IdleInTransactionSessionTimeout = idle
}

// count is the number of rows of a warehouse table, -1 while it does
// not exist.
func count(t *testing.T, e *pollEnv, table string) int64 {
	t.Helper()
	var n int64
	if err := e.wh.QueryRow(e.ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		return -1
	}
	return n
}

// distinct is the number of distinct change versions of raw.customers.
func distinct(t *testing.T, e *pollEnv) int64 {
	t.Helper()
	var n int64
	if err := e.wh.QueryRow(e.ctx, "SELECT count(DISTINCT (event_id, event_time)) FROM raw.customers").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
