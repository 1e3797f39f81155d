package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
	"github.com/tidemark-dev/tidemark/reconcile"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// warehouse is a migrated warehouse with the daily_sales aggregate over
// the raw table of a Kafka source, whose rows the tests write directly.
type warehouse struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	cfg  *config.Config
	raw  *raw.Table
	d    *aggregate.Definition
	now  time.Time
}

const salesSQL = `SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1`

func newWarehouse(t *testing.T, policy string) *warehouse {
	t.Helper()
	ctx := context.Background()
	pool, dsn := pgtest.NewPool(t)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	w := &warehouse{t: t, ctx: ctx, pool: pool, raw: raw.NewTable("app_events", config.PartitionDay),
		now: time.Date(2026, 9, 20, 12, 0, 0, 0, time.UTC)}
	w.cfg, w.d = w.definition(dsn, policy, salesSQL)
	return w
}

// definition configures and prepares daily_sales with policy and sql.
func (w *warehouse) definition(dsn, policy, sql string) (*config.Config, *aggregate.Definition) {
	w.t.Helper()
	return w.aggregate(dsn, "daily_sales", "{by: day, column: sale_date, time_zone: UTC}", policy, sql)
}

// aggregate configures and prepares the aggregate name (its table of the
// same name) with partition (a YAML mapping), policy and sql.
func (w *warehouse) aggregate(dsn, name, partition, policy, sql string) (*config.Config, *aggregate.Definition) {
	w.t.Helper()
	cfg, d, err := w.tryAggregate(dsn, name, partition, policy, sql)
	if err != nil {
		w.t.Fatal(err)
	}
	return cfg, d
}

// tryAggregate is aggregate returning the error of the configuration
// (cfg nil) or of preparing the aggregate. sql may span lines.
func (w *warehouse) tryAggregate(dsn, name, partition, policy, sql string) (*config.Config, *aggregate.Definition, error) {
	w.t.Helper()
	sql = strings.ReplaceAll(sql, "\n", "\n      ")
	yaml := fmt.Sprintf(`
warehouse: {dsn: %[1]q}
http: {listen: "off"}
kafka: {brokers: ["127.0.0.1:1"], group: g}
sources:
  app_events:
    kafka: {topics: [app-events]}
    event_id: /event_id
    event_time: /event_time
aggregates:
  %[2]s:
    source: app_events
    table: %[2]s
    partition: %[3]s
    lateness_horizon: 72h
    beyond_horizon: %[4]s
    sql: |
      %[5]s
`, dsn, name, partition, policy, sql)
	cfg, err := config.Parse("test.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		return nil, nil, err
	}
	r, err := reconcile.New(cfg, w.pool, reconcile.Options{Now: func() time.Time { return w.now }})
	if err != nil {
		w.t.Fatal(err)
	}
	d, err := r.Definition(w.ctx, name)
	return cfg, d, err
}

// sale writes one raw event, as an ingest transaction would (with its
// ledger row), ingested an hour after it happened.
func (w *warehouse) sale(id, eventTime string, amount int) {
	w.t.Helper()
	et, err := time.Parse("2006-01-02 15:04", eventTime)
	if err != nil {
		w.t.Fatal(err)
	}
	conn, err := w.pool.Acquire(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Release()
	if err := w.raw.EnsurePartitions(w.ctx, conn.Conn(), w.raw.Missing([]time.Time{et})); err != nil {
		w.t.Fatal(err)
	}
	err = pgx.BeginFunc(w.ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(w.ctx, `INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
			VALUES ($1, $2, $3, jsonb_build_object('event_id', $1::text, 'amount', $4::int))`, id, et, et.Add(time.Hour), amount); err != nil {
			return err
		}
		_, err := tx.Exec(w.ctx, `INSERT INTO tidemark.ingest_ledger (source, load_xid, bucket, rows, min_event_time, max_event_time, ingested_at)
			VALUES ('app_events', pg_current_xact_id(), date_bin('1 hour', $1::timestamptz, timestamptz '2000-01-01 00:00:00+00'), 1, $1, $1, $2)`,
			et, et.Add(time.Hour))
		return err
	})
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *warehouse) exec(sql string, args ...any) {
	w.t.Helper()
	if _, err := w.pool.Exec(w.ctx, sql, args...); err != nil {
		w.t.Fatal(err)
	}
}

func (w *warehouse) rows(sql string, args ...any) []string {
	w.t.Helper()
	return pgtest.Lines(w.t, w.pool, sql, args...)
}

func (w *warehouse) sales() []string {
	w.t.Helper()
	return w.rows("SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1")
}

func (w *warehouse) backfill(from, to string, opts backfill.Options) (*backfill.Report, error) {
	w.t.Helper()
	opts.Now = func() time.Time { return w.now }
	return backfill.Run(w.ctx, w.pool, w.d, dates(w.t, from, to), opts)
}

func dates(t *testing.T, from, to string) backfill.Range {
	t.Helper()
	f, err := time.Parse("2006-01-02", from)
	if err != nil {
		t.Fatal(err)
	}
	l, err := time.Parse("2006-01-02", to)
	if err != nil {
		t.Fatal(err)
	}
	return backfill.Range{From: f, To: l}
}

func labels(cs []backfill.Chunk, run bool) []string {
	var out []string
	for _, c := range cs {
		if c.Run == run {
			out = append(out, c.Label())
		}
	}
	return out
}

// TestFailedChunkRunsAgainAlone is the lesson's backfill example: four
// days in one-day chunks, the third failing ("source busy"). The run
// records the failure and goes on; the failed day is then run again on its
// own, without touching the others; --reprocess decides what runs; and
// the load watermark never moves.
func TestFailedChunkRunsAgainAlone(t *testing.T) {
	w := newWarehouse(t, "correction")
	for i, day := range []string{"01", "02", "03", "04"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", 10*(i+1))
	}
	w.exec(`CREATE FUNCTION busy() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.sale_date = '2026-09-03' THEN RAISE EXCEPTION 'source busy'; END IF; RETURN NEW; END $$`)
	w.exec(`CREATE TRIGGER busy BEFORE INSERT ON daily_sales FOR EACH ROW EXECUTE FUNCTION busy()`)
	watermark := w.rows("SELECT load_xid::text, runs FROM tidemark.load_watermarks")

	rep, err := w.backfill("2026-09-01", "2026-09-04", backfill.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Equal(t, "chunks run", labels(rep.Chunks, true), []string{"2026-09-01", "2026-09-02", "2026-09-03", "2026-09-04"})
	if rep.Done != 3 || len(rep.Failed) != 1 || rep.Failed[0].Chunk.Label() != "2026-09-03" || !strings.Contains(rep.Failed[0].Err.Error(), "source busy") {
		t.Fatalf("report: done %d, failed %v", rep.Done, rep.Failed)
	}
	pgtest.Equal(t, "sales after the first run", w.sales(), []string{"2026-09-01 | 10.00 | 1", "2026-09-02 | 20.00 | 1", "2026-09-04 | 40.00 | 1"})
	pgtest.Equal(t, "recorded run", w.rows("SELECT kind, status, chunks, chunks_done, chunks_failed, reprocess, chunk FROM tidemark.backfill_runs"),
		[]string{"backfill | failed | 4 | 3 | 1 | missing | 1d"})
	pgtest.Equal(t, "recorded chunks", w.rows(`SELECT to_char(chunk_start, 'MM-DD'), status, coalesce(rows::text, '-'), coalesce(error, '-') LIKE '%source busy%'
		FROM tidemark.backfill_chunks ORDER BY chunk_start`),
		[]string{"09-01 | done | 1 | false", "09-02 | done | 1 | false", "09-03 | failed | - | true", "09-04 | done | 1 | false"})

	// The cause is fixed; the failed day runs again, alone.
	w.exec(`DROP TRIGGER busy ON daily_sales`)
	w.now = w.now.Add(time.Hour)
	rep, err = w.backfill("2026-09-01", "2026-09-04", backfill.Options{Reprocess: backfill.Failed})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Equal(t, "chunks run again", labels(rep.Chunks, true), []string{"2026-09-03"})
	pgtest.Equal(t, "sales after the retry", w.sales(), []string{"2026-09-01 | 10.00 | 1", "2026-09-02 | 20.00 | 1", "2026-09-03 | 30.00 | 1", "2026-09-04 | 40.00 | 1"})
	pgtest.Equal(t, "rebuilds per partition", w.rows("SELECT partition_key, rebuilds FROM tidemark.partitions ORDER BY 1"),
		[]string{"2026-09-01 | 1", "2026-09-02 | 1", "2026-09-03 | 1", "2026-09-04 | 1"})

	// Nothing is missing or failed any more; completed runs everything.
	for _, tc := range []struct {
		reprocess backfill.Reprocess
		run       []string
	}{
		{backfill.Missing, nil},
		{backfill.Failed, nil},
		{backfill.Completed, []string{"2026-09-01", "2026-09-02", "2026-09-03", "2026-09-04"}},
	} {
		plan, err := backfill.Plan(w.ctx, w.pool, w.d, dates(t, "2026-09-01", "2026-09-04"), 24*time.Hour, tc.reprocess)
		if err != nil {
			t.Fatal(err)
		}
		pgtest.Equal(t, "plan with --reprocess "+string(tc.reprocess), labels(plan, true), tc.run)
	}
	// A new day in the range is missing.
	w.sale("s05", "2026-09-05 10:00", 50)
	plan, err := backfill.Plan(w.ctx, w.pool, w.d, dates(t, "2026-09-01", "2026-09-07"), 48*time.Hour, backfill.Missing)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Equal(t, "missing in two-day chunks", labels(plan, true), []string{"2026-09-05 .. 2026-09-06", "2026-09-07"})
	pgtest.Equal(t, "load watermark", w.rows("SELECT load_xid::text, runs FROM tidemark.load_watermarks"), watermark)
}

// TestInterruptedRunResumes: a run whose context ends leaves the chunk in
// flight and those not started pending, is recorded as interrupted, and
// --reprocess failed finishes it.
func TestInterruptedRunResumes(t *testing.T) {
	w := newWarehouse(t, "correction")
	for _, day := range []string{"01", "02", "03", "04"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", 1)
	}
	w.exec(`CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.sale_date = '2026-09-02' THEN PERFORM pg_sleep(30); END IF; RETURN NEW; END $$`)
	w.exec(`CREATE TRIGGER slow BEFORE INSERT ON daily_sales FOR EACH ROW EXECUTE FUNCTION slow()`)
	ctx, cancel := context.WithCancel(w.ctx)
	go func() {
		// Cancel once the second chunk sleeps in its trigger.
		_ = waitfor.Poll(waitfor.Timeout, func() bool {
			var n int
			_ = w.pool.QueryRow(w.ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()").Scan(&n)
			return n > 0 || ctx.Err() != nil
		})
		cancel()
	}()
	_, err := backfill.Run(ctx, w.pool, w.d, dates(t, "2026-09-01", "2026-09-04"), backfill.Options{Now: func() time.Time { return w.now }})
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v", err)
	}
	pgtest.Equal(t, "interrupted run", w.rows("SELECT status, chunks_done FROM tidemark.backfill_runs"), []string{"interrupted | 1"})
	pgtest.Equal(t, "chunks", w.rows("SELECT to_char(chunk_start, 'MM-DD'), status FROM tidemark.backfill_chunks ORDER BY 1"),
		[]string{"09-01 | done", "09-02 | pending", "09-03 | pending", "09-04 | pending"})
	w.exec(`DROP TRIGGER slow ON daily_sales`)
	// A run that died (the process killed) stays running until the next
	// run of the aggregate closes it.
	w.exec(`UPDATE tidemark.backfill_runs SET status = 'running', finished_at = NULL`)
	w.exec(`UPDATE tidemark.backfill_chunks SET status = 'running' WHERE chunk_start = '2026-09-02'`)
	rep, err := w.backfill("2026-09-01", "2026-09-04", backfill.Options{Reprocess: backfill.Failed, Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Equal(t, "resumed", labels(rep.Chunks, true), []string{"2026-09-02", "2026-09-03", "2026-09-04"})
	pgtest.Equal(t, "runs", w.rows("SELECT status, chunks_done FROM tidemark.backfill_runs ORDER BY id"), []string{"interrupted | 1", "done | 3"})
	pgtest.Equal(t, "the dead run's chunks", w.rows("SELECT to_char(chunk_start, 'MM-DD'), status FROM tidemark.backfill_chunks WHERE run_id = 1 ORDER BY 1"),
		[]string{"09-01 | done", "09-02 | pending", "09-03 | pending", "09-04 | pending"})
	if len(w.sales()) != 4 {
		t.Errorf("sales %v, want four days", w.sales())
	}
}

// TestOneBackfillAtATime: a second backfill of the aggregate is refused
// while one runs.
func TestOneBackfillAtATime(t *testing.T) {
	w := newWarehouse(t, "correction")
	conn, err := w.pool.Acquire(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(w.ctx, `SELECT pg_advisory_lock(hashtextextended('tidemark.backfill.daily_sales', 0))`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(w.ctx, `SELECT pg_advisory_unlock_all()`) }()
	if _, err := w.backfill("2026-09-01", "2026-09-02", backfill.Options{}); !errors.Is(err, backfill.ErrBusy) {
		t.Fatalf("second backfill: %v, want ErrBusy", err)
	}
}

// TestRefreshEqualsIncremental: the reconciler's incremental runs and a
// full refresh from nothing publish the same rows, for every policy
// (late events inside and beyond the horizon included), and verify finds
// no drift in either.
func TestRefreshEqualsIncremental(t *testing.T) {
	for _, policy := range []string{"correction", "arrival", "rebuild"} {
		t.Run(policy, func(t *testing.T) {
			w := newWarehouse(t, policy)
			r, err := reconcile.New(w.cfg, w.pool, reconcile.Options{Now: func() time.Time { return w.now }})
			if err != nil {
				t.Fatal(err)
			}
			load := func(id, eventTime string, amount int, ingested string) {
				t.Helper()
				w.sale(id, eventTime, amount)
				ia, _ := time.Parse("2006-01-02 15:04", ingested)
				w.exec("UPDATE raw.app_events SET ingested_at = $2 WHERE event_id = $1", id, ia)
				w.exec("UPDATE tidemark.ingest_ledger SET ingested_at = $1 WHERE id = (SELECT max(id) FROM tidemark.ingest_ledger)", ia)
				w.now = ia
				if _, err := r.RunOnce(w.ctx, "daily_sales", true); err != nil {
					t.Fatal(err)
				}
			}
			load("a", "2026-09-01 10:00", 1, "2026-09-01 11:00")
			load("b", "2026-09-02 10:00", 2, "2026-09-02 11:00")
			load("c", "2026-09-01 20:00", 4, "2026-09-03 09:00")  // late, inside the horizon
			load("d", "2026-09-05 10:00", 8, "2026-09-05 11:00")  // a day with no sales in between
			load("e", "2026-09-02 05:00", 16, "2026-09-09 12:00") // beyond the horizon
			incremental := w.sales()
			if len(incremental) == 0 {
				t.Fatal("nothing published")
			}
			checks, err := backfill.Verify(w.ctx, w.pool, w.d, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range checks {
				if c.Drifted() {
					t.Errorf("incremental: %s drifted: %+v", c.Partition, c)
				}
			}

			w.exec("TRUNCATE daily_sales")
			w.exec("DELETE FROM tidemark.partitions")
			rng, ok, err := backfill.FullRange(w.ctx, w.pool, w.d)
			if err != nil || !ok {
				t.Fatalf("full range: %v %v", ok, err)
			}
			rep, err := backfill.Run(w.ctx, w.pool, w.d, rng, backfill.Options{Kind: "refresh", Reprocess: backfill.Completed, Concurrency: 2,
				Now: func() time.Time { return w.now }})
			if err != nil || len(rep.Failed) > 0 {
				t.Fatalf("refresh: %v %v", err, rep)
			}
			pgtest.Equal(t, "refreshed", w.sales(), incremental)
		})
	}
}

// TestVerifyFindsDrift: verify reports a changed row and a load not yet
// rebuilt, partition by partition, and nothing once a backfill with
// --reprocess completed has run.
func TestVerifyFindsDrift(t *testing.T) {
	w := newWarehouse(t, "correction")
	// A column the query does not fill, with a default.
	w.exec("ALTER TABLE daily_sales ADD COLUMN loaded_at timestamptz NOT NULL DEFAULT now()")
	for i, day := range []string{"01", "02", "03"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", i+1)
	}
	if _, err := w.backfill("2026-09-01", "2026-09-03", backfill.Options{}); err != nil {
		t.Fatal(err)
	}
	w.exec("UPDATE daily_sales SET total = total + 1 WHERE sale_date = '2026-09-02'")
	w.sale("late", "2026-09-03 11:00", 5)
	w.exec(`INSERT INTO tidemark.pending_partitions (aggregate, partition_start, partition_end, reason, queued_at)
		VALUES ('daily_sales', '2026-09-03', '2026-09-04', 'late', now())`)
	rng := dates(t, "2026-09-01", "2026-09-04")
	checks, err := backfill.Verify(w.ctx, w.pool, w.d, &rng)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range checks {
		got = append(got, fmt.Sprintf("%s missing %d extra %d queued %v", c.Partition, c.Missing, c.Extra, c.Queued))
	}
	pgtest.Equal(t, "checks", got, []string{
		"2026-09-01 missing 0 extra 0 queued false",
		"2026-09-02 missing 1 extra 1 queued false",
		"2026-09-03 missing 1 extra 1 queued true",
		"2026-09-04 missing 0 extra 0 queued false",
	})
	if _, err := w.backfill("2026-09-01", "2026-09-04", backfill.Options{Reprocess: backfill.Completed}); err != nil {
		t.Fatal(err)
	}
	checks, err = backfill.Verify(w.ctx, w.pool, w.d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(checks) != 4 {
		t.Errorf("verified %d built partitions, want 4", len(checks))
	}
	for _, c := range checks {
		if c.Drifted() {
			t.Errorf("after the backfill %s drifted: %+v", c.Partition, c)
		}
	}
}

// TestShadowComparesBeforePublishing: after a change of the aggregate's
// SQL, a shadow run builds the range into daily_sales__shadow and reports
// each partition against what is published (rows and totals), while the
// published table, the partitions' status and what later backfills
// consider built stay as they were.
func TestShadowComparesBeforePublishing(t *testing.T) {
	w := newWarehouse(t, "correction")
	for i, day := range []string{"01", "02", "03"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", i+1)
	}
	if _, err := w.backfill("2026-09-01", "2026-09-03", backfill.Options{}); err != nil {
		t.Fatal(err)
	}
	published := w.sales()
	status := w.rows("SELECT partition_key, rebuilds, rebuilt_at FROM tidemark.partitions ORDER BY 1")

	// The new logic adds a fee on 2 September.
	_, fixed := w.definition(w.cfg.Warehouse.DSN, "correction",
		`SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) + CASE WHEN {{partition}} = DATE '2026-09-02' THEN 10 ELSE 0 END AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1`)
	rep, err := backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-04"), backfill.Options{Shadow: true, Concurrency: 3, Now: func() time.Time { return w.now }})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range rep.Shadow {
		line := fmt.Sprintf("%s rows %d -> %d, %d only published, %d only shadow", c.Partition, c.Published, c.Fresh, c.Extra, c.Missing)
		for _, tot := range c.Totals {
			line += fmt.Sprintf(", %s %s -> %s", tot.Column, tot.Published, tot.Fresh)
		}
		got = append(got, line)
	}
	pgtest.Equal(t, "shadow against published", got, []string{
		"2026-09-01 rows 1 -> 1, 0 only published, 0 only shadow, total 1.00 -> 1.00, event_count 1 -> 1",
		"2026-09-02 rows 1 -> 1, 1 only published, 1 only shadow, total 2.00 -> 12.00, event_count 1 -> 1",
		"2026-09-03 rows 1 -> 1, 0 only published, 0 only shadow, total 3.00 -> 3.00, event_count 1 -> 1",
		"2026-09-04 rows 0 -> 0, 0 only published, 0 only shadow, total - -> -, event_count - -> -",
	})
	pgtest.Equal(t, "shadow table", w.rows("SELECT sale_date::text, total::text FROM daily_sales__shadow ORDER BY 1"),
		[]string{"2026-09-01 | 1.00", "2026-09-02 | 12.00", "2026-09-03 | 3.00"})
	pgtest.Equal(t, "published", w.sales(), published)
	pgtest.Equal(t, "partition status", w.rows("SELECT partition_key, rebuilds, rebuilt_at FROM tidemark.partitions ORDER BY 1"), status)
	pgtest.Equal(t, "recorded run", w.rows("SELECT kind, status, reprocess, chunks_done FROM tidemark.backfill_runs ORDER BY id DESC LIMIT 1"),
		[]string{"shadow | done | completed | 4"})
	// 4 September was only built in the shadow: still never built.
	plan, err := backfill.Plan(w.ctx, w.pool, w.d, dates(t, "2026-09-01", "2026-09-04"), 24*time.Hour, backfill.Failed)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Equal(t, "missing after the shadow run", labels(plan, true), []string{"2026-09-04"})
}

// longName is a table name of the 63 bytes PostgreSQL keeps, the first 50
// of them shared by every tail.
func longName(tail byte) string {
	return "daily_sales_" + strings.Repeat("x", 38) + strings.Repeat(string(tail), 13)
}

// TestPrepareLongTableNames: Prepare creates the table and the index of
// aggregates whose table names have the longest length allowed and share
// their first 50 bytes; each index has its own name, not its table's.
func TestPrepareLongTableNames(t *testing.T) {
	w := newWarehouse(t, "correction")
	tables := []string{longName('a'), longName('b')}
	for _, name := range tables {
		w.aggregate(w.cfg.Warehouse.DSN, name, "{by: day, column: sale_date, time_zone: UTC}", "correction", salesSQL)
	}
	got := w.rows(`SELECT c.relname, i.relname, pg_get_indexdef(i.oid) LIKE '%(sale_date)'
		FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid
		WHERE c.relname = ANY ($1) ORDER BY 1`, tables)
	if len(got) != len(tables) {
		t.Fatalf("indexes %v, want one on each of %v", got, tables)
	}
	seen := map[string]bool{}
	for _, line := range got {
		f := strings.Split(line, " | ")
		if f[1] == f[0] || f[2] != "true" || seen[f[1]] {
			t.Errorf("index %s of %s: on sale_date %s, or a name already seen", f[1], f[0], f[2])
		}
		seen[f[1]] = true
	}
}

// TestShadowOfLongTableName: a shadow run of an aggregate whose table name
// has the longest length allowed builds into a table of its own and leaves
// the published table as it was. The table exists before the aggregate is
// prepared, as one created by its owner does.
func TestShadowOfLongTableName(t *testing.T) {
	w := newWarehouse(t, "correction")
	for i, day := range []string{"01", "02"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", i+1)
	}
	name := longName('a')
	w.exec(fmt.Sprintf("CREATE TABLE %s (sale_date date NOT NULL, total numeric(12,2), event_count int)", name))
	_, d := w.aggregate(w.cfg.Warehouse.DSN, name, "{by: day, column: sale_date, time_zone: UTC}", "correction", salesSQL)
	if _, err := backfill.Run(w.ctx, w.pool, d, dates(t, "2026-09-01", "2026-09-02"), backfill.Options{Now: func() time.Time { return w.now }}); err != nil {
		t.Fatal(err)
	}
	published := func() []string {
		t.Helper()
		return w.rows(fmt.Sprintf("SELECT sale_date::text, total::text, event_count FROM %s ORDER BY 1", d.Target.Sanitize()))
	}
	pgtest.Equal(t, "published", published(), []string{"2026-09-01 | 1.00 | 1", "2026-09-02 | 2.00 | 1"})

	_, fixed := w.aggregate(w.cfg.Warehouse.DSN, name, "{by: day, column: sale_date, time_zone: UTC}", "correction",
		`SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) + 10 AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1`)
	rep, err := backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-02"), backfill.Options{Shadow: true, Now: func() time.Time { return w.now }})
	if err != nil || len(rep.Failed) > 0 {
		t.Fatalf("shadow run: %v %v", err, rep)
	}
	pgtest.Equal(t, "published after the shadow run", published(), []string{"2026-09-01 | 1.00 | 1", "2026-09-02 | 2.00 | 1"})
	pgtest.Equal(t, "shadow table", w.rows(fmt.Sprintf("SELECT sale_date::text, total::text FROM %s ORDER BY 1", fixed.ShadowName().Sanitize())),
		[]string{"2026-09-01 | 11.00", "2026-09-02 | 12.00"})
	for _, c := range rep.Shadow {
		if !c.Differs() {
			t.Errorf("%s: the shadow equals the published partition: %+v", c.Partition, c.Comparison)
		}
	}
}

// TestHourlyAcrossDST: hourly partitions in New York on the day the clocks
// go back (25 hours, 01:00 twice) are backfilled in chunks of six hours:
// each of the two 01:00 hours gets its own row, and the chunks hold whole
// hours of real time.
func TestHourlyAcrossDST(t *testing.T) {
	w := newWarehouse(t, "rebuild")
	_, d := w.aggregate(w.cfg.Warehouse.DSN, "hourly_sales", "{by: hour, column: sale_hour, time_zone: America/New_York}", "rebuild",
		`SELECT {{partition}} AS sale_hour, count(*)::int AS sales FROM {{events}} GROUP BY 1`)
	// 05:30 and 06:30 UTC are 01:30 EDT and 01:30 EST.
	for _, at := range []string{"2026-11-01 04:30", "2026-11-01 05:30", "2026-11-01 05:45", "2026-11-01 06:30", "2026-11-02 04:59"} {
		w.sale("e"+at, at, 1)
	}
	rep, err := backfill.Run(w.ctx, w.pool, d, dates(t, "2026-11-01", "2026-11-01"), backfill.Options{Chunk: 6 * time.Hour, Concurrency: 2,
		Now: func() time.Time { return w.now }})
	if err != nil || len(rep.Failed) > 0 {
		t.Fatalf("backfill: %v %v", err, rep)
	}
	var sizes []string
	for _, c := range rep.Chunks {
		sizes = append(sizes, fmt.Sprintf("%s %d", c.Start.UTC().Format("15:04"), len(c.Partitions)))
	}
	pgtest.Equal(t, "chunks (start in UTC, hours)", sizes, []string{"04:00 6", "10:00 6", "16:00 6", "22:00 6", "04:00 1"})
	pgtest.Equal(t, "hourly sales", w.rows(`SELECT to_char(sale_hour AT TIME ZONE 'UTC', 'MM-DD HH24:MI'), sales FROM hourly_sales ORDER BY 1`),
		[]string{"11-01 04:00 | 1", "11-01 05:00 | 2", "11-01 06:00 | 1", "11-02 04:00 | 1"})
	if n := w.rows("SELECT count(*) FROM tidemark.partitions WHERE aggregate = 'hourly_sales'"); n[0] != "25" {
		t.Errorf("%s partitions built, want the day's 25 hours", n[0])
	}
}
