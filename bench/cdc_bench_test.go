package bench

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
)

// cdcChanges is how many row changes the CDC throughput benchmark streams.
var cdcChanges = size("TIDEMARK_BENCH_CDC_CHANGES", 1_000_000, 100_000)

// cdcSourceDDL is the source table of the CDC benchmark: about 150 bytes
// a row.
const cdcSourceDDL = `
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    customer_id bigint NOT NULL,
    amount      numeric(12,2) NOT NULL,
    status      text NOT NULL,
    note        text NOT NULL,
    placed_at   timestamptz NOT NULL
)`

// cdcWorkload writes cdcChanges changes in transactions of 1,000: 600
// transactions of inserts, 300 of updates and 100 of deletes, interleaved.
const (
	cdcInsertSQL = `INSERT INTO orders SELECT i, i % 5000, (i % 997) * 1.25, 'placed', repeat('x', 80),
	timestamptz '2026-11-01 00:00+00' + i * interval '1 second' FROM generate_series($1::bigint, $2::bigint) AS i`
	cdcUpdateSQL = `UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id BETWEEN $1 AND $2`
	cdcDeleteSQL = `DELETE FROM orders WHERE id BETWEEN $1 AND $2`
)

// cdcTarget is the apply rate BenchmarkCDC aims for, as a share of the
// decode-only rate.
const cdcTarget = 0.6

// BenchmarkCDC measures the CDC reader on one PostgreSQL server with fsync
// on (source and warehouse are two databases of it):
//
//	(a) pg_recvlogical decoding 1,000,000 changes (600k inserts, 300k
//	    updates, 100k deletes in transactions of 1,000) from a pgoutput
//	    slot and throwing the output away: the limit of what the server
//	    can decode and send; measured before (b) and again after it, from
//	    a second slot, and averaged, so that the machine's speed drifting
//	    between the two measurements moves the ratio less;
//	(a') the lean applier (leanApplier): a program in the benchmark that
//	    writes what (b) writes (the same raw change rows, the same mirror,
//	    its position, the slot confirmed) with the least work, each from
//	    a slot of its own, before (b) and after it, averaged like (a);
//	    its mirror and raw change rows must equal (b)'s;
//	(b) tidemark applying the same changes from its own slot: raw change
//	    rows, ledger, mirror, positions, confirmed to the slot;
//	the raw change rows (b) wrote, COPYed alone; and (a'') the floor of
//	    what the server must do for (b), in CPU (serverFloor);
//	(c) apply lag at a steady 5,000 changes/s for 30 s: for each source
//	    transaction, the time from its COMMIT returning at the source to
//	    the first moment its rows are visible in the warehouse mirror.
func BenchmarkCDC(b *testing.B) {
	bin, err := pgserver.FindBinDir()
	if err != nil {
		b.Skip(err)
	}
	recvlogical := filepath.Join(bin, "pg_recvlogical")
	for range b.N {
		ctx := context.Background()
		srv := durableServer(b)
		e := &env{srv: srv}
		// tidemark creates its publication and slot, takes its (empty)
		// snapshot and stops; the decode-only slot is created next to it,
		// so both slots hold exactly the changes written below.
		srcDSN, src, wh, cfg := cdcSlots(b, srv)
		for _, slot := range []string{"bench_decode_after", "bench_lean", "bench_lean_after"} {
			if _, err := src.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
				b.Fatal(err)
			}
		}
		end := writeCDCWorkload(b, src, cdcChanges)
		endLSN, err := pglogrepl.ParseLSN(end)
		if err != nil {
			b.Fatal(err)
		}
		leanBefore := leanTargets(b, cfg.Warehouse.DSN, srcDSN, "bench_lean", "lean", endLSN)
		leanAfter := leanTargets(b, cfg.Warehouse.DSN, srcDSN, "bench_lean_after", "lean_after", endLSN)
		// Autovacuum of the tables just written would take CPU from
		// whichever measurement it falls into: the tables are vacuumed
		// first, and each measurement waits until no autovacuum runs.
		if _, err := src.Exec(ctx, `VACUUM (ANALYZE) orders`); err != nil {
			b.Fatal(err)
		}

		// (a) pg_recvlogical to the end LSN, before (b) and after.
		decode := func(slot string) (time.Duration, int64, cpuUse) {
			e.settle(b)
			waitNoAutovacuum(b, srv)
			prof := startProfile(b, srv, dbName(b, srcDSN))
			cpu := markCPU(b, srv)
			took, decoded := decodeOnly(b, recvlogical, srcDSN, slot, end)
			used := cpu.since(b, srv)
			prof.report(b, "(a) pg_recvlogical, slot "+slot)
			if _, err := src.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
				b.Fatal(err)
			}
			return took, decoded, used
		}
		decodeBefore, decodedBytes, decodeCPUBefore := decode("bench_decode")

		// (a') the lean applier, before (b) and after, like (a).
		var leanProcs []string
		lean := func(a *leanApplier) (time.Duration, cpuUse) {
			e.settle(b)
			waitNoAutovacuum(b, srv)
			prof := startProfile(b, srv, dbName(b, srcDSN), dbName(b, cfg.Warehouse.DSN))
			cpu, procs := markCPU(b, srv), readServerProcs(srv.Pid())
			stopGo := startGoProfile(b, "cdc_"+a.slot)
			took, err := a.run(ctx)
			used := cpu.since(b, srv)
			leanProcs = append(leanProcs, procs.since(srv.Pid()))
			stopGo()
			if err != nil {
				b.Fatalf("(a') the lean applier: %v", err)
			}
			prof.report(b, "(a') lean applier, slot "+a.slot)
			// Its walsender ends a moment after the connection closes.
			waitfor.Within(b, time.Minute, "the walsender of slot "+a.slot+" to end", func() bool {
				var active bool
				return src.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, a.slot).Scan(&active) == nil && !active
			})
			if _, err := src.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, a.slot); err != nil {
				b.Fatal(err)
			}
			for _, q := range []string{`VACUUM (ANALYZE) ` + a.mirror, `VACUUM (ANALYZE) ` + a.rawTable} {
				if _, err := wh.Exec(ctx, q); err != nil {
					b.Fatal(err)
				}
			}
			return took, used
		}
		leanTookBefore, leanCPUBefore := lean(leanBefore)

		// (b) tidemark from the same position to the same end LSN.
		e.settle(b)
		waitNoAutovacuum(b, srv)
		prof := startProfile(b, srv, dbName(b, srcDSN), dbName(b, cfg.Warehouse.DSN))
		started, cpu, procs := time.Now(), markCPU(b, srv), readServerProcs(srv.Pid())
		stopGo := startGoProfile(b, "cdc_apply")
		rd := startReader(b, cfg, wh)
		rd.waitApplied(b, wh, end, 10*time.Minute)
		applyTook, applyCPU := time.Since(started), cpu.since(b, srv)
		stopGo()
		applyProcs := procs.since(srv.Pid())
		prof.report(b, "(b) tidemark CDC apply")
		// The reader stops until (c): its walsender would otherwise decode,
		// during the measurements after (b), the WAL that they write.
		rd.stop(b)
		for _, q := range []string{`VACUUM (ANALYZE) dw_orders`, `VACUUM (ANALYZE) raw.shop`} {
			if _, err := wh.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		decodeAfter, _, decodeCPUAfter := decode("bench_decode_after")
		leanTookAfter, leanCPUAfter := lean(leanAfter)
		decodeTook := (decodeBefore + decodeAfter) / 2
		leanTook := (leanTookBefore + leanTookAfter) / 2
		leanCPU := cpuUse{wall: leanTook, pg: (leanCPUBefore.pg + leanCPUAfter.pg) / 2, rest: (leanCPUBefore.rest + leanCPUAfter.rest) / 2}
		decodeCPU := cpuUse{wall: decodeTook, pg: (decodeCPUBefore.pg + decodeCPUAfter.pg) / 2, rest: (decodeCPUBefore.rest + decodeCPUAfter.rest) / 2}
		var raw, mirrored int64
		if err := wh.QueryRow(ctx, `SELECT (SELECT count(*) FROM raw.shop), (SELECT count(*) FROM dw_orders WHERE deleted_at IS NULL)`).Scan(&raw, &mirrored); err != nil {
			b.Fatal(err)
		}
		if raw != int64(cdcChanges) || mirrored != int64(cdcChanges/2) {
			b.Fatalf("tidemark wrote %d raw change rows and %d live mirror rows, want %d and %d", raw, mirrored, cdcChanges, cdcChanges/2)
		}

		// The lean applier left what tidemark left, both times.
		checkLean(b, cfg.Warehouse.DSN, leanBefore)
		checkLean(b, cfg.Warehouse.DSN, leanAfter)

		// The raw change rows alone, copied into an empty raw table.
		e.settle(b)
		rawTook := copyRawRows(b, cfg.Warehouse.DSN)
		rawRate := float64(cdcChanges) / rawTook.Seconds()

		// (a'') the server's floor for (b), in CPU.
		e.settle(b)
		floorCPU := decodeCPU.pg + decodeCPU.rest + serverFloor(b, cfg.Warehouse.DSN)

		// The bulk changes leave the source's table to be vacuumed; the
		// WAL of that vacuum (full-page images of every page) has to be
		// read by logical decoding before any later commit, which stalls
		// every reader for a second or two. Steady state starts after it.
		if _, err := src.Exec(ctx, `VACUUM (ANALYZE) orders`); err != nil {
			b.Fatal(err)
		}
		if _, err := wh.Exec(ctx, `VACUUM (ANALYZE) dw_orders`); err != nil {
			b.Fatal(err)
		}
		rd = startReader(b, cfg, wh)
		waitDecodedPast(b, src, wh)
		// (c) apply lag at a steady 5,000 changes/s.
		lags, rate := steadyLag(b, src, wh, 5000, 30*time.Second)
		rd.stop(b)

		decodeRate := float64(cdcChanges) / decodeTook.Seconds()
		applyRate := float64(cdcChanges) / applyTook.Seconds()
		leanRate := float64(cdcChanges) / leanTook.Seconds()
		p50, p99, worst := percentile(lags, 0.50), percentile(lags, 0.99), lags[len(lags)-1]
		b.ReportMetric(decodeRate, "decode_changes/s")
		b.ReportMetric(applyRate, "apply_changes/s")
		b.ReportMetric(leanRate, "lean_changes/s")
		b.ReportMetric(applyRate/decodeRate, "apply/decode")
		b.ReportMetric(applyRate/leanRate, "apply/lean")
		b.ReportMetric(leanRate/decodeRate, "lean/decode")
		b.ReportMetric(applyRate/rawRate, "apply/raw_copy")
		// The floor's CPU on both cores with nothing idle: the most any
		// reader could reach on this machine.
		floorRate := float64(cdcChanges) / (floorCPU.Seconds() / float64(runtime.NumCPU()))
		b.ReportMetric(floorRate/decodeRate, "floor/decode")
		b.ReportMetric(p99.Seconds(), "lag_p99_s")
		// At the target, (b) would take decodeTook/0.6: the cores the CPU
		// that (b) used would need in that time. More than the machine
		// has means the target is out of reach at this CPU cost per change.
		atTarget := decodeTook.Seconds() / cdcTarget
		b.ReportMetric((applyCPU.pg+applyCPU.rest).Seconds()/atTarget, "cores_needed_at_target")
		fmt.Fprintf(os.Stderr, `
CDC, %d changes (60%% inserts, 30%% updates, 10%% deletes; transactions of 1,000), fsync on:
  (a) pg_recvlogical decode only, output discarded   %8.0f changes/s  (%s, %d MiB of pgoutput; before (b) %s, %.1f s CPU; after %s, %.1f s CPU)
      %s
  (a') lean applier: raw rows and mirror, per group  %8.0f changes/s  (%s; before (b) %s, %.1f s CPU; after %s, %.1f s CPU)   (a')/(a) = %.2f
      %s
      PostgreSQL's by process, before (b): %s
                               after (b):  %s
  COPY of the same raw change rows, nothing else     %8.0f rows/s     (%s)
  (a'') the floor: (a)'s CPU and that of COPYing the raw change rows and the mirror's
        final rows from memory, %.1f s, on %d cores with none idle %8.0f changes/s   (a'')/(a) = %.2f
  (b) tidemark apply (raw, ledger, mirror, confirm)   %8.0f changes/s  (%s)   (b)/(a) = %.2f, (b)/(a') = %.2f, (b)/raw COPY = %.2f, (b)/(a'') = %.2f
      %s
      PostgreSQL's by process: %s
      at (b)/(a) = %.1f, (b) would take %.1f s: the CPU it used needs %.2f cores then, PostgreSQL's share alone %.2f
  (c) steady %.0f changes/s for 30s, %d transactions: lag p50 %s, p99 %s, max %s
`, cdcChanges, decodeRate, decodeTook.Round(time.Millisecond), decodedBytes>>20, decodeBefore.Round(time.Millisecond), (decodeCPUBefore.pg + decodeCPUBefore.rest).Seconds(),
			decodeAfter.Round(time.Millisecond), (decodeCPUAfter.pg + decodeCPUAfter.rest).Seconds(), decodeCPU,
			leanRate, leanTook.Round(time.Millisecond), leanTookBefore.Round(time.Millisecond), (leanCPUBefore.pg + leanCPUBefore.rest).Seconds(),
			leanTookAfter.Round(time.Millisecond), (leanCPUAfter.pg + leanCPUAfter.rest).Seconds(), leanRate/decodeRate, leanCPU, leanProcs[0], leanProcs[1],
			rawRate, rawTook.Round(time.Millisecond), floorCPU.Seconds(), runtime.NumCPU(), floorRate, floorRate/decodeRate,
			applyRate, applyTook.Round(time.Millisecond), applyRate/decodeRate, applyRate/leanRate, applyRate/rawRate, applyRate/floorRate, applyCPU, applyProcs,
			cdcTarget, atTarget, (applyCPU.pg+applyCPU.rest).Seconds()/atTarget, applyCPU.pg.Seconds()/atTarget,
			rate, len(lags), p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond))
	}
}

// rawChangeColumns are the columns of a raw change row that tidemark
// writes.
const rawChangeColumns = "event_id, event_time, ingested_at, op, source_table, payload, row_key, old_row, commit_lsn"

// emptyChangeTable creates raw.<name>, a change table of the shape of
// raw.shop, with the partitions raw.shop's rows need.
func emptyChangeTable(b *testing.B, conn *pgx.Conn, name string) {
	b.Helper()
	ctx := context.Background()
	raw := raw.NewChangeTable(name, config.PartitionMonth)
	if err := raw.Ensure(ctx, conn); err != nil {
		b.Fatal(err)
	}
	var times []time.Time
	if err := conn.QueryRow(ctx, `SELECT array_agg(DISTINCT date_trunc('month', event_time)) FROM raw.shop`).Scan(&times); err != nil {
		b.Fatal(err)
	}
	if err := raw.EnsurePartitions(ctx, conn, raw.Missing(times)); err != nil {
		b.Fatal(err)
	}
}

// copyRawRows copies the raw change rows tidemark wrote into an empty
// change table of the same shape, COPY piped into COPY in the binary
// format tidemark writes them in, and returns how long it took: the cost
// of the raw rows alone.
func copyRawRows(b *testing.B, whDSN string) time.Duration {
	b.Helper()
	src, dst := connect(b, whDSN), connect(b, whDSN)
	emptyChangeTable(b, dst, "shop_copy")
	started := time.Now()
	pipeCOPY(b, src, dst, "COPY (SELECT "+rawChangeColumns+" FROM raw.shop) TO STDOUT (FORMAT binary)",
		"COPY raw.shop_copy ("+rawChangeColumns+") FROM STDIN (FORMAT binary)", int64(cdcChanges))
	return time.Since(started)
}

// serverFloor measures the CPU of the least the server must do for (b)
// besides decoding: COPY the raw change rows tidemark wrote, and the
// mirror's final rows, into empty tables of the same shape, from memory
// (read out beforehand, so that reading them costs nothing), in binary,
// the format the server reads at the least CPU. Any reader
// must at least receive every change ((a)'s CPU) and write each raw row
// and each final mirror row once; updates and deletes only add to that.
func serverFloor(b *testing.B, whDSN string) time.Duration {
	b.Helper()
	ctx := context.Background()
	conn := connect(b, whDSN)
	emptyChangeTable(b, conn, "shop_floor")
	if _, err := conn.Exec(ctx, `CREATE TABLE dw_orders_floor (LIKE dw_orders INCLUDING ALL)`); err != nil {
		b.Fatal(err)
	}
	var used time.Duration
	for _, l := range []struct{ out, in string }{
		{"COPY (SELECT " + rawChangeColumns + " FROM raw.shop) TO STDOUT (FORMAT binary)", "COPY raw.shop_floor (" + rawChangeColumns + ") FROM STDIN (FORMAT binary)"},
		{"COPY dw_orders TO STDOUT (FORMAT binary)", "COPY dw_orders_floor FROM STDIN (FORMAT binary)"},
	} {
		var buf bytes.Buffer
		if _, err := conn.PgConn().CopyTo(ctx, &buf, l.out); err != nil {
			b.Fatal(err)
		}
		// The backend's own CPU: autovacuum, busy with the tables (b)
		// left behind, would count in the server's.
		pid := int(conn.PgConn().PID())
		before := treesCPU(pid)[0]
		if _, err := conn.PgConn().CopyFrom(ctx, &buf, l.in); err != nil {
			b.Fatal(err)
		}
		used += time.Duration(treesCPU(pid)[0]-before) * clockTick
	}
	return used
}

// waitNoAutovacuum waits, up to two minutes, until no autovacuum worker
// of srv runs.
func waitNoAutovacuum(b *testing.B, srv *pgserver.Server) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	waitfor.Within(b, 2*time.Minute, "no autovacuum worker to run", func() bool {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n == 0
	})
}

// decodeOnly runs pg_recvlogical on slot of srcDSN up to end
// with the options tidemark's reader uses, throwing the output away, and
// returns how long it took and how many bytes it received.
func decodeOnly(b *testing.B, recvlogical, srcDSN, slot, end string) (time.Duration, int64) {
	b.Helper()
	started := time.Now()
	cmd := exec.CommandContext(context.Background(), recvlogical, "-d", srcDSN, "--slot", slot, "--start", "--no-loop",
		"--endpos", end, "-F", "0", "-f", "-",
		"-o", "proto_version=2", "-o", "publication_names=tidemark_shop", "-o", "streaming=on")
	var decoded countingWriter
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &decoded, &stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("pg_recvlogical: %v\n%s", err, stderr.String())
	}
	return time.Since(started), decoded.n
}

// countingWriter counts and discards what is written to it.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// runningReader is a CDC reader running in the background.
type runningReader struct {
	cancel context.CancelFunc
	done   chan error
}

// cdcSlots creates a source database (cdcSourceDDL and ddl) and a migrated
// warehouse on srv, lets a tidemark reader create its publication and slot
// and take its empty snapshot, stops it, and creates the decode-only slot
// bench_decode next to it: both slots then hold exactly the changes written
// after. It returns the source's DSN and pool, the warehouse pool and the
// configuration of source shop.
func cdcSlots(b *testing.B, srv *pgserver.Server, ddl ...string) (string, *pgxpool.Pool, *pgxpool.Pool, *config.Config) {
	b.Helper()
	ctx := context.Background()
	srcDSN := pgtest.NewDatabaseOn(b, srv)
	src := pgtest.Pool(b, srcDSN)
	for _, d := range append([]string{cdcSourceDDL}, ddl...) {
		if _, err := src.Exec(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
	whDSN := pgtest.NewDatabaseOn(b, srv)
	wh, cfg := cdcWarehouse(b, whDSN, srcDSN, "orders", "{table: dw_orders}")
	rd := startReader(b, cfg, wh)
	rd.waitSnapshotDone(b, wh)
	rd.stop(b)
	if _, err := src.Exec(ctx, `SELECT pg_create_logical_replication_slot('bench_decode', 'pgoutput')`); err != nil {
		b.Fatal(err)
	}
	return srcDSN, src, wh, cfg
}

// cdcWarehouse migrates the warehouse at whDSN and returns a pool on it
// and the configuration of CDC source shop reading table of srcDSN into
// the mirror described by mirrorYAML.
func cdcWarehouse(b *testing.B, whDSN, srcDSN, table, mirrorYAML string) (*pgxpool.Pool, *config.Config) {
	b.Helper()
	if _, err := migrate.Up(context.Background(), whDSN, nil); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Parse("bench.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
sources:
  shop:
    cdc: {dsn: %q, tables: [%s], heartbeat_every: 0s}
    mirror: %s
`, whDSN, srcDSN, table, mirrorYAML)), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	return pgtest.Pool(b, whDSN), cfg
}

func startReader(b *testing.B, cfg *config.Config, wh *pgxpool.Pool) *runningReader {
	b.Helper()
	cc, err := cdc.ConfigFrom(cfg, "shop")
	if err != nil {
		b.Fatal(err)
	}
	r, err := cdc.New(cc, wh, cdc.Options{GroupAge: cdcGroupAge, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &runningReader{cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	return rr
}

func (rr *runningReader) stop(b *testing.B) {
	b.Helper()
	rr.cancel()
	if err := <-rr.done; err != nil {
		b.Fatal(err)
	}
}

// waitSnapshotDone waits until the reader's initial snapshot is done; a
// reader stopped before that takes a new slot when it starts again.
func (rr *runningReader) waitSnapshotDone(b *testing.B, wh *pgxpool.Pool) {
	b.Helper()
	rr.waitFor(b, wh, "the initial snapshot to finish", time.Minute, `SELECT snapshot = 'done' FROM tidemark.cdc_positions WHERE source = 'shop'`)
}

// waitDecodedPast writes one row after everything written so far and waits
// until the mirror has it: the reader has then decoded past all earlier
// WAL, whether or not it held tracked changes.
func waitDecodedPast(b *testing.B, src, wh *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	var id int64
	if err := src.QueryRow(ctx, `SELECT coalesce(max(id), 0) + 1 FROM orders`).Scan(&id); err != nil {
		b.Fatal(err)
	}
	if _, err := src.Exec(ctx, cdcInsertSQL, id, id); err != nil {
		b.Fatal(err)
	}
	waitfor.Within(b, 3*time.Minute, fmt.Sprintf("row %d to reach the mirror", id), func() bool {
		var n int64
		return wh.QueryRow(ctx, `SELECT count(*) FROM dw_orders WHERE id = $1`, id).Scan(&n) == nil && n == 1
	})
}

// waitApplied waits until applied_lsn, the end of the last source
// transaction the reader applied, reaches end. A position inside the last
// transaction written, after its changes and before its commit (see
// writeOrders), is reached once every transaction is applied, and not
// before.
func (rr *runningReader) waitApplied(b *testing.B, wh *pgxpool.Pool, end string, limit time.Duration) {
	b.Helper()
	rr.waitFor(b, wh, "the changes up to "+end+" to be applied", limit,
		`SELECT coalesce(applied_lsn >= $1::pg_lsn, false) FROM tidemark.cdc_positions WHERE source = 'shop'`, end)
}

// waitFor polls query, which returns one boolean, until it is true; the
// reader stopping or the limit passing fails the benchmark.
func (rr *runningReader) waitFor(b *testing.B, wh *pgxpool.Pool, what string, limit time.Duration, query string, args ...any) {
	b.Helper()
	if waitfor.Poll(limit, func() bool {
		select {
		case err := <-rr.done:
			b.Fatalf("the reader stopped while waiting for %s: %v", what, err)
		default:
		}
		var done bool
		return wh.QueryRow(context.Background(), query, args...).Scan(&done) == nil && done
	}) == nil {
		return
	}
	var applied, confirmed string
	_ = wh.QueryRow(context.Background(), `SELECT applied_lsn::text, confirmed_lsn::text FROM tidemark.cdc_positions WHERE source = 'shop'`).Scan(&applied, &confirmed)
	b.Fatalf("waited %s for %s: applied %s, confirmed %s", limit, what, applied, confirmed)
}

// writeCDCWorkload writes n changes (BenchmarkCDC: 1M) in transactions of
// 1,000 and returns a WAL position inside
// the last transaction, after its changes and before its commit (see
// writeOrders). pg_current_wal_lsn() after the last commit would be at or
// past its end, past it when other WAL was written in between, where
// applied_lsn never arrives.
func writeCDCWorkload(b *testing.B, src *pgxpool.Pool, n int) string {
	b.Helper()
	var end string
	for i := range n / cdcTxnChanges {
		var err error
		if end, err = writeCDCTxn(context.Background(), src, i); err != nil {
			b.Fatal(err)
		}
	}
	return end
}

// cdcTxnChanges is the number of changes of each transaction of
// BenchmarkCDC's workload.
const cdcTxnChanges = 1000

// writeCDCTxn writes transaction i (from 0) of BenchmarkCDC's workload to
// an orders table that held none of the rows of the transactions before
// it, and returns a WAL position inside it, after its changes and before
// its commit. Each block of ten transactions inserts 6,000 rows, updates
// the first 3,000 of them and deletes the next 1,000.
func writeCDCTxn(ctx context.Context, src *pgxpool.Pool, i int) (string, error) {
	const txn = cdcTxnChanges
	block := int64(i/10) * 6 * txn
	sql, from := cdcInsertSQL, block+int64(i%10)*txn+1
	switch {
	case i%10 >= 6 && i%10 < 9:
		sql, from = cdcUpdateSQL, block+int64(i%10-6)*txn+1
	case i%10 == 9:
		sql, from = cdcDeleteSQL, block+3*txn+1
	}
	var end string
	err := pgx.BeginFunc(ctx, src, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, from, from+txn-1)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != txn {
			return fmt.Errorf("%s changed %d rows, want %d", tag, tag.RowsAffected(), txn)
		}
		return tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end)
	})
	if err != nil {
		return "", fmt.Errorf("transaction %d of the workload: %w", i, err)
	}
	return end, nil
}

// steadyLag writes transactions of 50 changes (35 inserts, 10 updates, 5
// deletes) at the given rate while a watcher polls the mirror every 5 ms,
// and returns each transaction's lag (sorted) and the rate achieved.
func steadyLag(b *testing.B, src, wh *pgxpool.Pool, perSecond int, d time.Duration) ([]time.Duration, float64) {
	b.Helper()
	ctx := context.Background()
	var base int64
	if err := src.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM orders`).Scan(&base); err != nil {
		b.Fatal(err)
	}
	const perTxn = 50
	every := time.Second * perTxn / time.Duration(perSecond)

	type committed struct {
		maxID int64
		at    time.Time
	}
	var (
		mu   sync.Mutex
		seen []committed // watcher observations: max id visible at a time
	)
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for wctx.Err() == nil {
			var m int64
			if err := wh.QueryRow(wctx, `SELECT coalesce(max(id), 0) FROM dw_orders`).Scan(&m); err == nil {
				mu.Lock()
				seen = append(seen, committed{m, time.Now()})
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond) // how often the lag is sampled, not a wait
		}
	}()

	var sent []committed
	var changes int64
	tick := time.NewTicker(every)
	started := time.Now()
	next := base + 1
	for time.Since(started) < d {
		<-tick.C
		tx, err := src.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, st := range []struct {
			sql      string
			from, to int64
		}{{cdcInsertSQL, next, next + 34}, {cdcUpdateSQL, next - 300, next - 291}, {cdcDeleteSQL, next - 600, next - 596}} {
			tag, err := tx.Exec(ctx, st.sql, st.from, st.to)
			if err != nil {
				b.Fatal(err)
			}
			changes += tag.RowsAffected()
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		sent = append(sent, committed{next + 34, time.Now()})
		next += 35
	}
	tick.Stop()
	took := time.Since(started)
	last := sent[len(sent)-1].maxID
	waitfor.Until(b, "the watcher to see the mirror catch up after the steady load", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && seen[len(seen)-1].maxID >= last
	})
	stopWatch()
	<-watched

	lags := make([]time.Duration, 0, len(sent))
	j := 0
	for _, s := range sent {
		for j < len(seen) && seen[j].maxID < s.maxID {
			j++
		}
		lags = append(lags, seen[j].at.Sub(s.at))
	}
	slices.Sort(lags)
	return lags, float64(changes) / took.Seconds()
}

// percentile returns the q-quantile of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
