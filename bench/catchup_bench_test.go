package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// catchUpDays is the length of the catch-up: a year of day partitions.
const catchUpDays = 365

const (
	// catchUpEventsSQL writes n events spread over [from, to), in the
	// server, as the ingester would store them.
	catchUpEventsSQL = `
INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
SELECT $1 || '-' || g, t, t + interval '1 minute',
       jsonb_build_object('event_id', $1 || '-' || g, 'amount', (g % 10000) / 100.0, 'pad', repeat('x', 120))
FROM generate_series(0, $4 - 1) AS g,
     LATERAL (SELECT $2::timestamptz + ($3::timestamptz - $2::timestamptz) * (g::float8 / $4)) AS s (t)`

	// catchUpLedgerSQL writes the ledger rows of those events, one per
	// UTC hour, with the transaction's id.
	catchUpLedgerSQL = `
INSERT INTO tidemark.ingest_ledger (source, load_xid, bucket, rows, min_event_time, max_event_time, ingested_at)
SELECT 'app_events', pg_current_xact_id(), date_bin('1 hour', event_time, timestamptz '2000-01-01 00:00:00+00'),
       count(*), min(event_time), max(event_time), max(ingested_at)
FROM raw.app_events WHERE event_id LIKE $1 || '-%' AND event_time >= $2 AND event_time < $3
GROUP BY 3`

	// catchUpResetSQL moves the load watermark back before the year, so
	// that the next claim reads the whole ledger and queues every day:
	// the catch-up after an outage.
	catchUpResetSQL = `
UPDATE tidemark.load_watermarks SET load_xid = (SELECT min(load_xid) FROM tidemark.ingest_ledger WHERE source = 'app_events')
WHERE aggregate = 'daily_sales'`

	catchUpCheckSQL = `
SELECT (SELECT count(*) FROM daily_sales), (SELECT count(*) FROM tidemark.pending_partitions),
       (SELECT count(*) FROM tidemark.partitions WHERE rebuilt_at >= $1)`
)

// catchUpWarehouse is a warehouse holding a year of raw events with their
// ledger rows, and the configuration of a daily aggregate over them.
type catchUpWarehouse struct {
	dsn  string
	cfg  *config.Config
	pool *pgxpool.Pool
	now  time.Time
}

// loadCatchUp creates the warehouse: catchUpDays days of perDay events,
// loaded in transactions of 30 days, each with its ledger rows.
func loadCatchUp(b *testing.B, srv *pgserver.Server, perDay int) *catchUpWarehouse {
	b.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDatabaseOn(b, srv)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	raw := raw.NewTable("app_events", config.PartitionDay)
	if err := raw.Ensure(ctx, conn); err != nil {
		b.Fatal(err)
	}
	first := time.Date(2025, 10, 5, 0, 0, 0, 0, time.UTC)
	var starts []time.Time
	for d := 0; d <= catchUpDays; d++ {
		starts = append(starts, first.AddDate(0, 0, d))
	}
	if err := raw.EnsurePartitions(ctx, conn, raw.Missing(starts)); err != nil {
		b.Fatal(err)
	}
	started := time.Now()
	const chunkDays = 30
	for d := 0; d < catchUpDays; d += chunkDays {
		from := first.AddDate(0, 0, d)
		to := first.AddDate(0, 0, min(d+chunkDays, catchUpDays))
		prefix := fmt.Sprintf("c%d", d)
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			days := int(to.Sub(from).Hours() / 24)
			if _, err := tx.Exec(ctx, catchUpEventsSQL, prefix, from, to, days*perDay); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, catchUpLedgerSQL, prefix, from, to)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "loaded %d days of %d events (%d rows) in %s\n", catchUpDays, perDay, catchUpDays*perDay,
		time.Since(started).Round(time.Second))
	cfg, err := config.Parse("bench.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
kafka: {brokers: ["127.0.0.1:1"]}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
aggregates:
  daily_sales:
    source: app_events
    table: daily_sales
    partition: {by: day, column: sale_date}
    lateness_horizon: 72h
    sql: |
      SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*) AS event_count
      FROM {{events}} GROUP BY 1
`, dsn)), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	return &catchUpWarehouse{dsn: dsn, cfg: cfg, pool: pgtest.Pool(b, dsn), now: first.AddDate(0, 0, catchUpDays+1)}
}

// catchUpInstance is one tidemark instance: a reconciler with a pool of
// its own. claimed is set when one of the instances has claimed.
type catchUpInstance struct {
	r       *reconcile.Reconciler
	claimed *atomic.Bool
}

func (w *catchUpWarehouse) instance(b *testing.B, claimed *atomic.Bool) *catchUpInstance {
	b.Helper()
	pool := pgtest.Pool(b, w.dsn)
	r, err := reconcile.New(w.cfg, pool, reconcile.Options{Now: func() time.Time { return w.now },
		AfterClaim: func(string) error { claimed.Store(true); return nil }})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Prepare(context.Background()); err != nil {
		b.Fatal(err)
	}
	return &catchUpInstance{r: r, claimed: claimed}
}

// drain runs reconcile passes as `tidemark run` does on every tick, one
// after the other, until a claim has happened and nothing is queued. A
// pass that finds another instance holding the aggregate rebuilds beside
// it. It returns the partitions this instance rebuilt.
func (in *catchUpInstance) drain(ctx context.Context) (int, error) {
	n := 0
	for {
		rep, err := in.r.RunOnce(ctx, "daily_sales", false)
		busy := err == nil && rep.Busy
		if busy {
			rep, err = in.r.Help(ctx, "daily_sales")
		}
		if err != nil {
			return n, err
		}
		n += len(rep.Rebuilt)
		if in.claimed.Load() && rep.Remaining == 0 {
			return n, nil
		}
		if busy && len(rep.Rebuilt) == 0 {
			time.Sleep(5 * time.Millisecond) // the pause between passes, as a tick of `tidemark run`: not a wait
		}
	}
}

// catchUp resets the load watermark and times the instances draining the
// year from the claim to an empty queue. It returns the wall time and the
// partitions each instance rebuilt.
func (w *catchUpWarehouse) catchUp(b *testing.B, claimed *atomic.Bool, instances []*catchUpInstance) (time.Duration, []int) {
	b.Helper()
	ctx := context.Background()
	if _, err := w.pool.Exec(ctx, catchUpResetSQL); err != nil {
		b.Fatal(err)
	}
	claimed.Store(false)
	mark := time.Now()
	counts := make([]int, len(instances))
	errs := make([]error, len(instances))
	var wg sync.WaitGroup
	started := time.Now()
	for i, in := range instances {
		wg.Go(func() { counts[i], errs[i] = in.drain(ctx) })
	}
	wg.Wait()
	took := time.Since(started)
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	var rows, queued, rebuilt int
	if err := w.pool.QueryRow(ctx, catchUpCheckSQL, mark.Add(-time.Second)).Scan(&rows, &queued, &rebuilt); err != nil {
		b.Fatal(err)
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	if rows != catchUpDays || queued != 0 || total != catchUpDays {
		b.Fatalf("after the catch-up: %d aggregate rows, %d queued, %d rebuilds reported; want %d, 0, %d", rows, queued, total, catchUpDays, catchUpDays)
	}
	return took, counts
}

// BenchmarkCatchUp measures a catch-up after an outage: the load watermark
// of a daily aggregate is moved back a year, so one claim queues 365 day
// partitions, and the wall time from the claim to an empty queue is taken
// with one instance and with two (each with its own pool, as two `tidemark
// run` processes), alternating, best of 3 each. The second instance,
// finding the aggregate held, rebuilds queued partitions beside the
// holder. It reports both times and their ratio (the speed-up).
func BenchmarkCatchUp(b *testing.B) {
	perDay := envInt("TIDEMARK_BENCH_CATCHUP_EVENTS_PER_DAY", 10_000)
	srv := pgtest.NewServer(b, pgserver.Options{Durable: true, Settings: map[string]string{
		"shared_buffers": "512MB", "max_wal_size": "4GB", "checkpoint_timeout": "30min"}})
	w := loadCatchUp(b, srv, perDay)
	var claimed atomic.Bool
	one := []*catchUpInstance{w.instance(b, &claimed)}
	two := []*catchUpInstance{one[0], w.instance(b, &claimed)}
	w.catchUp(b, &claimed, one) // warm the cache and create every aggregate row
	for i := 0; i < b.N; i++ {
		var t1, t2 []time.Duration
		var shares [][]int
		for round := 0; round < 3; round++ {
			d, _ := w.catchUp(b, &claimed, one)
			t1 = append(t1, d)
			d, counts := w.catchUp(b, &claimed, two)
			t2 = append(t2, d)
			shares = append(shares, counts)
		}
		m1, m2 := slices.Min(t1), slices.Min(t2)
		speedup := m1.Seconds() / m2.Seconds()
		b.ReportMetric(m1.Seconds(), "s/catch_up_1")
		b.ReportMetric(m2.Seconds(), "s/catch_up_2")
		b.ReportMetric(speedup, "1/2")
		fmt.Fprintf(os.Stderr, `
catch-up of %d day partitions (%d events a day), from the claim to an empty queue, best of 3
  one instance   %8s  %v
  two instances  %8s  %v  partitions per instance %v
  speed-up one/two = %.2f
`, catchUpDays, perDay, m1.Round(time.Millisecond), t1, m2.Round(time.Millisecond), t2, shares, speedup)
	}
}
