package reconcile_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// TestAggregateOverPollSource: the ledger rows of poll runs drive the
// reconciler like those of Kafka ingestion. An aggregate of an orders
// table's changes by day is rebuilt for exactly the days a run touched and
// equals a full recompute.
func TestAggregateOverPollSource(t *testing.T) {
	ctx := context.Background()
	_, srcDSN, wh, whDSN, exec := sourceAndWarehouse(t)
	exec(`CREATE TABLE orders (order_id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, updated_at timestamptz NOT NULL)`)
	exec(`INSERT INTO orders SELECT i, i, timestamptz '2026-10-03 00:00+00' + i * interval '1 hour' FROM generate_series(1, 60) AS i`)
	yaml := fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  orders:
    poll: {dsn: %q, table: orders, key: [order_id], updated_at: updated_at, lookback: 2h}
    mirror: {table: dw_orders}
aggregates:
  daily_order_changes:
    source: orders
    table: daily_order_changes
    partition: {by: day, column: day}
    lateness_horizon: 30d
    sql: |
      SELECT {{partition}} AS day, count(*)::int AS changes, count(*) FILTER (WHERE op = 'insert')::int AS new_orders,
             sum((payload->>'amount')::numeric) AS amount
      FROM {{events}}
`, whDSN, srcDSN)
	cfg := parseConfig(t, yaml)
	clk := clock.New(at("2026-10-06 12:00"))
	pc, err := poll.ConfigFrom(cfg, "orders")
	if err != nil {
		t.Fatal(err)
	}
	p, err := poll.New(pc, wh, poll.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	r, err := reconcile.New(cfg, wh, reconcile.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	poll := func(upper string) {
		t.Helper()
		if _, err := p.RunOnce(ctx, poll.Window{Upper: at(upper)}); err != nil {
			t.Fatal(err)
		}
	}
	reconcileOnce := func() reconcile.Report {
		t.Helper()
		rep, err := r.RunOnce(ctx, "daily_order_changes", true)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	recompute := func() []string {
		t.Helper()
		return rowsOf(t, wh, `SELECT (event_time AT TIME ZONE 'UTC')::date, count(*), count(*) FILTER (WHERE op = 'insert'), sum((payload->>'amount')::numeric)
			FROM raw.orders GROUP BY 1 ORDER BY 1`)
	}

	poll("2026-10-06 12:00")
	if rep := reconcileOnce(); len(rep.Rebuilt) != 3 {
		t.Errorf("first reconcile rebuilt %v, want the three days 3, 4 and 5 October", rep.Rebuilt)
	}
	pgtest.Equal(t, "aggregate after the first load", rowsOf(t, wh, "SELECT day, changes, new_orders, amount FROM daily_order_changes ORDER BY 1"), recompute())

	// An update of an order of 4 October, stamped on 6 October, and a new
	// order of 6 October: only 6 October changes.
	exec(`UPDATE orders SET amount = 1000, updated_at = '2026-10-06 13:00+00' WHERE order_id = 30`)
	exec(`INSERT INTO orders VALUES (61, 61, '2026-10-06 13:30+00')`)
	clk.Set(at("2026-10-06 14:00"))
	poll("2026-10-06 14:00")
	rep := reconcileOnce()
	pgtest.Equal(t, "partitions rebuilt by the second run", rep.Rebuilt, []string{"2026-10-06"})
	pgtest.Equal(t, "aggregate after the change", rowsOf(t, wh, "SELECT day, changes, new_orders, amount FROM daily_order_changes ORDER BY 1"), recompute())
	pgtest.Equal(t, "6 October", rowsOf(t, wh, "SELECT changes, new_orders, amount::text FROM daily_order_changes WHERE day = '2026-10-06'"), []string{"2 | 1 | 1061.00"})
	// The event-time watermark holds back by the lookback, as the poller
	// stores it: rows found through the lookback are up to 2h older than
	// the newest row read (13:30).
	pgtest.Equal(t, "event-time watermark", rowsOf(t, wh, `SELECT to_char(event_time_watermark AT TIME ZONE 'UTC', 'MM-DD HH24:MI')
		FROM tidemark.source_watermarks WHERE source = 'orders'`), []string{"10-06 11:30"})
}

// rowsOf is bundle.rows on any pool.
func rowsOf(t *testing.T, pool *pgxpool.Pool, sql string) []string {
	t.Helper()
	b := &bundle{t: t, pool: pool}
	return b.rows(sql)
}
