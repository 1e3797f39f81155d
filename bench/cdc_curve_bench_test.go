package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/benchplot"
)

// cdcWriteProc inserts total rows into orders, per_txn rows a
// transaction, each committed by the procedure. It returns in last the WAL
// insert position its last transaction reached after its rows, before its
// commit record.
const cdcWriteProc = `
CREATE PROCEDURE bench_write(first bigint, total bigint, per_txn bigint, INOUT last text DEFAULT NULL) LANGUAGE plpgsql AS $$
DECLARE i bigint := first;
BEGIN
    WHILE i < first + total LOOP
        INSERT INTO orders SELECT g, g % 5000, (g % 997) * 1.25, 'placed', repeat('x', 80),
            timestamptz '2026-11-01 00:00+00' + g * interval '1 second'
        FROM generate_series(i, least(i + per_txn, first + total) - 1) AS g;
        last := pg_current_wal_insert_lsn()::text;
        COMMIT;
        i := i + per_txn;
    END LOOP;
END $$`

// writeOrders inserts total rows into orders with cdcWriteProc, perTxn
// rows a transaction, and returns a WAL position inside the last
// transaction: past its rows and every earlier commit, before its own
// commit. applied_lsn, the end of the last source transaction a reader
// applied, reaches it only once every transaction is applied, and
// pg_recvlogical stopping there has received every change.
//
// pg_current_wal_lsn() after the writes would not do: it is how far WAL
// has been written, and with synchronous_commit off the WAL writer can
// still hold back the last transactions (a whole one of 10,000 rows, in
// practice), so a reader would seem done before it applied them.
func writeOrders(tb testing.TB, w *pgx.Conn, total, perTxn int) string {
	tb.Helper()
	ctx := context.Background()
	// Writing is not measured: commits need not wait for their flush.
	if _, err := w.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		tb.Fatal(err)
	}
	var end string
	if err := w.QueryRow(ctx, `CALL bench_write(1, $1, $2, NULL)`, total, perTxn).Scan(&end); err != nil {
		tb.Fatal(err)
	}
	return end
}

// cdcPoint is one source transaction size and the changes written at it.
type cdcPoint struct{ perTxn, total int }

// BenchmarkCDCTransactionSize measures CDC apply against the size of the
// source's transactions (1, 100, 10,000 and 1,000,000 inserted rows each;
// the last size is TIDEMARK_BENCH_CDC_BIG_TXN), next to pg_recvlogical
// decoding the same changes from a second slot, as BenchmarkCDC's (a). Each point has its own source and warehouse
// databases and slots on one server. It writes cdc_txn_size.json and
// .svg.
func BenchmarkCDCTransactionSize(b *testing.B) {
	bin, err := pgserver.FindBinDir()
	if err != nil {
		b.Skip(err)
	}
	big := size("TIDEMARK_BENCH_CDC_BIG_TXN", 1_000_000, 100_000)
	points := []cdcPoint{{1, 100_000}, {100, 1_000_000}, {10_000, 1_000_000}, {big, big}}
	if quick {
		points = []cdcPoint{{1, 10_000}, {100, 50_000}, {10_000, 100_000}, {big, big}}
	}
	srv := durableServer(b)
	e := &env{srv: srv}
	for range b.N {
		started := time.Now()
		tab := &benchplot.Table{Name: "cdc_txn_size", Title: "CDC apply vs source transaction size",
			Meta: runMeta(b, srv),
			Columns: []string{"rows_per_txn", "changes", "decode_changes_per_s", "apply_changes_per_s", "apply_per_decode", "other_cores",
				"peak_live_heap_mib", "peak_go_memory_mib"}}
		tab.Meta["workload"] = "inserts only into orders (bigint key, five columns, about 150 bytes a row); each point on fresh databases and slots"
		for _, p := range points {
			m := meterCPU()
			decode, apply, mem := cdcPointRates(b, e, filepath.Join(bin, "pg_recvlogical"), p)
			addRow(b, tab, float64(p.perTxn), float64(p.total), decode, apply, apply/decode, m.otherCores(),
				mem.live/(1<<20), mem.total/(1<<20))
			fmt.Fprintf(os.Stderr, "CDC, %d changes in transactions of %d: decode %8.0f changes/s, apply %8.0f changes/s, ratio %.2f, peak live heap %.0f MiB, Go memory %.0f MiB\n",
				p.total, p.perTxn, decode, apply, apply/decode, mem.live/(1<<20), mem.total/(1<<20))
		}
		tab.Meta["took"] = time.Since(started).Round(time.Second).String()
		target := 0.6
		saveCurve(b, tab, benchplot.Figure{
			Title: "CDC apply vs rows per source transaction (inserts), fsync on",
			Panels: []benchplot.Panel{{
				Title: "throughput", XLabel: "rows per source transaction", YLabel: "changes/s", LogX: true,
				Series: []benchplot.Series{
					series(b, tab, "tidemark apply", "rows_per_txn", "apply_changes_per_s", nil),
					series(b, tab, "pg_recvlogical, decode only", "rows_per_txn", "decode_changes_per_s", nil),
				},
			}, {
				Title: "ratio to decode only", XLabel: "rows per source transaction", YLabel: "apply / decode (ratio)", LogX: true,
				Series:    []benchplot.Series{series(b, tab, "apply / decode", "rows_per_txn", "apply_per_decode", nil)},
				Reference: &target, ReferenceLabel: "target 0.60",
			}},
		})
	}
}

// memPeak is the largest Go memory seen while a measurement ran, in bytes:
// the live heap after each collection, and all memory the runtime holds
// from the system less what it has returned (about the process's RSS).
type memPeak struct{ live, total float64 }

// meterMemory samples this process's Go memory every 20 ms until the
// returned function is called, which returns the peaks.
func meterMemory() func() memPeak {
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	stop, done := make(chan struct{}), make(chan memPeak)
	go func() {
		var peak memPeak
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(samples)
			peak.live = max(peak.live, float64(samples[0].Value.Uint64()))
			peak.total = max(peak.total, float64(samples[1].Value.Uint64()-samples[2].Value.Uint64()))
			select {
			case <-stop:
				done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() memPeak { close(stop); return <-done }
}

// cdcPointRates writes the point's changes into a new source database and
// returns the decode-only and tidemark apply rates, in changes/s, and the
// peak Go memory of the process while tidemark applied them.
func cdcPointRates(b *testing.B, e *env, recvlogical string, p cdcPoint) (decode, apply float64, mem memPeak) {
	b.Helper()
	ctx := context.Background()
	srcDSN, src, wh, cfg := cdcSlots(b, e.srv, cdcWriteProc)
	w := connect(b, srcDSN)
	end := writeOrders(b, w, p.total, p.perTxn)

	e.settle(b)
	decodeTook, _ := decodeOnly(b, recvlogical, srcDSN, "bench_decode", end)

	e.settle(b)
	runtime.GC()
	stopMeter := meterMemory()
	started := time.Now()
	rd := startReader(b, cfg, wh)
	rd.waitApplied(b, wh, end, 20*time.Minute)
	applyTook := time.Since(started)
	mem = stopMeter()
	rd.stop(b)
	var raw, mirrored int64
	if err := wh.QueryRow(ctx, `SELECT (SELECT count(*) FROM raw.shop), (SELECT count(*) FROM dw_orders)`).Scan(&raw, &mirrored); err != nil {
		b.Fatal(err)
	}
	if raw != int64(p.total) || mirrored != int64(p.total) {
		b.Fatalf("tidemark wrote %d raw change rows and %d mirror rows, want %d", raw, mirrored, p.total)
	}
	// The next point's slots take the same names; the databases go too.
	if _, err := src.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('bench_decode', 'tidemark_shop')`); err != nil {
		b.Fatal(err)
	}
	src.Close()
	wh.Close()
	w.Close(ctx)
	dropDatabases(b, e.srv, srcDSN, cfg.Warehouse.DSN)
	return float64(p.total) / decodeTook.Seconds(), float64(p.total) / applyTook.Seconds(), mem
}

// dropDatabases drops the databases of the DSNs.
func dropDatabases(b *testing.B, srv *pgserver.Server, dsns ...string) {
	b.Helper()
	ctx := context.Background()
	admin := connect(b, srv.URL("postgres"))
	defer admin.Close(ctx)
	for _, dsn := range dsns {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{cfg.Database}.Sanitize()+" WITH (FORCE)"); err != nil {
			b.Fatal(err)
		}
	}
}
