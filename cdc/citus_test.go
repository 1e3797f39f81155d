package cdc_test

import (
	"testing"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/testkit/docsql"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestCitusConvertMirror runs the mirror conversion that docs/citus.md
// gives for a warehouse whose mirrors were created on the coordinator: a
// CDC source followed with warehouse.distribute false, the reader
// stopped, the page's SQL run as written, the reader started again with
// the default. Inserts, updates (a key among them) and deletes before and
// after leave both mirrors equal to the source; the converted mirror is
// distributed by its key and the other one stays where it was.
func TestCitusConvertMirror(t *testing.T) {
	pgtest.OnlyOnCitus(t)
	e := newCDCEnv(t)
	local := e.config("snapshot: never", "deletes: hard")
	local.Warehouse.Distribute = false
	done, stop := e.run(local, cdc.Options{})
	e.waitStreaming(done)
	e.exec(`INSERT INTO customers SELECT i, 'c' || i, NULL, NULL, NULL FROM generate_series(1, 20) AS i`)
	e.exec(`INSERT INTO orders SELECT i, i % 20 + 1, i, '2026-10-05 09:00+00' FROM generate_series(1, 300) AS i`)
	e.exec(`UPDATE orders SET amount = amount + 1 WHERE id % 3 = 0`)
	e.exec(`DELETE FROM orders WHERE id % 7 = 0`)
	e.waitMirrored("")
	stop()
	if err := <-done; err != nil {
		t.Fatalf("reader: %v", err)
	}
	if got := pgtest.Placement(t, e.wh, "mirror.orders"); got != "" {
		t.Fatalf("mirror.orders is %q under warehouse.distribute false", got)
	}

	for _, q := range docsql.Statements(t, "../docs/citus.md", "Converting an existing warehouse", "mirror.orders") {
		if _, err := e.wh.Exec(e.ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if got := pgtest.Placement(t, e.wh, "mirror.orders"); got != "distributed by id" {
		t.Fatalf("after the conversion mirror.orders is %q, want distributed by id", got)
	}
	e.startWith(e.config("snapshot: never", "deletes: hard"), cdc.Options{})
	e.exec(`INSERT INTO orders SELECT i, i % 20 + 1, i, '2026-10-06 09:00+00' FROM generate_series(301, 600) AS i`)
	e.exec(`UPDATE orders SET id = id + 10000 WHERE id % 5 = 0`)
	e.exec(`UPDATE orders SET amount = amount * 2 WHERE id % 4 = 0`)
	e.exec(`DELETE FROM orders WHERE id % 11 = 0`)
	e.exec(`UPDATE customers SET tier = 'gold' WHERE id % 2 = 0`)
	e.waitMirrored("")
	if got := pgtest.Placement(t, e.wh, "mirror.customers"); got != "" {
		t.Errorf("mirror.customers, which existed on the coordinator, is now %q", got)
	}
}
