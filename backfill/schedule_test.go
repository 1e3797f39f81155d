package backfill_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// clock is a service clock the test moves.
type clock struct {
	mu    sync.Mutex
	t     time.Time
	calls int // how often now was read: a schedule's tick reads it once
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); c.calls++; return c.t }
func (c *clock) reads() int          { c.mu.Lock(); defer c.mu.Unlock(); return c.calls }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// schedule runs s until the test ends.
func (w *warehouse) schedule(s *backfill.Schedule) {
	w.t.Helper()
	s.Pool, s.Aggregate, s.Check = w.pool, "daily_sales", 20*time.Millisecond
	s.Definition = func(context.Context, string) (*aggregate.Definition, error) { return w.d, nil }
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	w.t.Cleanup(func() { cancel(); <-done })
}

// waitRows waits until sql returns want.
func (w *warehouse) waitRows(what, sql string, want ...string) {
	w.t.Helper()
	var got []string
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		got = w.rows(sql)
		return strings.Join(got, "\n") == strings.Join(want, "\n")
	}); err != nil {
		pgtest.Equal(w.t, what, got, want)
		w.t.FailNow()
	}
}

// TestScheduledVerifyAndRefresh: inside `tidemark run` a verification runs
// every verify_every on the service clock and finds a partition changed by
// hand (a metric and a recorded run say so), a scheduled full refresh then
// repairs it, and the next verification finds nothing.
func TestScheduledVerifyAndRefresh(t *testing.T) {
	w := newWarehouse(t, "correction")
	for i, day := range []string{"01", "02", "03"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", i+1)
	}
	if _, err := w.backfill("2026-09-01", "2026-09-03", backfill.Options{}); err != nil {
		t.Fatal(err)
	}
	// As if the reconciler had read every load.
	w.exec("UPDATE tidemark.load_watermarks SET load_xid = pg_snapshot_xmin(pg_current_snapshot()) WHERE aggregate = 'daily_sales'")
	w.exec("UPDATE daily_sales SET total = total + 1 WHERE sale_date = '2026-09-02'")
	c := &clock{t: w.now}
	reg := prometheus.NewRegistry()
	w.schedule(&backfill.Schedule{VerifyEvery: 24 * time.Hour, Now: c.now, Registerer: reg})

	const runs = "SELECT partitions || ' compared, ' || drifted || ' drifted' FROM tidemark.verify_runs WHERE scheduled ORDER BY id"
	w.waitRows("first verification", runs, "3 compared, 1 drifted")
	if got, _ := promreg.Sum(reg, "tidemark_verify_drifted_partitions"); got != 1 {
		t.Errorf("tidemark_verify_drifted_partitions = %v, want 1", got)
	}
	// Not due again within the interval: the schedule looks again and
	// runs nothing. The verification may read the clock once more after
	// its record; then each tick reads it once, at its start: three reads
	// on, a whole tick has passed since the verification ended.
	read := c.reads()
	waitfor.Until(t, "the schedule to check again after its verification", func() bool { return c.reads() >= read+3 })
	w.waitRows("before the interval", runs, "3 compared, 1 drifted")

	w.schedule(&backfill.Schedule{RefreshEvery: 7 * 24 * time.Hour, Now: c.now, Registerer: reg})
	w.waitRows("scheduled refresh", "SELECT kind || ' ' || status FROM tidemark.backfill_runs WHERE kind = 'refresh'", "refresh done")
	pgtest.Equal(t, "daily_sales after the refresh", w.sales(), []string{"2026-09-01 | 1.00 | 1", "2026-09-02 | 2.00 | 1", "2026-09-03 | 3.00 | 1"})

	c.add(24 * time.Hour)
	w.waitRows("second verification", runs, "3 compared, 1 drifted", "3 compared, 0 drifted")
	if got, _ := promreg.Sum(reg, "tidemark_verify_drifted_partitions"); got != 0 {
		t.Errorf("tidemark_verify_drifted_partitions = %v after the refresh, want 0", got)
	}
	if got, _ := promreg.Sum(reg, "tidemark_refresh_runs_total"); got != 1 {
		t.Errorf("tidemark_refresh_runs_total = %v, want 1", got)
	}
}
