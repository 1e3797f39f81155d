package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
)

// ordersDDL is the application's orders table, followed through logical
// replication. With REPLICA IDENTITY FULL a delete carries the whole old
// row, which the raw change row keeps.
const ordersDDL = `
CREATE TABLE orders (order_id bigint PRIMARY KEY, status text NOT NULL, amount numeric(12,2) NOT NULL);
ALTER TABLE orders REPLICA IDENTITY FULL;
INSERT INTO orders VALUES (1, 'placed', 20.00), (2, 'placed', 35.50)`

// cdcPart runs the CDC reader of the source shop, the way `tidemark run`
// does, over the application's orders table: an initial snapshot, then
// inserts, updates, a hard delete and a rolled-back transaction.
func (d *run) cdcPart(cfg *config.Config, src *pgxpool.Pool) error {
	fmt.Fprintln(d.out, "Part 3: the application's orders table, followed through logical replication (tidemark creates the")
	fmt.Fprintln(d.out, "publication and the slot) into the mirror dw_orders, with every change recorded in raw.shop. A change's")
	fmt.Fprintln(d.out, "event time is its commit time at the source, which is real time, not the demo clock:")
	if _, err := src.Exec(d.ctx, ordersDDL); err != nil {
		return err
	}
	cc, err := cdc.ConfigFrom(cfg, "shop")
	if err != nil {
		return err
	}
	rd, err := cdc.New(cc, d.pool, cdc.Options{Now: d.clk.Now, Logger: d.log})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(d.ctx)
	done := make(chan error, 1)
	go func() { done <- rd.Run(ctx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	defer func() { _ = stop() }()

	fmt.Fprintln(d.out, "  orders 1 and 2 exist before the reader starts: the initial snapshot copies them")
	if err := d.waitFor(done, "the initial snapshot", `SELECT count(*) FROM tidemark.cdc_positions WHERE source = 'shop' AND snapshot = 'done'`, 1); err != nil {
		return err
	}
	steps := []struct {
		what    string
		sql     string
		changes int64 // raw change rows after the step
	}{
		{"order 3 is placed and order 1 is paid, in one transaction",
			`BEGIN; INSERT INTO orders VALUES (3, 'placed', 12.00); UPDATE orders SET status = 'paid' WHERE order_id = 1; COMMIT`, 2},
		{"order 2 is deleted at the source (a hard delete, which no updated_at would show)",
			`DELETE FROM orders WHERE order_id = 2`, 3},
		{"a transaction that inserts order 4 and deletes order 3 rolls back: nothing of it arrives",
			`BEGIN; INSERT INTO orders VALUES (4, 'placed', 1.00); DELETE FROM orders WHERE order_id = 3; ROLLBACK`, 3},
		{"order 3 is paid",
			`UPDATE orders SET status = 'paid' WHERE order_id = 3`, 4},
	}
	for _, s := range steps {
		if _, err := src.Exec(d.ctx, s.sql); err != nil {
			return err
		}
		if err := d.waitFor(done, s.what, `SELECT count(*) FROM raw.shop`, s.changes); err != nil {
			return err
		}
		fmt.Fprintf(d.out, "  %s\n      raw change rows so far: %d\n", s.what, s.changes)
	}
	if err := stop(); err != nil {
		return fmt.Errorf("cdc reader: %w", err)
	}
	fmt.Fprintln(d.out)
	if err := d.table("dw_orders: the mirror equals the source table (order 2 is gone, the rolled-back changes never came)",
		`SELECT order_id, status, amount::text FROM dw_orders ORDER BY order_id`); err != nil {
		return err
	}
	return d.table("raw.shop: one row per change, in commit order, with its source commit time as event time (snapshot rows are not changes)", `
SELECT op, source_table, row_key, payload->>'status' AS status, old_row IS NOT NULL AS old_row_sent
FROM raw.shop ORDER BY commit_lsn, split_part(event_id, '/', 3)::int`)
}

// waitFor polls query, which counts something, until it reaches want; the
// reader ending or a minute passing is an error.
func (d *run) waitFor(done chan error, what, query string, want int64) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var n int64
		if err := d.pool.QueryRow(d.ctx, query).Scan(&n); err == nil && n >= want {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("cdc reader stopped while waiting for %s: %v", what, err)
		case <-d.ctx.Done():
			return d.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited a minute for %s", what)
		}
	}
}
