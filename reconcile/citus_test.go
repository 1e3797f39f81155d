package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// TestCitusWatermarkAcrossTwoPhaseCommit: on a Citus warehouse a load is
// committed on the coordinator before its COMMIT PREPARED reaches the
// workers. Holding that message back from one worker, a reconcile run
// sees the load's ledger row below its bound while the load's rows on
// that worker are invisible; every event must still be counted once the
// worker commits: within the horizon in the rebuilt partition (which the
// rebuild's own wait guards), beyond it in tidemark.corrections (which the
// claim reads from the raw rows, guarded by the claim's wait).
func TestCitusWatermarkAcrossTwoPhaseCommit(t *testing.T) {
	for _, tc := range []struct {
		name, loadedAt, query string
		want                  []string
	}{
		{"within the horizon", "2026-10-01 00:10", "SELECT sale_date, total::text, event_count FROM daily_sales ORDER BY 1",
			[]string{"2026-10-01 | 21.00 | 21"}},
		{"beyond the horizon", "2026-10-06 00:10", "SELECT count(*) FROM tidemark.corrections WHERE aggregate = 'daily_sales'",
			[]string{"20"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, proxy, r := citusSetup(t)
			proxy.Hold([]byte("COMMIT PREPARED"))
			var recs []*kgo.Record
			for i := 1; i <= 20; i++ {
				recs = append(recs, event(0, fmt.Sprintf("e%d", i), "2026-10-01T00:02:00Z", "1.00"))
			}
			b.ingestAt(tc.loadedAt, recs...) // the offsets commit on the coordinator
			select {
			case <-proxy.Held():
			case <-time.After(time.Minute):
				t.Fatal("no COMMIT PREPARED was sent to the second worker")
			}
			visible := rawRows(t, b)
			if visible == 21 {
				t.Fatal("every raw row is visible while one worker has not committed: the test holds nothing back")
			}
			// A run while the worker's part is in doubt must not move the
			// bound past the load without its rows; it may wait or fail.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, runErr := r.RunOnce(ctx, "daily_sales", true)
			cancel()
			t.Logf("run while a worker's COMMIT PREPARED is held: %v (%d of 21 raw rows visible)", runErr, visible)
			proxy.Release()
			waitfor.Until(t, "every raw row to be visible", func() bool { return rawRows(t, b) == 21 })
			b.runOnce(r, "daily_sales")
			if got := b.rows(tc.query); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("%s: %v, want %v", tc.query, got, tc.want)
			}
		})
	}
}

// citusSetup is setup on a Citus database whose second worker is behind a
// fault proxy, with daily_sales (correction policy, 72h horizon), an
// ingester and a reconciler; one event is loaded and reconciled first, so
// that the day's raw partition (whose DDL commits in two phases too)
// exists.
func citusSetup(t *testing.T) (*bundle, *faultproxy.Proxy, *reconcile.Reconciler) {
	t.Helper()
	dsn, proxy := pgtest.SharedCluster(t).NewDatabaseBehindProxy(t, 1)
	b := setupOn(t, dsn, 1, dailySales("correction"))
	b.startIngest()
	b.ingestAt("2026-10-01 00:05", event(0, "e0", "2026-10-01T00:01:00Z", "1.00"))
	r, _ := b.reconciler()
	b.runOnce(r, "daily_sales")
	return b, proxy, r
}

// rawRows counts the raw rows visible now.
func rawRows(t *testing.T, b *bundle) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM raw.app_events").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
