package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestCDCCrashSafety is acceptance item 2 of the CDC issue: `tidemark run`
// reading a slot is SIGKILLed at random moments during a stream of mixed
// changes and restarted each time; afterwards the mirror equals the source
// and every change has exactly one raw change row. The source streams
// large transactions while they run (logical_decoding_work_mem at its
// least, set for the replication session), and the reader spills them to
// disk, so kills also hit streamed and spilled transactions.
func TestCDCCrashSafety(t *testing.T) {
	kills := 6
	if testing.Short() {
		kills = 5
	}
	ctx := context.Background()
	src, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	if _, err := src.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, note text);
		INSERT INTO orders SELECT i, i, 'seed' FROM generate_series(1, 1000) AS i`); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "cdc.yaml", fmt.Sprintf(`warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: info}
sources:
  shop:
    cdc: {dsn: %q, tables: [orders], snapshot: initial, status_every: 200ms, max_buffer_bytes: 1MiB}
    mirror: {table: dw_orders, deletes: hard}
`, whDSN, srcDSN+"&options=-c%20logical_decoding_work_mem%3D64kB"))

	clock := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	// The first run creates the slot and copies the table. Changes made
	// before the slot exists are in the snapshot, not in the stream, so
	// the writer starts once the snapshot is done.
	first := startCommand(t, clock, "run", "--only", "cdc", "-c", cfg)
	waitfor.Until(t, "the snapshot to finish", func() bool {
		var state string
		return wh.QueryRow(ctx, "SELECT snapshot FROM tidemark.cdc_positions WHERE source = 'shop'").Scan(&state) == nil && state == "done"
	})

	// The writer: transactions of 1 to 50 inserts, updates and deletes
	// and now and then a large one, counting every row change it commits.
	w := &orderWriter{maxOps: 50, large: true, pace: time.Millisecond}
	stop := make(chan struct{})
	written := make(chan error, 1)
	go func() { written <- w.run(ctx, src, stop) }()

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for i := 0; i < kills; i++ {
		p := first
		if i > 0 {
			p = startCommand(t, clock, "run", "--only", "cdc", "-c", cfg)
		}
		time.Sleep(time.Duration(400+rng.IntN(1200)) * time.Millisecond) // the random moment of the kill, not a wait
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.exited
	}
	close(stop)
	if err := <-written; err != nil {
		t.Fatalf("writer: %v", err)
	}
	total := w.changes.Load()
	t.Logf("%d row changes committed at the source across %d kills", total, kills)

	p := startCommand(t, clock, "run", "--only", "cdc", "-c", cfg)
	defer func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.exited
	}()
	checkOrdersConverge(t, src, wh, total, "")
	// The source did stream transactions (its statistics arrive late).
	if waitfor.Poll(waitfor.Timeout, func() bool {
		var streamed int64
		if err := src.QueryRow(ctx, "SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots WHERE slot_name = 'tidemark_shop'").Scan(&streamed); err != nil {
			t.Fatal(err)
		}
		return streamed > 0
	}) != nil {
		t.Fatal("the source streamed no transaction: the test does not cover streamed transactions")
	}
}

// checkOrdersConverge waits until the mirror dw_orders equals the source's
// orders and raw.shop holds a change row for each of the total changes
// committed (of its rows matching the SQL condition where, "" for all),
// then requires exactly one for each.
func checkOrdersConverge(t *testing.T, src, wh *pgxpool.Pool, total int64, where string) {
	t.Helper()
	ctx := context.Background()
	if where != "" {
		where = " WHERE " + where
	}
	const orderRows = `SELECT id, amount::text, note FROM %s ORDER BY id`
	var equal bool
	var rawRows int64
	if err := waitfor.Poll(90*time.Second, func() bool {
		want := strings.Join(pgtest.Rows(t, src, fmt.Sprintf(orderRows, "orders")), "\n")
		got := strings.Join(pgtest.Rows(t, wh, fmt.Sprintf(orderRows, "dw_orders")), "\n")
		_ = wh.QueryRow(ctx, "SELECT count(*) FROM raw.shop"+where).Scan(&rawRows)
		equal = want == got
		return equal && rawRows >= total
	}); err != nil {
		t.Fatalf("no convergence within 90s: mirror equal %v, raw change rows %d of %d", equal, rawRows, total)
	}
	var raw, distinct int64
	if err := wh.QueryRow(ctx, "SELECT count(*), count(DISTINCT (commit_lsn, event_id)) FROM raw.shop"+where).Scan(&raw, &distinct); err != nil {
		t.Fatal(err)
	}
	if raw != total || distinct != total {
		t.Errorf("raw change rows %d (%d distinct), want exactly %d", raw, distinct, total)
	}
}

// orderWriter commits transactions of inserts, updates and deletes on the
// source table orders (ids 1 to 1,000 seeded) and counts every row change
// committed.
type orderWriter struct {
	maxOps  int           // statements a transaction: 1 to maxOps
	large   bool          // one transaction in 25 inserts 3,000 rows instead
	pace    time.Duration // between transactions
	changes atomic.Int64
}

// run writes until stop closes, and returns the first error.
func (w *orderWriter) run(ctx context.Context, src *pgxpool.Pool, stop <-chan struct{}) error {
	rng := rand.New(rand.NewPCG(1, 2))
	next := int64(100_000)
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		var n int64
		err := pgx.BeginFunc(ctx, src, func(tx pgx.Tx) error {
			n = 0
			if w.large && rng.IntN(25) == 0 {
				// A large transaction, some of its notes NULL: the
				// source streams it, the reader spills it.
				tag, err := tx.Exec(ctx, `INSERT INTO orders SELECT g, 2, CASE WHEN g % 3 = 0 THEN NULL ELSE repeat('b', 400) END
					FROM generate_series($1::bigint, $1::bigint + 2999) AS g`, next+1)
				next += 3000
				n = tag.RowsAffected()
				return err
			}
			for range 1 + rng.IntN(w.maxOps) {
				var q string
				var arg int64
				switch rng.IntN(3) {
				case 0:
					next++
					q, arg = `INSERT INTO orders VALUES ($1, 1, 'new')`, next
				case 1:
					q, arg = `UPDATE orders SET amount = amount + 1, note = 'upd' WHERE id = $1`, 1+rng.Int64N(next)
				default:
					q, arg = `DELETE FROM orders WHERE id = $1`, 1+rng.Int64N(next)
				}
				tag, err := tx.Exec(ctx, q, arg)
				if err != nil {
					return err
				}
				n += tag.RowsAffected()
			}
			return nil
		})
		if err != nil {
			return err
		}
		w.changes.Add(n)
		time.Sleep(w.pace) // the pace of the writer, not a wait
	}
}
