package reconcile_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// TestAggregateOverCDCSource: an aggregate over a CDC source's raw change
// rows can be reconciled before the reader has ever run (its raw table is
// created, with nothing to rebuild), and afterwards it is rebuilt from the
// change rows the reader wrote, equal to a full recompute.
func TestAggregateOverCDCSource(t *testing.T) {
	ctx := context.Background()
	_, srcDSN, wh, whDSN, exec := sourceAndWarehouse(t)
	exec(`CREATE TABLE orders (order_id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL)`)
	yaml := fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  shop:
    cdc: {dsn: %q, tables: [orders], snapshot: never, status_every: 200ms}
    mirror: {table: dw_orders, deletes: hard}
aggregates:
  daily_order_changes:
    source: shop
    table: daily_order_changes
    partition: {by: day, column: day}
    lateness_horizon: 2d
    sql: |
      SELECT {{partition}} AS day, count(*)::int AS changes, count(*) FILTER (WHERE op = 'delete')::int AS deletes,
             sum((payload->>'amount')::numeric) FILTER (WHERE op <> 'delete') AS amount
      FROM {{events}}
`, whDSN, srcDSN)
	cfg := parseConfig(t, yaml)
	r, err := reconcile.New(cfg, wh, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(ctx, "daily_order_changes", true)
	if err != nil {
		t.Fatalf("reconcile before the CDC reader ran: %v", err)
	}
	if len(rep.Rebuilt) != 0 {
		t.Errorf("reconcile before the CDC reader ran rebuilt %v, want nothing", rep.Rebuilt)
	}

	// The reader's log, shown when the test fails.
	var logs syncbuf.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the CDC reader's log:\n%s", logs.String())
		}
	})
	cc, err := cdc.ConfigFrom(cfg, "shop")
	if err != nil {
		t.Fatal(err)
	}
	rd, err := cdc.New(cc, wh, cdc.Options{GroupAge: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rd.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	}()
	// The slot must have reached its consistent point before the source
	// writes: transactions that commit before it are not decoded. A slot
	// being created is already listed active in pg_replication_slots
	// (while it waits for the transactions running on the server), so
	// the test waits for the reader to record the slot's consistent point.
	waitfor.Until(t, "the slot to be created", func() bool {
		var created bool
		err := wh.QueryRow(ctx, "SELECT slot_created_lsn IS NOT NULL FROM tidemark.cdc_positions WHERE source = 'shop'").Scan(&created)
		return err == nil && created
	})
	exec(`INSERT INTO orders SELECT i, i FROM generate_series(1, 50) AS i`)
	exec(`UPDATE orders SET amount = amount * 2 WHERE order_id <= 10`)
	exec(`DELETE FROM orders WHERE order_id > 45`)
	waitfor.Until(t, "the 65 changes to be applied", func() bool {
		var n int64
		err := wh.QueryRow(ctx, "SELECT count(*) FROM raw.shop").Scan(&n)
		return err == nil && n == 65
	})

	rep, err = r.RunOnce(ctx, "daily_order_changes", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rebuilt) == 0 {
		t.Error("reconcile after the changes rebuilt nothing")
	}
	pgtest.Equal(t, "aggregate over the CDC change rows",
		rowsOf(t, wh, "SELECT day, changes, deletes, amount FROM daily_order_changes ORDER BY 1"),
		rowsOf(t, wh, `SELECT (event_time AT TIME ZONE 'UTC')::date, count(*), count(*) FILTER (WHERE op = 'delete'),
			sum((payload->>'amount')::numeric) FILTER (WHERE op <> 'delete') FROM raw.shop GROUP BY 1 ORDER BY 1`))
	pgtest.Equal(t, "changes in the aggregate", rowsOf(t, wh, "SELECT sum(changes), sum(deletes) FROM daily_order_changes"), []string{"65 | 5"})
}
