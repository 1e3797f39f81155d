package lateness_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/lateness"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/reconcile"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testConfig has a timestamp-mode source over partner.sales and two
// aggregates over it in different calendars: days in UTC (twice, with
// different horizons), days in America/New_York (where 1 November 2026
// lasts 25 hours) and hours in Asia/Kolkata (UTC+05:30, so its hours
// start at :30 UTC).
const testConfig = `
warehouse: {dsn: %q}
sources:
  partner:
    table: {name: partner.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at}
aggregates:
  partner_daily:
    source: partner
    table: partner_daily
    partition: {by: day, column: day}
    lateness_horizon: 30h
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
  partner_daily_strict:
    source: partner
    table: partner_daily_strict
    partition: {by: day, column: day}
    lateness_horizon: 6h
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
  partner_ny:
    source: partner
    table: partner_ny
    partition: {by: day, column: day, time_zone: America/New_York}
    lateness_horizon: 2d
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
  partner_hourly:
    source: partner
    table: partner_hourly
    partition: {by: hour, column: hour, time_zone: Asia/Kolkata}
    lateness_horizon: 2h
    sql: SELECT {{partition}} AS hour, count(*) AS n FROM {{events}} GROUP BY 1
`

// lateSales fills partner.sales with n events between from and to whose
// delays mix early arrivals, minutes, hours and a few days.
func lateSales(t *testing.T, pool *pgxpool.Pool, n int, from, to time.Time) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA partner;
		CREATE TABLE partner.sales (id bigint PRIMARY KEY, occurred_at timestamptz NOT NULL, loaded_at timestamptz NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	ids, occurred, loaded := make([]int64, n), make([]time.Time, n), make([]time.Time, n)
	for i := range n {
		ev := from.Add(time.Duration(rng.Int64N(int64(to.Sub(from)))))
		var delay time.Duration
		switch r := rng.Float64(); {
		case r < 0.6:
			delay = time.Duration(rng.Int64N(int64(10 * time.Minute)))
		case r < 0.9:
			delay = time.Duration(rng.Int64N(int64(6 * time.Hour)))
		case r < 0.99:
			delay = time.Duration(rng.Int64N(int64(40 * time.Hour)))
		default:
			delay = time.Duration(rng.Int64N(int64(5 * 24 * time.Hour)))
		}
		ids[i], occurred[i], loaded[i] = int64(i), ev, ev.Add(delay).Truncate(time.Second)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO partner.sales SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[])`,
		ids, occurred, loaded); err != nil {
		t.Fatal(err)
	}
}

func setup(t *testing.T) (*pgxpool.Pool, *config.Config) {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	if _, err := migrate.Up(context.Background(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(testConfig, dsn)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return pool, cfg
}

// TestMeasureMatchesSQL checks every number of a lateness report against
// a direct SQL computation over the same rows: the quantiles (the k-th
// smallest delay, k = ceil(q·n)), min and max, every bin, the events beyond
// each horizon, and that the recommended horizon is the smallest that
// keeps the target share.
func TestMeasureMatchesSQL(t *testing.T) {
	pool, cfg := setup(t)
	ctx := context.Background()
	since, until := time.Date(2026, 10, 27, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 6, 0, 0, 0, 0, time.UTC)
	// Events outside the range must not count, nor those without an
	// ingestion time (a table source's column may allow NULL).
	lateSales(t, pool, 6000, since.Add(-48*time.Hour), until.Add(24*time.Hour))
	if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE partner.sales ALTER loaded_at DROP NOT NULL;
		INSERT INTO partner.sales SELECT 100000 + i, '%s'::timestamptz + i * interval '1 hour', NULL FROM generate_series(1, 50) i`,
		since.Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
	const target = 0.98
	rep, err := lateness.Measure(ctx, pool, cfg, "partner", lateness.Options{Since: since, Until: until, Target: target})
	if err != nil {
		t.Fatal(err)
	}
	delay := "extract(epoch FROM loaded_at - occurred_at)::float8"
	check := func(what, expr string, d lateness.Distribution) {
		t.Helper()
		inRange := fmt.Sprintf("FROM partner.sales WHERE occurred_at >= '%s' AND occurred_at < '%s' AND loaded_at IS NOT NULL",
			since.Format(time.RFC3339), until.Format(time.RFC3339))
		var n int64
		var lo, hi float64
		if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*), min(%[1]s), max(%[1]s) %[2]s", expr, inRange)).Scan(&n, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		if d.Events != n || d.Min != lo || d.Max != hi {
			t.Errorf("%s: events/min/max %d/%v/%v, SQL says %d/%v/%v", what, d.Events, d.Min, d.Max, n, lo, hi)
		}
		for i, q := range lateness.Quantiles {
			var want float64
			k := int64(math.Ceil(q*float64(n))) - 1
			if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT %s AS d %s ORDER BY d OFFSET $1 LIMIT 1", expr, inRange), k).Scan(&want); err != nil {
				t.Fatal(err)
			}
			if d.Quantiles[i] != want {
				t.Errorf("%s: p%v = %v, SQL says %v", what, q*100, d.Quantiles[i], want)
			}
		}
		var sum int64
		for i, got := range d.Bins {
			cond := []string{}
			if i > 0 {
				cond = append(cond, fmt.Sprintf("%s > %v", expr, d.Edges[i-1]))
			}
			if i < len(d.Edges) {
				cond = append(cond, fmt.Sprintf("%s <= %v", expr, d.Edges[i]))
			}
			where := inRange
			for _, c := range cond {
				where += " AND " + c
			}
			var want int64
			if err := pool.QueryRow(ctx, "SELECT count(*) "+where).Scan(&want); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: bin %d has %d events, SQL says %d", what, i, got, want)
			}
			sum += got
		}
		if sum != n {
			t.Errorf("%s: bins hold %d events of %d", what, sum, n)
		}
	}
	check("delay", delay, rep.Delay)
	if rep.Delay.Events < 3000 {
		t.Fatalf("only %d events measured", rep.Delay.Events)
	}
	ends := map[string]string{
		"partner_daily":        "(date_trunc('day', occurred_at AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'",
		"partner_daily_strict": "(date_trunc('day', occurred_at AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'",
		"partner_ny":           "(date_trunc('day', occurred_at AT TIME ZONE 'America/New_York') + interval '1 day') AT TIME ZONE 'America/New_York'",
		"partner_hourly":       "(date_trunc('hour', occurred_at AT TIME ZONE 'Asia/Kolkata') + interval '1 hour') AT TIME ZONE 'Asia/Kolkata'",
	}
	if len(rep.Aggregates) != 4 {
		t.Fatalf("%d aggregates reported, want 4", len(rep.Aggregates))
	}
	for _, a := range rep.Aggregates {
		pastEnd := fmt.Sprintf("extract(epoch FROM loaded_at - %s)::float8", ends[a.Name])
		check(a.Name, pastEnd, a.PastEnd)
		inRange := fmt.Sprintf("FROM partner.sales WHERE occurred_at >= '%s' AND occurred_at < '%s' AND loaded_at IS NOT NULL",
			since.Format(time.RFC3339), until.Format(time.RFC3339))
		var beyond, keptByRec, keptBelow, n int64
		err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE %[1]s > $1), count(*) FILTER (WHERE %[1]s <= $2),
			count(*) FILTER (WHERE %[1]s < $2), count(*) %[2]s`, pastEnd, inRange),
			a.Horizon.Seconds(), a.Recommended.Seconds()).Scan(&beyond, &keptByRec, &keptBelow, &n)
		if err != nil {
			t.Fatal(err)
		}
		if a.Beyond != beyond {
			t.Errorf("%s: %d beyond the horizon, SQL says %d", a.Name, a.Beyond, beyond)
		}
		if beyond == 0 {
			t.Errorf("%s: the workload should have events beyond a %s horizon", a.Name, a.Horizon)
		}
		if float64(keptByRec) < target*float64(n) {
			t.Errorf("%s: recommended horizon %s keeps %d of %d events, under %v", a.Name, a.Recommended, keptByRec, n, target)
		}
		if a.Recommended > 0 && float64(keptBelow) >= target*float64(n) {
			t.Errorf("%s: a horizon just under the recommended %s would keep %d of %d: it is not the smallest", a.Name, a.Recommended, keptBelow, n)
		}
		if want := 1 - float64(beyond)/float64(n); math.Abs(a.Kept-want) > 1e-12 {
			t.Errorf("%s: kept %v, want %v", a.Name, a.Kept, want)
		}
	}
}

// TestMeasureSamples checks that MaxRows bounds the rows read: a table
// estimated larger is sampled, and the sample still describes it.
func TestMeasureSamples(t *testing.T) {
	pool, cfg := setup(t)
	ctx := context.Background()
	since, until := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 11, 0, 0, 0, 0, time.UTC)
	lateSales(t, pool, 50000, since, until)
	if _, err := pool.Exec(ctx, "ANALYZE partner.sales"); err != nil {
		t.Fatal(err)
	}
	full, err := lateness.Measure(ctx, pool, cfg, "partner", lateness.Options{Since: since, Until: until})
	if err != nil {
		t.Fatal(err)
	}
	sample, err := lateness.Measure(ctx, pool, cfg, "partner", lateness.Options{Since: since, Until: until, MaxRows: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if full.SamplePercent != 100 || sample.SamplePercent > 25 {
		t.Fatalf("sample percent %v (full) and %v (sampled), want 100 and about 20", full.SamplePercent, sample.SamplePercent)
	}
	if sample.Delay.Events > 20000 || sample.Delay.Events < 2000 {
		t.Errorf("the sample measured %d events of %d, want about 10000", sample.Delay.Events, full.Delay.Events)
	}
	// Every scan of a measurement reads the same sample, and so does the
	// next measurement of an unchanged table.
	for _, a := range sample.Aggregates {
		if a.PastEnd.Events != sample.Delay.Events {
			t.Errorf("%s measured %d sampled events, the source %d", a.Name, a.PastEnd.Events, sample.Delay.Events)
		}
	}
	again, err := lateness.Measure(ctx, pool, cfg, "partner", lateness.Options{Since: since, Until: until, MaxRows: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if again.Delay.Events != sample.Delay.Events || again.Delay.Max != sample.Delay.Max {
		t.Errorf("two samples differ: %d events (max %v), then %d (max %v)", sample.Delay.Events, sample.Delay.Max, again.Delay.Events, again.Delay.Max)
	}
	// Rows outside the window do not count towards the sample's size: a
	// window of a tenth of the rows is measured whole.
	tenth, err := lateness.Measure(ctx, pool, cfg, "partner", lateness.Options{Since: since, Until: since.Add(until.Sub(since) / 10), MaxRows: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if tenth.SamplePercent != 100 {
		t.Errorf("a window of about 5000 rows was sampled at %v%%", tenth.SamplePercent)
	}
	p50, _ := full.Delay.Quantile(0.5)
	s50, _ := sample.Delay.Quantile(0.5)
	if s50 < p50/2 || s50 > p50*2 {
		t.Errorf("sampled median %s, full median %s", s50, p50)
	}
}

// TestCurveIsTheCompletenessEstimate runs the reconciler over a week of
// late sales and checks that the arrival curve, read at the age of each
// partition that is not final, gives the completeness the reconciler
// stored for it.
func TestCurveIsTheCompletenessEstimate(t *testing.T) {
	pool, cfg := setup(t)
	ctx := context.Background()
	since, until := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 10, 6, 0, 0, 0, time.UTC)
	lateSales(t, pool, 5000, since, until)
	// Rows "loaded" after now would not be visible yet.
	now := time.Date(2026, 10, 10, 6, 0, 0, 0, time.UTC)
	if _, err := pool.Exec(ctx, "DELETE FROM partner.sales WHERE loaded_at > $1", now); err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(cfg, pool, reconcile.Options{Now: clock.New(now).Now})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := rec.RunOnce(ctx, "partner_daily", true); err != nil {
			t.Fatal(err)
		}
	}
	curve, err := lateness.Curve(ctx, pool, "partner_daily", lateness.HistoryPartitions("day"))
	if err != nil {
		t.Fatal(err)
	}
	if curve.Partitions < 5 || len(curve.Points) < 5 {
		t.Fatalf("curve over %d partitions with %d points", curve.Partitions, len(curve.Points))
	}
	if last := curve.Points[len(curve.Points)-1]; math.Abs(last.Share-1) > 1e-9 {
		t.Errorf("curve ends at %v, want 1", last.Share)
	}
	rows, err := pool.Query(ctx, `SELECT partition_key, extract(epoch FROM $1::timestamptz - partition_end)::float8, completeness
		FROM tidemark.partitions WHERE aggregate = 'partner_daily' AND state NOT IN ('final', 'archived')`, now)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	checked := 0
	for rows.Next() {
		var key string
		var age float64
		var stored *float64
		if err := rows.Scan(&key, &age, &stored); err != nil {
			t.Fatal(err)
		}
		if stored == nil {
			t.Errorf("partition %s has no completeness estimate", key)
			continue
		}
		if got := curve.At(age); math.Abs(got-*stored) > 1e-9 {
			t.Errorf("partition %s: curve at %.0fs gives %v, the reconciler stored %v", key, age, got, *stored)
		}
		checked++
	}
	if checked < 2 {
		t.Errorf("checked %d open or closed partitions, want at least 2", checked)
	}
}
