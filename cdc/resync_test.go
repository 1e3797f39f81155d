package cdc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// resyncRows is how many orders the source holds when a resync test
// begins: ids from resyncBase, apart from those the workload makes.
const (
	resyncRows = 30000
	resyncBase = 10_000_000
)

// statement is one statement of a workload's transaction and its one
// argument.
type statement struct {
	sql string
	arg int64
}

// runWorkload commits, every 2 ms until stop is closed, a transaction of
// the statements txn gives for its i-th transaction.
func runWorkload(ctx context.Context, e *cdcEnv, stop <-chan struct{}, txn func(i int64) []statement) <-chan error {
	ended := make(chan error, 1)
	go func() {
		for i := int64(0); ; i++ {
			err := pgx.BeginFunc(ctx, e.src, func(tx pgx.Tx) error {
				for _, st := range txn(i) {
					if _, err := tx.Exec(ctx, st.sql, st.arg); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				ended <- err
				return
			}
			select {
			case <-stop:
				ended <- nil
				return
			case <-time.After(2 * time.Millisecond): // the workload's pace, not a wait
			}
		}
	}()
	return ended
}

// churn changes the orders a resync copies, in transactions of a few
// statements each, until stop is closed: updates, deletes, inserts and key
// changes, over the whole key range.
func churn(ctx context.Context, e *cdcEnv, stop <-chan struct{}) <-chan error {
	rng := rand.New(rand.NewPCG(1, 2))
	return runWorkload(ctx, e, stop, func(i int64) []statement {
		id := func() int64 { return resyncBase + rng.Int64N(resyncRows+i) }
		next := resyncBase + resyncRows + i
		return []statement{
			{`UPDATE orders SET amount = amount + 1 WHERE id = $1`, id()},
			{`DELETE FROM orders WHERE id = $1`, id()},
			{`INSERT INTO orders VALUES ($1, 7, 1.00, '2026-10-05 09:00+00') ON CONFLICT DO NOTHING`, next},
			{`UPDATE orders SET id = id + 50000000 WHERE id = $1 AND id < 50000000`, id()},
		}
	})
}

// breakMirror makes the orders mirror wrong: rows missing, rows changed
// and rows the source never had, whose number it returns.
func breakMirror(t *testing.T, e *cdcEnv) int64 {
	t.Helper()
	if _, err := e.wh.Exec(e.ctx, `
DELETE FROM mirror.orders WHERE id % 10 = 0;
UPDATE mirror.orders SET amount = -1 WHERE id % 10 = 1;
CREATE TEMP TABLE stale AS SELECT * FROM mirror.orders WHERE id < 10000100;
UPDATE stale SET id = id + 90000000;
INSERT INTO mirror.orders SELECT * FROM stale;
DROP TABLE stale`); err != nil {
		t.Fatal(err)
	}
	return e.count(`SELECT count(*) FROM mirror.orders WHERE id > 90000000`)
}

// resyncSeries returns the values of the resync progress gauges of
// public.orders, and whether each is exported.
func resyncSeries(t *testing.T, e *cdcEnv) (copied, planned float64, hasCopied, hasPlanned bool) {
	t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["source"] != "shop" || labels["table"] != "public.orders" {
				continue
			}
			switch f.GetName() {
			case "tidemark_cdc_resync_rows_copied":
				copied, hasCopied = m.GetGauge().GetValue(), true
			case "tidemark_cdc_resync_rows_planned":
				planned, hasPlanned = m.GetGauge().GetValue(), true
			}
		}
	}
	return copied, planned, hasCopied, hasPlanned
}

func resyncState(t *testing.T, e *cdcEnv) cdc.Resync {
	t.Helper()
	r, _, err := cdc.LastResync(e.ctx, e.wh, "shop", "public.orders")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestResync: a mirror that went wrong is copied again while a workload
// updates, inserts, deletes and changes keys in its table; it ends equal
// to the source, never emptied, the copied rows recorded as op snapshot,
// and a second request while one runs leaves it alone.
func TestResync(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "straight", true: "killed part-way"}[kill], func(t *testing.T) {
			e := newCDCEnv(t)
			e.exec(fmt.Sprintf(`INSERT INTO orders SELECT %d + i, i %% 100, i %% 997, timestamptz '2026-10-01 00:00+00' + i * interval '1 second'
				FROM generate_series(1, %d) AS i; ANALYZE orders`, resyncBase, resyncRows))
			cfg := e.config("snapshot: initial\nsnapshot_chunk_rows: 1000\nresync_chunk_rows: 1000", "deletes: hard")
			opts := cdc.Options{GroupAge: 20 * time.Millisecond, Registerer: e.reg}
			done, cancel := e.run(cfg, opts)
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("reader: %v", err)
				}
			})
			e.waitStreaming(done)
			e.waitMirrored("")
			stale := breakMirror(t, e)

			stop := make(chan struct{})
			ended := churn(e.ctx, e, stop)
			stopped := false
			t.Cleanup(func() {
				if !stopped {
					close(stop)
					<-ended
				}
			})
			r, asked, err := cdc.RequestResync(e.ctx, e.wh, "shop", "public.orders", "test", time.Now())
			if err != nil || !asked || r.State != "pending" || r.Generation != 1 {
				t.Fatalf("RequestResync: %+v asked %v, %v", r, asked, err)
			}
			if _, asked, err := cdc.RequestResync(e.ctx, e.wh, "shop", "public.orders", "test", time.Now()); err != nil || asked {
				t.Errorf("a second request while one is under way was taken (%v)", err)
			}
			minRows := e.count(`SELECT count(*) FROM mirror.orders`)
			if kill {
				// The gauges follow the chunks applied, from the
				// warehouse's row.
				waitfor.Until(t, "the resync to copy five chunks, and its gauges to show them", func() bool {
					copied, _, _, _ := resyncSeries(t, e)
					return resyncState(t, e).Chunks >= 5 && copied >= 4000
				})
				if _, planned, _, _ := resyncSeries(t, e); planned < resyncRows*9/10 || planned > resyncRows*11/10 {
					t.Errorf("tidemark_cdc_resync_rows_planned is %v, want about %d", planned, resyncRows)
				}
				cancel()
				if r := resyncState(t, e); r.State == "done" {
					t.Fatalf("the resync ended before the kill: %+v", r)
				}
				if err := <-done; err != nil {
					t.Fatalf("reader: %v", err)
				}
				if _, _, hasCopied, hasPlanned := resyncSeries(t, e); hasCopied || hasPlanned {
					t.Errorf("the stopped reader still exports the resync's progress (copied %v, planned %v)", hasCopied, hasPlanned)
				}
				// The resync goes on with the estimate it began with.
				if _, err := e.wh.Exec(e.ctx, `UPDATE tidemark.cdc_resyncs SET rows_planned = 12345`); err != nil {
					t.Fatal(err)
				}
				done, cancel = e.run(cfg, opts)
				waitfor.Until(t, "the resync's gauges after the restart", func() bool {
					copied, planned, _, _ := resyncSeries(t, e)
					return copied >= 4000 && planned == 12345 || resyncState(t, e).State == "done"
				})
			}
			waitfor.Within(t, 3*time.Minute, "the resync to end", func() bool {
				minRows = min(minRows, e.count(`SELECT count(*) FROM mirror.orders`))
				return resyncState(t, e).State == "done"
			})
			close(stop)
			stopped = true
			if err := <-ended; err != nil {
				t.Fatal(err)
			}
			e.waitMirrored("")
			got := resyncState(t, e)
			t.Logf("resync %+v; mirror rows at least %d during it", got, minRows)
			if got.Removed != stale {
				t.Errorf("the resync removed %d rows, want the %d the source never had", got.Removed, stale)
			}
			if minRows < resyncRows*8/10 {
				t.Errorf("the mirror fell to %d rows during the resync: it must never be emptied", minRows)
			}
			if n := e.count(`SELECT count(*) FROM raw.shop WHERE op = 'snapshot'`); n < resyncRows*8/10 {
				t.Errorf("%d raw rows with op snapshot; want about one per row copied", n)
			}
			if n := e.count(`SELECT count(*) FROM tidemark.cdc_resync_keys`); n != 0 {
				t.Errorf("%d resync keys left after the resync ended", n)
			}
			// The planned rows are the analysed table's, taken when the
			// copy began and kept when it went on after a stop.
			wantPlanned := func(p int64) bool { return p >= resyncRows*9/10 && p <= resyncRows*11/10 }
			if kill {
				wantPlanned = func(p int64) bool { return p == 12345 }
			}
			if got.Planned == nil || !wantPlanned(*got.Planned) {
				t.Errorf("rows planned %v, want about %d (12345 after the kill)", got.Planned, resyncRows)
			}
			waitfor.Until(t, "the progress gauges to go once the resync ended", func() bool {
				_, _, hasCopied, hasPlanned := resyncSeries(t, e)
				return !hasCopied && !hasPlanned
			})
		})
	}
}
