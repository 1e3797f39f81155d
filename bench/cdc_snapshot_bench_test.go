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
func BenchmarkCDCSnapshot(b *testing.B) {
	rows := size("TIDEMARK_BENCH_SNAPSHOT_ROWS", pollRows, pollRows/10)
	for range b.N {
		ctx := context.Background()
		e, srcDSN, _ := pollSource(b, rows)

		// (a) COPY out of the source, piped into the mirror (pipeCopy
		// then also copies change rows, which are not timed here).
		mirrorTook, _ := pipeCopy(b, srcDSN, e.freshDatabase(b), int64(rows))
		copyRate := float64(rows) / mirrorTook.Seconds()

		// (b) tidemark's snapshot.
		whDSN := e.freshDatabase(b)
		wh, cfg := cdcWarehouse(b, whDSN, srcDSN, "src_customers", "{table: dw_customers}")
		prof := startProfile(b, e.srv, dbName(b, srcDSN), dbName(b, whDSN))
		started := time.Now()
		rd := startReader(b, cfg, wh)
		rd.waitFor(b, wh, "the initial snapshot to finish", 20*time.Minute,
			`SELECT snapshot = 'done' FROM tidemark.cdc_positions WHERE source = 'shop'`)
		took := time.Since(started)
		prof.report(b, "(b) tidemark's CDC snapshot")
		rd.stop(b)
		var raw, mirrored int64
		if err := wh.QueryRow(ctx, `SELECT (SELECT count(*) FROM raw.shop), (SELECT count(*) FROM dw_customers)`).Scan(&raw, &mirrored); err != nil {
			b.Fatal(err)
		}
		if raw != 0 || mirrored != int64(rows) {
			b.Fatalf("the snapshot wrote %d raw change rows and %d mirror rows, want none and %d", raw, mirrored, rows)
		}
		rate := float64(rows) / took.Seconds()
		b.ReportMetric(copyRate, "copy_rows/s")
		b.ReportMetric(rate, "snapshot_rows/s")
		b.ReportMetric(rate/copyRate, "snapshot/copy")
		fmt.Fprintf(os.Stderr, `
CDC initial snapshot, %d rows of about 150 bytes, fsync on:
  (a) COPY out of the source piped into COPY into the mirror         %8.0f rows/s  (%s)
  (b) tidemark's snapshot (publication, slot, plan, %d workers)      %8.0f rows/s  (%s)   (b)/(a) = %.2f (target >= 0.8)
`, rows, copyRate, mirrorTook.Round(time.Millisecond),
			cfg.Sources["shop"].CDC.SnapshotWorkers, rate, took.Round(time.Millisecond), rate/copyRate)
	}
}
