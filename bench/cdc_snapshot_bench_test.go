package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// BenchmarkCDCSnapshot measures a CDC source's initial snapshot of the
// poll benchmark's 1M-row table, fsync on, against its baseline:
//
//	(a) the table COPYed out of the source and into an empty mirror,
//	    one COPY piped into another: what a snapshot writes (the mirror
//	    only; the rows it copies are not changes and get no raw change
//	    rows), at the physical limit (BenchmarkPoll's (a));
//	(b) tidemark's reader starting on the source: publication, slot,
//	    chunk plan, the mirror filled by cdc.snapshot_workers workers,
//	    until the snapshot is recorded done.
//
// Like BenchmarkIngest it measures both in TIDEMARK_BENCH_ROUNDS rounds (3)
// of alternating order and reports the median ratio.
func BenchmarkCDCSnapshot(b *testing.B) {
	rows := size("TIDEMARK_BENCH_SNAPSHOT_ROWS", pollRows, pollRows/10)
	rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
	for range b.N {
		e, srcDSN, src := pollSource(b, rows)
		fmt.Fprintf(os.Stderr, "\nCDC initial snapshot, %d rows of about 150 bytes, fsync on:\n", rows)
		var ratios []float64
		for r := range rounds {
			var copyRate, rate float64
			if r%2 == 0 {
				copyRate = measureMirrorCopy(b, e, srcDSN, rows)
				rate = measureSnapshot(b, e, srcDSN, rows)
			} else {
				rate = measureSnapshot(b, e, srcDSN, rows)
				copyRate = measureMirrorCopy(b, e, srcDSN, rows)
			}
			// The next round's reader starts on the source afresh.
			if _, err := src.Exec(context.Background(), `SELECT pg_drop_replication_slot('tidemark_shop')`); err != nil {
				b.Fatal(err)
			}
			ratios = append(ratios, rate/copyRate)
			fmt.Fprintf(os.Stderr, "  round %d: (a) COPY out of the source piped into the mirror %8.0f rows/s, (b) tidemark's snapshot %8.0f rows/s, (b)/(a) = %.2f\n",
				r+1, copyRate, rate, rate/copyRate)
		}
		ratio := medianOf(ratios)
		b.ReportMetric(ratio, "snapshot/copy")
		fmt.Fprintf(os.Stderr, "  median (b)/(a) = %.2f over %d rounds (target >= 0.8)\n", ratio, rounds)
	}
}

// measureMirrorCopy is (a): the source table COPYed into an empty mirror
// (pipeCopy then also copies change rows, which are not timed here).
func measureMirrorCopy(b *testing.B, e *env, srcDSN string, rows int) float64 {
	b.Helper()
	took, _ := pipeCopy(b, srcDSN, e.freshDatabase(b), int64(rows))
	return float64(rows) / took.Seconds()
}

// measureSnapshot is (b): a CDC reader's first start on the source, until
// its snapshot is recorded done, into a fresh warehouse.
func measureSnapshot(b *testing.B, e *env, srcDSN string, rows int) float64 {
	b.Helper()
	ctx := context.Background()
	whDSN := e.freshDatabase(b)
	wh, cfg := cdcWarehouse(b, whDSN, srcDSN, "src_customers", "{table: dw_customers}")
	prof := startProfile(b, e.srv, dbName(b, srcDSN), dbName(b, whDSN))
	started := time.Now()
	rd := startReader(b, cfg, wh)
	rd.waitFor(b, wh, "the initial snapshot to finish", 20*time.Minute,
		`SELECT snapshot = 'done' FROM tidemark.cdc_positions WHERE source = 'shop'`)
	took := time.Since(started)
	prof.report(b, fmt.Sprintf("(b) tidemark's CDC snapshot, %d workers", cfg.Sources["shop"].CDC.SnapshotWorkers))
	rd.stop(b)
	var raw, mirrored int64
	if err := wh.QueryRow(ctx, `SELECT (SELECT count(*) FROM raw.shop), (SELECT count(*) FROM dw_customers)`).Scan(&raw, &mirrored); err != nil {
		b.Fatal(err)
	}
	if raw != 0 || mirrored != int64(rows) {
		b.Fatalf("the snapshot wrote %d raw change rows and %d mirror rows, want none and %d", raw, mirrored, rows)
	}
	wh.Close()
	return float64(rows) / took.Seconds()
}
