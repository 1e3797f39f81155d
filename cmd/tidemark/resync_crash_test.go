package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestResyncCrashSafety: `tidemark run` resyncing a mirror that went wrong
// while a writer changes its table is SIGKILLed at random moments of the
// copy and restarted each time; the resync goes on from its last applied
// chunk, the mirror ends equal to the source with the stale rows removed,
// and every change the writer committed has exactly one raw change row
// besides the copied rows.
func TestResyncCrashSafety(t *testing.T) {
	const rows = 100_000
	ctx := context.Background()
	src, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	if _, err := src.Exec(ctx, fmt.Sprintf(`CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, note text);
		INSERT INTO orders SELECT i, i, 'seed' FROM generate_series(1, %d) AS i; ANALYZE orders`, rows)); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "cdc.yaml", fmt.Sprintf(`warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: info}
sources:
  shop:
    cdc: {dsn: %q, tables: [orders], snapshot: initial, status_every: 200ms, resync_chunk_rows: 500}
    mirror: {table: dw_orders, deletes: hard}
`, whDSN, srcDSN))
	clock := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	p := startCommand(t, clock, "run", "--only", "cdc", "-c", cfg)
	waitfor.Until(t, "the snapshot to finish", func() bool {
		var state string
		return wh.QueryRow(ctx, "SELECT snapshot FROM tidemark.cdc_positions WHERE source = 'shop'").Scan(&state) == nil && state == "done"
	})
	// The mirror goes wrong: rows missing, rows changed, rows the source
	// never had.
	if _, err := wh.Exec(ctx, `DELETE FROM dw_orders WHERE id % 10 = 0; UPDATE dw_orders SET amount = -1 WHERE id % 10 = 1`); err != nil {
		t.Fatal(err)
	}
	tag, err := wh.Exec(ctx, `INSERT INTO dw_orders SELECT id + 90000000, amount, note, loaded_at FROM dw_orders WHERE id < 101`)
	if err != nil {
		t.Fatal(err)
	}
	stale := tag.RowsAffected()
	w := &orderWriter{maxOps: 10, pace: time.Millisecond}
	stop := make(chan struct{})
	written := make(chan error, 1)
	go func() { written <- w.run(ctx, src, stop) }()
	if code, out, errOut := invoke(t, "resync", "shop", "-c", cfg); code != exitOK {
		t.Fatalf("resync: exit %d\n%s%s", code, out, errOut)
	}

	chunks := func() (n int64, state string) {
		_ = wh.QueryRow(ctx, "SELECT chunks, state FROM tidemark.cdc_resyncs WHERE source = 'shop'").Scan(&n, &state)
		return n, state
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	kills := 0
	for _, at := range []int64{20, 70, 130} {
		waitfor.Until(t, fmt.Sprintf("the resync to apply %d chunks", at), func() bool {
			n, state := chunks()
			return n >= at || state == "done"
		})
		if _, state := chunks(); state == "done" {
			break
		}
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // the random moment of the kill, not a wait
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.exited
		kills++
		p = startCommand(t, clock, "run", "--only", "cdc", "-c", cfg)
	}
	defer func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.exited
	}()
	waitfor.Within(t, 3*time.Minute, "the resync to end", func() bool {
		_, state := chunks()
		return state == "done"
	})
	close(stop)
	if err := <-written; err != nil {
		t.Fatalf("writer: %v", err)
	}
	total := w.changes.Load()
	if kills < 2 {
		t.Fatalf("the resync ended after %d kills: the test needs a slower copy", kills)
	}
	checkOrdersConverge(t, src, wh, total, "op <> 'snapshot'")
	var removed int64
	if err := wh.QueryRow(ctx, `SELECT rows_removed FROM tidemark.cdc_resyncs WHERE source = 'shop'`).Scan(&removed); err != nil || removed != stale {
		t.Errorf("the resync removed %d rows (%v), want the %d the source never had", removed, err, stale)
	}
	t.Logf("resync killed %d times; %d changes committed meanwhile; %d rows removed", kills, total, removed)
}
