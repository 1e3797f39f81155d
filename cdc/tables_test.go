package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// customerChurn changes customers (updates, deletes, inserts, key
// changes) and orders until stop is closed.
func customerChurn(ctx context.Context, e *cdcEnv, stop <-chan struct{}) <-chan error {
	rng := rand.New(rand.NewPCG(3, 4))
	return runWorkload(ctx, e, stop, func(i int64) []statement {
		next := 100000 + i
		id := func() int64 { return 1 + rng.Int64N(next) }
		return []statement{
			// A row with a TOASTed value (see TestTableAdded).
			{`UPDATE customers SET tier = 'gold' || $1 WHERE id = $1`, 10 * (1 + rng.Int64N(500))},
			{`DELETE FROM customers WHERE id = $1`, id()},
			{`INSERT INTO customers VALUES ($1, 'new', 'free', NULL, NULL) ON CONFLICT DO NOTHING`, next},
			{`UPDATE customers SET id = id + 50000000 WHERE id = $1 AND id < 50000000`, id()},
			{`INSERT INTO orders VALUES ($1, 1, 2.00, '2026-10-06 09:00+00') ON CONFLICT DO NOTHING`, next},
		}
	})
}

// resyncOf is the latest resync of a table of shop.
func resyncOf(t *testing.T, e *cdcEnv, table string) (cdc.Resync, bool) {
	t.Helper()
	r, had, err := cdc.LastResync(e.ctx, e.wh, "shop", table)
	if err != nil {
		t.Fatal(err)
	}
	return r, had
}

// TestTableAdded is acceptance item 2 of the live operations: a table
// added to cdc.tables of a running source (whether the publication lacks
// it or already has it) is copied while changes to it and to the other
// table stream, and streamed from then on; the other table's mirror is not
// copied again, and a later start takes nothing on.
func TestTableAdded(t *testing.T) {
	for _, tc := range []struct {
		name string
		// first are the tables of the first run; between is run on the
		// source after it; published: the publication has customers
		// when the reader starts again.
		first     []string
		between   string
		published bool
	}{
		{"publication lacks it", []string{"orders"}, "", false},
		{"publication has it", []string{"orders"}, `ALTER PUBLICATION tidemark_shop ADD TABLE customers`, true},
		{"dropped from the publication", []string{"customers", "orders"}, `ALTER PUBLICATION tidemark_shop DROP TABLE customers`, false},
	} {
		published := tc.published
		t.Run(tc.name, func(t *testing.T) {
			e := newCDCEnv(t)
			// A tenth of the rows hold a TOASTed value, which an update of
			// another column does not send.
			e.exec(`INSERT INTO customers SELECT i, 'c' || i, 'free', NULL, CASE WHEN i % 10 = 0
				THEN (SELECT string_agg(md5(i::text || g::text), '') FROM generate_series(1, 260) AS g) ELSE repeat('x', i % 50) END
				FROM generate_series(1, 5000) AS i;
				INSERT INTO orders SELECT i, i % 100, i % 997, '2026-10-01 00:00+00' FROM generate_series(1, 500) AS i`)
			cfg := e.config("snapshot: initial\nsnapshot_chunk_rows: 1000\nresync_chunk_rows: 1000", "deletes: hard")
			cfg.Sources["shop"].CDC.Tables = tc.first
			opts := cdc.Options{GroupAge: 20 * time.Millisecond}
			done, cancel := e.run(cfg, opts)
			e.waitStreaming(done)
			e.wantCount("orders copied", 500, `SELECT count(*) FROM mirror.orders`)
			e.exec(`INSERT INTO orders VALUES (501, 1, 1.00, '2026-10-02 00:00+00'); DELETE FROM customers WHERE id <= 10`)
			e.wantCount("orders streamed", 501, `SELECT count(*) FROM mirror.orders`)
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("reader: %v", err)
			}
			if tc.between != "" {
				e.exec(tc.between)
			}
			e.exec(`UPDATE customers SET tier = 'silver' WHERE id % 7 = 0`)

			cfg.Sources["shop"].CDC.Tables = []string{"customers", "orders"}
			logs := &syncbuf.Buffer{}
			opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
			done, cancel = e.run(cfg, opts)
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("reader: %v", err)
				}
			})
			stop := make(chan struct{})
			ended := customerChurn(e.ctx, e, stop)
			waitfor.Within(t, 3*time.Minute, "the added table's copy to end", func() bool {
				r, _ := resyncOf(t, e, "public.customers")
				return r.State == "done"
			})
			close(stop)
			if err := <-ended; err != nil {
				t.Fatal(err)
			}
			e.waitMirrored("")

			r, _ := resyncOf(t, e, "public.customers")
			if !strings.HasPrefix(r.RequestedBy, "tidemark: added") || r.Generation != 1 {
				t.Errorf("the added table's resync: %+v", r)
			}
			if _, had := resyncOf(t, e, "public.orders"); had {
				t.Error("the table streamed before was resynced too")
			}
			if n := e.count(`SELECT count(*) FROM raw.shop WHERE op = 'snapshot' AND source_table = 'public.orders'`); n != 0 {
				t.Errorf("%d rows of orders recorded as copied: its mirror must not be touched", n)
			}
			if n := e.count(`SELECT count(*) FROM raw.shop WHERE op = 'snapshot' AND source_table = 'public.customers'`); n < 4000 {
				t.Errorf("%d rows of customers recorded as copied, want about 5,000", n)
			}
			tables := pgtest.Rows(t, e.wh, `SELECT unnest(tables) FROM tidemark.cdc_positions WHERE source = 'shop' ORDER BY 1`)
			if !slices.Equal(tables, []string{"public.customers", "public.orders"}) {
				t.Errorf("tables streamed: %q", tables)
			}
			if added := strings.Contains(logs.String(), "added tables to the publication"); added == published {
				t.Errorf("added to the publication: %v, want %v:\n%s", added, !published, logs.String())
			}

			// A start with nothing new takes nothing on.
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("reader: %v", err)
			}
			done, cancel = e.run(cfg, cdc.Options{GroupAge: 20 * time.Millisecond})
			e.waitStreaming(done)
			e.exec(`INSERT INTO customers VALUES (99999999, 'last', 'free', NULL, NULL)`)
			e.waitMirrored("")
			if r, _ := resyncOf(t, e, "public.customers"); r.Generation != 1 {
				t.Errorf("a start with the same tables resynced again: %+v", r)
			}
		})
	}
}

// TestNewSlot: a slot dropped while the reader was stopped is refused
// with the command that replaces it; tidemark resync --new-slot records
// the gap, and the reader then streams from a new slot and resyncs every
// table, so the mirrors end equal to the source with the changes made
// while no slot existed. A reader streaming when a new slot is asked for
// replaces it too, without being restarted.
func TestNewSlot(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	e.exec(`INSERT INTO customers SELECT i, 'c' || i, 'free', NULL, NULL FROM generate_series(1, 2000) AS i;
		INSERT INTO orders SELECT i, i % 100, i % 997, '2026-10-01 00:00+00' FROM generate_series(1, 3000) AS i`)
	cfg := e.config("snapshot: initial\nsnapshot_chunk_rows: 1000\nresync_chunk_rows: 1000", "deletes: hard")
	opts := cdc.Options{GroupAge: 20 * time.Millisecond}
	done, cancel := e.run(cfg, opts)
	e.waitStreaming(done)
	e.waitMirrored("")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("reader: %v", err)
	}

	e.waitSlotFree()
	e.exec(`SELECT pg_drop_replication_slot('tidemark_shop')`)
	e.exec(`DELETE FROM orders WHERE id % 5 = 0; UPDATE customers SET tier = 'gold' WHERE id % 3 = 0;
		INSERT INTO orders SELECT i, 1, 1.00, '2026-10-03 00:00+00' FROM generate_series(3001, 3100) AS i`)
	done, cancel = e.run(cfg, opts)
	err := <-done
	cancel()
	if !errors.Is(err, cdc.ErrSetup) || !strings.Contains(fmt.Sprint(err), "tidemark resync shop --new-slot") {
		t.Fatalf("a reader whose slot is gone: %v; want a setup error naming tidemark resync shop --new-slot", err)
	}

	ns, err := cdc.RequestNewSlot(e.ctx, e.wh, "shop", "test", time.Now())
	if err != nil || !ns.Asked || ns.Applied == 0 {
		t.Fatalf("RequestNewSlot: %+v, %v", ns, err)
	}
	if again, err := cdc.RequestNewSlot(e.ctx, e.wh, "shop", "test", time.Now()); err != nil || again.Asked || again.State != "resync" {
		t.Errorf("a second request: %+v, %v; want it left as asked", again, err)
	}
	done, cancel = e.run(cfg, opts)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	})
	e.waitStreaming(done)
	e.exec(`UPDATE orders SET amount = 5 WHERE id % 7 = 0`)
	waitResynced(t, e, 1)
	e.waitMirrored("")
	gaps := pgtest.Rows(t, e.wh, `SELECT applied_lsn::text || ' ' || (resumed_lsn IS NOT NULL)::text FROM tidemark.cdc_gaps WHERE source = 'shop'`)
	if want := ns.Applied.String() + " true"; !slices.Equal(gaps, []string{want}) {
		t.Errorf("gaps %q, want [%s]", gaps, want)
	}

	// A reader streaming when the slot is replaced.
	if ns, err := cdc.RequestNewSlot(e.ctx, e.wh, "shop", "test", time.Now()); err != nil || !ns.Asked {
		t.Fatalf("RequestNewSlot while streaming: %+v, %v", ns, err)
	}
	waitResynced(t, e, 2)
	e.exec(`DELETE FROM customers WHERE id % 11 = 0`)
	e.waitMirrored("")
	e.wantCount("gaps closed", 2, `SELECT count(*) FROM tidemark.cdc_gaps WHERE resumed_lsn IS NOT NULL`)
	select {
	case err := <-done:
		t.Fatalf("the reader ended: %v", err)
	default:
	}
}

// waitResynced waits until both tables of shop have a finished resync of
// generation gen.
func waitResynced(t *testing.T, e *cdcEnv, gen int64) {
	t.Helper()
	waitfor.Within(t, 3*time.Minute, fmt.Sprintf("the resyncs of generation %d to end", gen), func() bool {
		for _, table := range []string{"public.customers", "public.orders"} {
			if r, _ := resyncOf(t, e, table); r.Generation != gen || r.State != "done" {
				return false
			}
		}
		return true
	})
}
