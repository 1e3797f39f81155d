package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/benchplot"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// handWrittenSQL rebuilds the days [$1, $2) of one daily_sales-shaped
// table from the raw rows in one statement: what one would write by hand
// for the aggregate of dailySalesSQL.
const handWrittenSQL = `INSERT INTO %s (sale_date, total, event_count)
SELECT (event_time AT TIME ZONE 'UTC')::date, sum((payload->>'amount')::numeric(12,2)), count(*)
FROM raw.app_events WHERE event_time >= $1 AND event_time < $2 GROUP BY 1`

// handWritten deletes the days [from, to) of table and rebuilds them with
// handWrittenSQL, in one transaction.
func handWritten(ctx context.Context, conn *pgx.Conn, table string, from, to time.Time) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE sale_date >= $1::date AND sale_date < $2::date`, from, to); err != nil {
			return fmt.Errorf("delete %s: %w", table, err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(handWrittenSQL, table), from, to); err != nil {
			return fmt.Errorf("insert %s: %w", table, err)
		}
		return nil
	})
}

// aggregatesConfig configures n aggregates, agg_001 to agg_<n>, each the
// daily_sales query over the one source, each into its own table.
func aggregatesConfig(dsn string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
warehouse: {dsn: %q}
kafka: {brokers: ["127.0.0.1:1"]}
reconcile: {max_partitions_per_run: 1000}
sources:
  %s:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
aggregates:
`, dsn, source)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, `  agg_%03d:
    source: %s
    table: agg_%03d
    partition: {by: day, column: sale_date}
    lateness_horizon: 72h
    sql: %q
`, i, source, i, dailySalesSQL)
	}
	return b.String()
}

// BenchmarkReconcileAggregates measures one reconcile pass (a run of each
// aggregate, one after the other, as `tidemark run` does) absorbing 10k
// new events over three days, against the number of aggregates over the
// one source (1, 10, 100), next to the hand-written DELETE and INSERT ...
// SELECT of the same three days for each aggregate. Median of 3,
// alternating. It writes reconcile_aggregates.json and .svg.
func BenchmarkReconcileAggregates(b *testing.B) {
	perDay := size("TIDEMARK_BENCH_EVENTS_PER_DAY", 10_000, 2_000)
	counts := []int{1, 10, 100}
	srv := pgtest.NewServer(b, pgserver.Options{Durable: true, Settings: map[string]string{"shared_buffers": "512MB", "max_wal_size": "4GB"}})
	h := loadHistory(b, srv, 30, perDay)
	ctx := context.Background()
	conn := connect(b, h.dsn)
	for range b.N {
		started := time.Now()
		tab := &benchplot.Table{Name: "reconcile_aggregates", Title: "Reconcile pass vs aggregates over one source",
			Meta:    runMeta(b, srv),
			Columns: []string{"aggregates", "tidemark_ms", "hand_written_ms", "tidemark_per_hand_written", "other_cores"}}
		tab.Meta["workload"] = fmt.Sprintf("30 days of %d events a day; each round loads 10,000 events over the last 3 days, then every aggregate absorbs them (3 partitions each); median of 3 rounds", perDay)
		round := 0
		for _, n := range counts {
			cfg, err := config.Parse("bench.yaml", []byte(aggregatesConfig(h.dsn, n)), func(string) (string, bool) { return "", false })
			if err != nil {
				b.Fatal(err)
			}
			r, err := reconcile.New(cfg, h.pool, reconcile.Options{Now: func() time.Time { return h.now }, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Prepare(ctx); err != nil {
				b.Fatal(err)
			}
			// Every aggregate starts from the present: the history and
			// earlier rounds are absorbed.
			if _, err := conn.Exec(ctx, `INSERT INTO tidemark.load_watermarks (aggregate, source, load_xid)
				SELECT name, $1, pg_snapshot_xmin(pg_current_snapshot()) FROM unnest($2::text[]) AS name
				ON CONFLICT (aggregate) DO UPDATE SET load_xid = excluded.load_xid`, source, r.Aggregates()); err != nil {
				b.Fatal(err)
			}
			m := meterCPU()
			var ours, hand []time.Duration
			for range 3 {
				round++
				if err := insertEvents(ctx, conn, fmt.Sprintf("agg%d", round), h.last.AddDate(0, 0, -2), h.last.AddDate(0, 0, 1), 10_000, 30*time.Hour); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				for _, name := range r.Aggregates() {
					rep, err := r.RunOnce(ctx, name, true)
					if err != nil {
						b.Fatal(err)
					}
					if len(rep.Rebuilt) != 3 || rep.Remaining != 0 {
						b.Fatalf("%s absorbed %+v, want 3 partitions rebuilt", name, rep)
					}
				}
				ours = append(ours, time.Since(t0))
				t0 = time.Now()
				for _, name := range r.Aggregates() {
					if err := handWritten(ctx, conn, name, h.last.AddDate(0, 0, -2), h.last.AddDate(0, 0, 1)); err != nil {
						b.Fatal(err)
					}
				}
				hand = append(hand, time.Since(t0))
			}
			mo, mh := median(ours), median(hand)
			addRow(b, tab, float64(n), ms(mo), ms(mh), mo.Seconds()/mh.Seconds(), m.otherCores())
			fmt.Fprintf(os.Stderr, "reconcile pass over %3d aggregates: %8s, hand-written %8s, ratio %.2f\n", n, mo.Round(time.Millisecond), mh.Round(time.Millisecond), mo.Seconds()/mh.Seconds())
		}
		tab.Meta["took"] = time.Since(started).Round(time.Second).String()
		saveCurve(b, tab, benchplot.Figure{
			Title: "Reconcile pass absorbing 10k events (3 day partitions per aggregate), fsync on",
			Panels: []benchplot.Panel{{
				Title: "run time", XLabel: "aggregates over one source", YLabel: "time (ms, median of 3)", LogX: true, LogY: true,
				Series: []benchplot.Series{
					series(b, tab, "tidemark reconcile pass", "aggregates", "tidemark_ms", nil),
					series(b, tab, "hand-written DELETE + INSERT ... SELECT", "aggregates", "hand_written_ms", nil),
				},
			}, {
				Title: "ratio to hand-written", XLabel: "aggregates over one source", YLabel: "tidemark / hand-written (ratio)", LogX: true,
				Series: []benchplot.Series{series(b, tab, "tidemark / hand-written", "aggregates", "tidemark_per_hand_written", nil)},
			}},
		})
	}
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkBackfill measures `tidemark backfill` (backfill.Run, chunks of
// one day, concurrency 1 and 2) of the last 30, 90 and 365 daily
// partitions of a year of history, against the hand-written DELETE and
// INSERT ... SELECT ... GROUP BY of the same range in one transaction
// (the same aggregate query). Median of 3, alternating. It writes
// backfill.json and backfill.svg.
func BenchmarkBackfill(b *testing.B) {
	perDay := size("TIDEMARK_BENCH_BACKFILL_EVENTS_PER_DAY", 10_000, 1_000)
	srv := pgtest.NewServer(b, pgserver.Options{Durable: true, Settings: map[string]string{
		"shared_buffers": "512MB", "max_wal_size": "4GB", "checkpoint_timeout": "15min"}})
	h := loadHistory(b, srv, 365, perDay)
	ctx := context.Background()
	conn := connect(b, h.dsn)
	def, err := aggregate.FromConfig(h.cfg, "daily_sales")
	if err != nil {
		b.Fatal(err)
	}
	if err := aggregate.Prepare(ctx, conn, def); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		started := time.Now()
		tab := &benchplot.Table{Name: "backfill", Title: "Backfill vs hand-written INSERT ... SELECT",
			Meta:    runMeta(b, srv),
			Columns: []string{"days", "rows", "backfill_s", "backfill_2_s", "hand_written_s", "backfill_per_hand_written", "backfill_2_per_hand_written", "other_cores"}}
		tab.Meta["workload"] = fmt.Sprintf("365 days of %d events a day; daily_sales (sum and count) over the last N days; median of 3 rounds", perDay)
		for _, days := range []int{30, 90, 365} {
			from, to := h.last.AddDate(0, 0, -(days-1)), h.last
			m := meterCPU()
			var one, two, hand []time.Duration
			for range 3 {
				for _, c := range []int{1, 2} {
					t0 := time.Now()
					rep, err := backfill.Run(ctx, h.pool, def, backfill.Range{From: from, To: to},
						backfill.Options{Concurrency: c, Reprocess: backfill.Completed, Now: func() time.Time { return h.now }})
					if err != nil {
						b.Fatal(err)
					}
					if rep.Done != days || len(rep.Failed) != 0 {
						b.Fatalf("backfill of %d days: %d chunks done, %d failed", days, rep.Done, len(rep.Failed))
					}
					if c == 1 {
						one = append(one, time.Since(t0))
					} else {
						two = append(two, time.Since(t0))
					}
				}
				t0 := time.Now()
				if err := handWritten(ctx, conn, "daily_sales", from, to.AddDate(0, 0, 1)); err != nil {
					b.Fatal(err)
				}
				hand = append(hand, time.Since(t0))
			}
			mo, m2, mh := median(one), median(two), median(hand)
			addRow(b, tab, float64(days), float64(days*perDay), mo.Seconds(), m2.Seconds(), mh.Seconds(),
				mo.Seconds()/mh.Seconds(), m2.Seconds()/mh.Seconds(), m.otherCores())
			fmt.Fprintf(os.Stderr, "backfill of %3d days: %8s (concurrency 2: %8s), hand-written %8s, ratio %.2f (%.2f)\n", days,
				mo.Round(time.Millisecond), m2.Round(time.Millisecond), mh.Round(time.Millisecond), mo.Seconds()/mh.Seconds(), m2.Seconds()/mh.Seconds())
		}
		tab.Meta["took"] = time.Since(started).Round(time.Second).String()
		saveCurve(b, tab, benchplot.Figure{
			Title: fmt.Sprintf("Backfill of daily partitions, %d events a day, fsync on", perDay),
			Panels: []benchplot.Panel{{
				Title: "wall time", XLabel: "daily partitions in the range", YLabel: "time (s, median of 3)", LogX: true, LogY: true,
				Series: []benchplot.Series{
					series(b, tab, "tidemark backfill", "days", "backfill_s", nil),
					series(b, tab, "tidemark backfill --concurrency 2", "days", "backfill_2_s", nil),
					series(b, tab, "hand-written INSERT ... SELECT", "days", "hand_written_s", nil),
				},
			}, {
				Title: "ratio to hand-written", XLabel: "daily partitions in the range", YLabel: "backfill / hand-written (ratio)", LogX: true,
				Series: []benchplot.Series{
					series(b, tab, "concurrency 1", "days", "backfill_per_hand_written", nil),
					series(b, tab, "concurrency 2", "days", "backfill_2_per_hand_written", nil),
				},
			}},
		})
	}
}
