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
)

// TestCitusWatermarkAcrossTwoPhaseCommit: on a Citus warehouse a load is
// committed on the coordinator before its COMMIT PREPARED reaches the
// workers. Holding that message back from one worker, a reconcile run
// sees the load's ledger row below its bound while the load's rows on
// that worker are invisible; the aggregate must still end up counting
// every event once the worker commits.
func TestCitusWatermarkAcrossTwoPhaseCommit(t *testing.T) {
	cluster := pgtest.SharedCluster(t)
	w0, w1 := cluster.Workers[0], cluster.Workers[1]
	proxy, err := faultproxy.New(fmt.Sprintf("%s:%d", w1.Host, w1.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	dsn := cluster.NewDatabase(t, pgtest.ClusterOptions{WorkerAddrs: []string{fmt.Sprintf("%s:%d", w0.Host, w0.Port), proxy.Addr()}})
	b := setupOn(t, dsn, 1, dailySales("correction"))
	b.startIngest()
	// The first event creates the day's raw partition, whose DDL commits
	// in two phases too.
	b.ingestAt("2026-10-01 00:05", event(0, "e0", "2026-10-01T00:01:00Z", "1.00"))
	r, _ := b.reconciler()
	b.runOnce(r, "daily_sales")

	proxy.Hold([]byte("COMMIT PREPARED"))
	var recs []*kgo.Record
	for i := 1; i <= 20; i++ {
		recs = append(recs, event(0, fmt.Sprintf("e%d", i), "2026-10-01T00:02:00Z", "1.00"))
	}
	b.ingestAt("2026-10-01 00:10", recs...) // the offsets commit on the coordinator
	select {
	case <-proxy.Held():
	case <-time.After(time.Minute):
		t.Fatal("no COMMIT PREPARED was sent to the second worker")
	}
	var visible int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM raw.app_events").Scan(&visible); err != nil {
		t.Fatal(err)
	}
	if visible == 21 {
		t.Fatal("every raw row is visible while one worker has not committed: the test holds nothing back")
	}
	// A run while the worker's part is in doubt must not move the bound
	// past the load without its rows; it may wait or fail.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, runErr := r.RunOnce(ctx, "daily_sales", true)
	cancel()
	t.Logf("run while a worker's COMMIT PREPARED is held: %v (%d of 21 raw rows visible)", runErr, visible)
	proxy.Release()
	waitfor.Until(t, "every raw row to be visible", func() bool {
		var n int
		err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM raw.app_events").Scan(&n)
		return err == nil && n == 21
	})
	b.runOnce(r, "daily_sales")
	got := b.rows("SELECT sale_date, total::text, event_count FROM daily_sales ORDER BY 1")
	want := []string{"2026-10-01 | 21.00 | 21"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("daily_sales = %v, want %v", got, want)
	}
}
