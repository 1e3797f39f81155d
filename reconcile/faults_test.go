package reconcile_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// recoveryBound is how soon after a fault heals the reconciler must have
// caught up: a short run timeout and session limits, plus a tick, with
// room for a slow machine.
const recoveryBound = 30 * time.Second

// TestReconcileFaults runs the reconciler, on a warehouse pool of its own
// behind a fault proxy, while events keep arriving for several days, and
// checks that soon after the fault heals every partition of daily_sales
// equals a rebuild from the raw table, no partition is left queued or
// failing, and the reconciler is still running.
func TestReconcileFaults(t *testing.T) {
	for _, f := range faulttest.Faults {
		t.Run(f.Name, func(t *testing.T) {
			b := setup(t, 2, dailySales("correction"))
			b.cfg.Reconcile.Every = config.Duration(200 * time.Millisecond)
			b.cfg.Reconcile.RunTimeout = config.Duration(2 * time.Second)
			b.startIngest()

			w := b.cfg.Warehouse
			var px *faultproxy.Proxy
			w.DSN, px = faulttest.Front(t, b.dsn)
			w.WriteTimeout = config.Duration(time.Second)
			idle := config.Duration(time.Second)
			w.IdleInTransactionSessionTimeout = idle
			w.StatementTimeout = config.Duration(2 * time.Second)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pool, err := pgconnect.Pool(ctx, w.Settings(), "tidemark-test")
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				start := time.Now()
				pool.Close()
				t.Logf("reconciler pool closed in %s", time.Since(start).Round(time.Millisecond))
			}()
			r, err := reconcile.New(b.cfg, pool, reconcile.Options{Now: b.clock.Now, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			defer func() {
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("reconciler Run: %v", err)
					}
				case <-time.After(recoveryBound):
					t.Errorf("reconciler did not stop within %s", recoveryBound)
				}
			}()

			n := 0
			events := func(k int) []*kgo.Record {
				var recs []*kgo.Record
				for i := 0; i < k; i++ {
					day := 3 + n%3 // 2026-10-03 to 2026-10-05, within the horizon
					recs = append(recs, event(int32(n%2), fmt.Sprintf("e%d", n),
						fmt.Sprintf("2026-10-%02dT%02d:%02d:00Z", day, n%10, n%60), strconv.Itoa(1+n%7)))
					n++
				}
				return recs
			}
			b.ingestAt("2026-10-05 10:00", events(30)...)
			waitConsistent(t, b, done, recoveryBound, "the first rebuilds")

			f.Inject(px)
			b.ingestAt("2026-10-05 10:00", events(30)...)
			time.Sleep(2 * time.Second) // the fault's duration, not a wait
			b.ingestAt("2026-10-05 10:00", events(30)...)
			f.Heal(px)
			healed := time.Now()
			b.ingestAt("2026-10-05 10:00", events(30)...)
			waitConsistent(t, b, done, recoveryBound, "the reconciler to catch up after the fault")
			t.Logf("caught up %s after the fault healed", time.Since(healed).Round(time.Millisecond))
			failing := pgtest.Lines(t, b.pool, `SELECT partition_start::text, attempts, coalesce(last_error, '')
				FROM tidemark.pending_partitions WHERE aggregate = 'daily_sales'`)
			pgtest.Equal(t, "pending or failing partitions", failing, nil)
		})
	}
}

// waitConsistent waits until daily_sales equals a rebuild from the raw
// table, no partition is pending and the load watermark has passed every
// load in the ledger, failing the test if the reconciler stops or timeout
// passes first. Without the last condition a rebuild may already have
// read a load that the next claim has yet to read: that claim queues the
// load's partitions once more, and a check for an empty queue made just
// before it passes while one made just after fails.
func waitConsistent(t *testing.T, b *bundle, done <-chan error, timeout time.Duration, what string) {
	t.Helper()
	const (
		got = `SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1`
		// want is the aggregate's query over the whole raw table: what
		// rebuilding every partition gives.
		want = `SELECT event_time::date::text, sum((payload->>'amount')::numeric(12,2))::text, count(*)::int
			FROM raw.app_events GROUP BY 1 ORDER BY 1`
		// pending counts queued partitions and loads the claims have not read.
		pending = `SELECT (SELECT count(*) FROM tidemark.pending_partitions WHERE aggregate = 'daily_sales')
			+ (SELECT count(*) FROM tidemark.ingest_ledger l
			   WHERE l.load_xid >= coalesce((SELECT load_xid FROM tidemark.load_watermarks WHERE aggregate = 'daily_sales'), '0'::xid8))`
	)
	var exists bool
	var g, w []string
	var queued int
	err := waitfor.Poll(timeout, func() bool {
		select {
		case err := <-done:
			t.Fatalf("waiting for %s: the reconciler stopped: %v", what, err)
		default:
		}
		// The reconciler creates daily_sales when it starts, which a
		// loaded machine may not have reached yet.
		if err := b.pool.QueryRow(context.Background(), "SELECT to_regclass('daily_sales') IS NOT NULL").Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if !exists {
			return false
		}
		g, w = pgtest.Lines(t, b.pool, got), pgtest.Lines(t, b.pool, want)
		if err := b.pool.QueryRow(context.Background(), pending).Scan(&queued); err != nil {
			t.Fatal(err)
		}
		return queued == 0 && fmt.Sprint(g) == fmt.Sprint(w)
	})
	if err == nil {
		return
	}
	if !exists {
		t.Fatalf("waiting for %s: daily_sales was not created within %s", what, timeout)
	}
	pgtest.Equal(t, "daily_sales against a rebuild", g, w)
	t.Fatalf("waiting for %s: not consistent within %s (%d partitions queued or loads unclaimed)", what, timeout, queued)
}
