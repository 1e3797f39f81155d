package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/benchplot"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// dailySalesSQL is the aggregate the reconcile benchmarks maintain.
const dailySalesSQL = `SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*) AS event_count
FROM {{events}} GROUP BY 1`

// historyDB is a warehouse holding days of raw history at perDay events a
// day, reconciled up to its present.
type historyDB struct {
	cfg  *config.Config
	dsn  string
	pool *pgxpool.Pool
	r    *reconcile.Reconciler
	last time.Time // the last day of history
	now  time.Time // the service clock: a day after the last day
}

// loadHistory creates a warehouse on srv with days of history.
func loadHistory(b *testing.B, srv *pgserver.Server, days, perDay int) *historyDB {
	b.Helper()
	return loadHistoryIn(b, pgtest.NewDatabaseOn(b, srv), days, perDay)
}

// loadHistoryIn fills the empty database dsn with days of history. Rows
// are generated in the server, with ledger rows as the ingester writes
// them; the aggregate's load watermark is then set past the history, as if
// it had been reconciled all along.
func loadHistoryIn(b *testing.B, dsn string, days, perDay int) *historyDB {
	b.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	raw := raw.NewTable(source, config.PartitionDay)
	if err := raw.Ensure(ctx, conn); err != nil {
		b.Fatal(err)
	}
	last := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)
	first := last.AddDate(0, 0, -(days - 1))
	var starts []time.Time
	for d := first; !d.After(last.AddDate(0, 0, 1)); d = d.AddDate(0, 0, 1) {
		starts = append(starts, d)
	}
	if err := raw.EnsurePartitions(ctx, conn, raw.Missing(starts)); err != nil {
		b.Fatal(err)
	}
	started := time.Now()
	const chunkDays = 50
	for d := 0; d < days; d += chunkDays {
		from := first.AddDate(0, 0, d)
		n := min(chunkDays, days-d)
		if err := insertEvents(ctx, conn, fmt.Sprintf("h%d", d), from, from.AddDate(0, 0, n), n*perDay, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO tidemark.load_watermarks (aggregate, source, load_xid)
		VALUES ('daily_sales', $1, pg_snapshot_xmin(pg_current_snapshot()))`, source); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "loaded %d days of %d events (%d rows) in %s\n", days, perDay, days*perDay, time.Since(started).Round(time.Second))

	h := &historyDB{dsn: dsn, last: last, now: last.AddDate(0, 0, 1).Add(12 * time.Hour)}
	h.pool = pgtest.Pool(b, dsn)
	cfg, err := config.Parse("bench.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
kafka: {brokers: ["127.0.0.1:1"]}
sources:
  %s:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
aggregates:
  daily_sales:
    source: %s
    table: daily_sales
    partition: {by: day, column: sale_date}
    lateness_horizon: 72h
    sql: %q
`, dsn, source, source, dailySalesSQL)), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	h.cfg = cfg
	h.r, err = reconcile.New(cfg, h.pool, reconcile.Options{Now: func() time.Time { return h.now }})
	if err != nil {
		b.Fatal(err)
	}
	if err := h.r.Prepare(ctx); err != nil {
		b.Fatal(err)
	}
	return h
}

// insertEvents writes n events spread over [from, to) in one transaction,
// with the ledger rows the ingester would write, generated in the server.
func insertEvents(ctx context.Context, conn *pgx.Conn, prefix string, from, to time.Time, n int, delay time.Duration) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
SELECT $1 || '-' || g, t, t + $5::interval, jsonb_build_object('event_id', $1 || '-' || g, 'amount', (g % 10000) / 100.0, 'pad', repeat('x', 120))
FROM generate_series(0, $4 - 1) AS g,
     LATERAL (SELECT $2::timestamptz + ($3::timestamptz - $2::timestamptz) * (g::float8 / $4)) AS s (t)`,
			prefix, from, to, n, delay.String())
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
INSERT INTO tidemark.ingest_ledger (source, load_xid, bucket, rows, min_event_time, max_event_time, ingested_at)
SELECT $1, pg_current_xact_id(), date_bin('1 hour', event_time, timestamptz '2000-01-01 00:00:00+00'),
       count(*), min(event_time), max(event_time), max(ingested_at)
FROM raw.app_events WHERE event_id LIKE $2 || '-%' AND event_time >= $3 AND event_time < $4
GROUP BY 3`, source, prefix, from, to)
		return err
	})
}

// absorb loads 10k new events over the last three days of history and
// times one reconcile run absorbing them.
func (h *historyDB) absorb(b *testing.B, round int) time.Duration {
	b.Helper()
	ctx := context.Background()
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	err = insertEvents(ctx, conn.Conn(), fmt.Sprintf("new%d", round), h.last.AddDate(0, 0, -2), h.last.AddDate(0, 0, 1), 10_000, 30*time.Hour)
	conn.Release()
	if err != nil {
		b.Fatal(err)
	}
	started := time.Now()
	rep, err := h.r.RunOnce(ctx, "daily_sales", true)
	if err != nil {
		b.Fatal(err)
	}
	if len(rep.Rebuilt) != 3 || rep.Remaining != 0 {
		b.Fatalf("run absorbed %+v, want 3 partitions rebuilt", rep)
	}
	return time.Since(started)
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkReconcileHistory measures the cost of a reconcile run that
// absorbs the same 10k new events when the raw history holds 1M, 5M and
// 20M rows, at the same density per day (so the touched partitions are
// alike and only the history differs). Target: ratio 20M/1M <= 1.3. It
// writes the curve to reconcile_history.json and .svg.
func BenchmarkReconcileHistory(b *testing.B) {
	perDay := size("TIDEMARK_BENCH_EVENTS_PER_DAY", 10_000, 2_000)
	smallRows := size("TIDEMARK_BENCH_SMALL_HISTORY", 1_000_000, 100_000)
	mediumRows := size("TIDEMARK_BENCH_MEDIUM_HISTORY", 5_000_000, 500_000)
	largeRows := size("TIDEMARK_BENCH_LARGE_HISTORY", 20_000_000, 2_000_000)
	srv := pgtest.NewServer(b, pgserver.Options{Durable: true, Settings: map[string]string{
		"shared_buffers": "512MB", "max_wal_size": "8GB", "checkpoint_timeout": "30min"}})
	sizes := []int{smallRows, mediumRows, largeRows}
	histories := make([]*historyDB, len(sizes))
	for i, rows := range sizes {
		histories[i] = loadHistory(b, srv, rows/perDay, perDay)
	}
	for i := 0; i < b.N; i++ {
		tab := &benchplot.Table{Name: "reconcile_history", Title: "Reconcile run vs history size",
			Meta:    runMeta(b, srv),
			Columns: []string{"history_rows", "days", "run_ms", "per_smallest", "other_cores"}}
		tab.Meta["workload"] = fmt.Sprintf("%d events a day; each round loads 10,000 events over the last 3 days and one run absorbs them; median of 7 rounds, histories alternating", perDay)
		m := meterCPU()
		runs := make([][]time.Duration, len(sizes))
		for round := 0; round < 7; round++ {
			for j, h := range histories {
				runs[j] = append(runs[j], h.absorb(b, round))
			}
		}
		other := m.otherCores()
		fmt.Fprintf(os.Stderr, "\nreconcile run absorbing 10k new events (3 day partitions rebuilt, %d events a day), median of 7\n", perDay)
		for j, rows := range sizes {
			md := median(runs[j])
			addRow(b, tab, float64(rows), float64(rows/perDay), ms(md), md.Seconds()/median(runs[0]).Seconds(), other)
			fmt.Fprintf(os.Stderr, "  history of %9d rows (%4d days)  %8s\n", rows, rows/perDay, md.Round(time.Millisecond))
		}
		mSmall, mLarge := median(runs[0]), median(runs[len(runs)-1])
		ratio := mLarge.Seconds() / mSmall.Seconds()
		b.ReportMetric(ms(mSmall), "ms/run_1M")
		b.ReportMetric(ms(mLarge), "ms/run_20M")
		b.ReportMetric(ratio, "20M/1M")
		fmt.Fprintf(os.Stderr, "  ratio largest/smallest = %.2f (target <= 1.3)\n", ratio)
		target := 1.3
		saveCurve(b, tab, benchplot.Figure{
			Title: "Reconcile run absorbing 10k events (3 day partitions), fsync on",
			Panels: []benchplot.Panel{{
				Title: "run time", XLabel: "raw history (rows)", YLabel: "run time (ms, median of 7)", LogX: true,
				Series: []benchplot.Series{series(b, tab, "reconcile run", "history_rows", "run_ms", nil)},
			}, {
				Title: "ratio to the smallest history", XLabel: "raw history (rows)", YLabel: "run time / smallest (ratio)", LogX: true,
				Series:    []benchplot.Series{series(b, tab, "run time / smallest history", "history_rows", "per_smallest", nil)},
				Reference: &target, ReferenceLabel: "target 1.3",
			}},
		})
	}
}

// BenchmarkRebuildPartition compares aggregate.Rebuild of one day with the
// hand-written DELETE and INSERT ... SELECT ... GROUP BY of the same day,
// each in its own transaction, alternating, in the same run. Target:
// <= 1.2x. A whole reconcile run rebuilding that day is timed as well.
func BenchmarkRebuildPartition(b *testing.B) {
	perDay := size("TIDEMARK_BENCH_PARTITION_EVENTS", 200_000, 20_000)
	srv := pgtest.NewServer(b, pgserver.Options{Durable: true, Settings: map[string]string{"shared_buffers": "512MB"}})
	h := loadHistory(b, srv, 3, perDay)
	ctx := context.Background()
	hc, err := h.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer hc.Release()
	conn := hc.Conn()
	def, err := aggregate.FromConfig(h.cfg, "daily_sales")
	if err != nil {
		b.Fatal(err)
	}
	if err := aggregate.Prepare(ctx, conn, def); err != nil {
		b.Fatal(err)
	}
	p := def.Of(h.last)
	for i := 0; i < b.N; i++ {
		var ours, hand, runs []time.Duration
		for round := 0; round < 9; round++ {
			started := time.Now()
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				_, err := aggregate.Rebuild(ctx, tx, def, p, h.now)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			ours = append(ours, time.Since(started))

			started = time.Now()
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `DELETE FROM daily_sales WHERE sale_date = $1::date`, p.Start); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO daily_sales (sale_date, total, event_count)
SELECT $1::date, sum((payload->>'amount')::numeric(12,2)), count(*)
FROM raw.app_events WHERE event_time >= $2 AND event_time < $3 GROUP BY 1`, p.Start, p.Start, p.End)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			hand = append(hand, time.Since(started))

			if _, err := conn.Exec(ctx, `INSERT INTO tidemark.pending_partitions (aggregate, partition_start, partition_end, reason, queued_at)
				VALUES ('daily_sales', $1, $2, 'bench', now())`, p.Start, p.End); err != nil {
				b.Fatal(err)
			}
			started = time.Now()
			rep, err := h.r.RunOnce(ctx, "daily_sales", true)
			if err != nil || len(rep.Rebuilt) != 1 {
				b.Fatalf("reconcile run: %v %+v", err, rep)
			}
			runs = append(runs, time.Since(started))
		}
		mo, mh, mr := median(ours), median(hand), median(runs)
		ratio := mo.Seconds() / mh.Seconds()
		b.ReportMetric(float64(mo.Microseconds())/1000, "ms/rebuild")
		b.ReportMetric(float64(mh.Microseconds())/1000, "ms/hand_written")
		b.ReportMetric(float64(mr.Microseconds())/1000, "ms/reconcile_run")
		b.ReportMetric(ratio, "rebuild/hand_written")
		fmt.Fprintf(os.Stderr, `
rebuilding one day of %d events, median of 9, alternating
  aggregate.Rebuild (lock, delete, insert, check, status)  %8s
  hand-written DELETE + INSERT ... SELECT ... GROUP BY    %8s
  ratio = %.2f (target <= 1.2)
  a whole reconcile run rebuilding that day                %8s
`, perDay, mo.Round(100*time.Microsecond), mh.Round(100*time.Microsecond), ratio, mr.Round(100*time.Microsecond))
	}
}
