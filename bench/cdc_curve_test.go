package bench

import (
	"context"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestWriteOrdersEndsInLastTransaction: the position writeOrders returns,
// which BenchmarkCDCTransactionSize waits for applied_lsn to reach, lies
// past the commit of every transaction but the last and before the last
// one's commit, however far the WAL writer has got: a reader has applied
// every transaction once applied_lsn reaches it, and not before. The
// server is durable, as the benchmarks' is: there the WAL written after
// the writes stops short of the last transactions.
func TestWriteOrdersEndsInLastTransaction(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabaseOn(t, pgtest.NewServer(t, pgserver.Options{Durable: true}))
	src := pgtest.Pool(t, dsn)
	for _, sql := range []string{cdcSourceDDL, cdcWriteProc, `CREATE PUBLICATION bench_end FOR TABLE orders`,
		`SELECT pg_create_logical_replication_slot('bench_end', 'pgoutput')`} {
		if _, err := src.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// Before the database is dropped, which a slot on it prevents.
	t.Cleanup(func() { _, _ = src.Exec(context.Background(), `SELECT pg_drop_replication_slot('bench_end')`) })
	w, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	end, err := pglogrepl.ParseLSN(writeOrders(t, w, 30_000, 10_000))
	if err != nil {
		t.Fatal(err)
	}

	// The slot decodes flushed WAL only: a commit that writes WAL and
	// waits for its flush flushes the last transactions' too.
	if _, err := w.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	var flush string
	if err := w.QueryRow(ctx, `SELECT pg_logical_emit_message(true, 'bench', 'flush')::text`).Scan(&flush); err != nil {
		t.Fatal(err)
	}

	// The ends of the transactions' commit records: pgoutput sends a
	// transaction's commit message ('C') at the end of its commit. Those
	// before the flush message's: PostgreSQL 14's pgoutput sends the
	// message's transaction too, empty (15 skips empty transactions).
	rows, err := src.Query(ctx, `SELECT lsn::text FROM pg_logical_slot_peek_binary_changes('bench_end', NULL, NULL,
		'proto_version', '1', 'publication_names', 'bench_end') WHERE get_byte(data, 0) = ascii('C') AND lsn < $1::pg_lsn ORDER BY lsn`, flush)
	if err != nil {
		t.Fatal(err)
	}
	commits, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pglogrepl.LSN, error) {
		var s string
		if err := r.Scan(&s); err != nil {
			return 0, err
		}
		return pglogrepl.ParseLSN(s)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(commits) != 3 {
		t.Fatalf("%d transactions decoded, want 3", len(commits))
	}
	if before, last := commits[1], commits[2]; end <= before || end >= last {
		t.Errorf("writeOrders returned %s; the last transaction's commit ends at %s, the one before's at %s", end, last, before)
	}
}
