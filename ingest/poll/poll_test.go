package poll_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

// pollEnv is a source database, a migrated warehouse and a poll source
// reading public.src_customers into public.dw_customers.
type pollEnv struct {
	t      *testing.T
	ctx    context.Context
	src    *pgxpool.Pool
	srcDSN string
	wh     *pgxpool.Pool
	whDSN  string
	clock  *clock.Settable
	reg    *prometheus.Registry
}

// customersDDL is the lesson's source table.
const customersDDL = `CREATE TABLE src_customers (
    customer_id bigint PRIMARY KEY,
    email       text NOT NULL,
    tier        text NOT NULL,
    updated_at  timestamptz NOT NULL
)`

func newPollEnv(t *testing.T, sourceDDL string) *pollEnv {
	t.Helper()
	e := &pollEnv{t: t, ctx: context.Background(), clock: clock.New(testNow), reg: prometheus.NewRegistry()}
	e.src, e.srcDSN = pgtest.NewPool(t)
	e.wh, e.whDSN = pgtest.NewPool(t)
	if _, err := migrate.Up(e.ctx, e.whDSN, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	e.srcExec(sourceDDL)
	return e
}

// config returns a configuration with one poll source, customers, whose
// poll block has the given extra keys.
func (e *pollEnv) config(extra string) *config.Config {
	e.t.Helper()
	yaml := fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  customers:
    poll:
      dsn: %q
      table: src_customers
      key: [customer_id]
      updated_at: updated_at
%s
    mirror: {table: dw_customers}
`, e.whDSN, e.srcDSN, indent(extra, "      "))
	cfg, err := config.Parse("t.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		e.t.Fatalf("config: %v\n%s", err, yaml)
	}
	return cfg
}

func indent(s, by string) string {
	if s == "" {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := range lines {
		lines[i] = by + strings.TrimSpace(lines[i])
	}
	return strings.Join(lines, "\n")
}

// pollConfig returns the Config of the poll source name of cfg.
func pollConfig(t testing.TB, cfg *config.Config, name string) poll.Config {
	t.Helper()
	c, err := poll.ConfigFrom(cfg, name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *pollEnv) poller(extra string) *poll.Poller {
	e.t.Helper()
	p, err := poll.New(pollConfig(e.t, e.config(extra), "customers"), e.wh, poll.Options{Now: e.clock.Now, Registerer: e.reg})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return p
}

func (e *pollEnv) srcExec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.src.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("source: %s: %v", sql, err)
	}
}

func (e *pollEnv) run(p *poll.Poller, upper string, lookback *time.Duration) poll.Report {
	e.t.Helper()
	rep, err := p.RunOnce(e.ctx, poll.Window{Upper: ts(upper), Lookback: lookback})
	if err != nil {
		e.t.Fatalf("poll run (upper %s): %v", upper, err)
	}
	return rep
}

// ts parses "2006-01-02 15:04" as UTC; "" is the zero time.
func ts(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse("2006-01-02 15:04", s)
	if err != nil {
		panic(err)
	}
	return t
}

func (e *pollEnv) int(sql string) int64 {
	e.t.Helper()
	var n int64
	if err := e.wh.QueryRow(e.ctx, sql).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// mirrorRows returns the mirror as "id tier HH:MM" lines in key order.
func (e *pollEnv) mirrorRows() []string {
	e.t.Helper()
	rows, err := e.wh.Query(e.ctx, `SELECT customer_id, tier, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')
		FROM dw_customers ORDER BY customer_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var (
			id       int64
			tier, at string
		)
		err := r.Scan(&id, &tier, &at)
		return fmt.Sprintf("%d %s %s", id, tier, at), err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *pollEnv) watermark() string {
	e.t.Helper()
	var s string
	if err := e.wh.QueryRow(e.ctx, `SELECT CASE WHEN high_watermark = '-infinity' THEN '-infinity'
		ELSE to_char(high_watermark AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') END
		FROM tidemark.poll_watermarks WHERE source = 'customers'`).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// TestPollLessonCustomers reproduces the lesson's watermark-driven load:
// the first load and an identical retry, an update and a new customer, and
// a row that becomes visible late, missed without a lookback and loaded
// with a 30-minute one.
func TestPollLessonCustomers(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	p := e.poller("")
	e.srcExec(`INSERT INTO src_customers VALUES
		(1, 'ana@example.com', 'free', '2026-10-05 09:00+00'),
		(2, 'ben@example.com', 'pro',  '2026-10-05 09:30+00')`)

	first := e.run(p, "2026-10-05 10:00", nil)
	retry := e.run(p, "2026-10-05 10:00", nil)
	if first.Merged != 2 || first.Inserted != 2 || retry.Merged != 0 {
		t.Errorf("first run merged %d (inserted %d), the retry %d; want 2, 2, 0", first.Merged, first.Inserted, retry.Merged)
	}
	if n, wm := e.int("SELECT count(*) FROM dw_customers"), e.watermark(); n != 2 || wm != "2026-10-05 09:30:00" {
		t.Errorf("after the load and a retry: %d rows, watermark %s; want 2 rows, 2026-10-05 09:30:00", n, wm)
	}

	e.srcExec(`UPDATE src_customers SET tier = 'pro', updated_at = '2026-10-05 10:15+00' WHERE customer_id = 1`)
	e.srcExec(`INSERT INTO src_customers VALUES (3, 'cy@example.com', 'free', '2026-10-05 10:20+00')`)
	rep := e.run(p, "2026-10-05 11:00", nil)
	if rep.Read != 2 || rep.Inserted != 1 || rep.Updated != 1 {
		t.Errorf("second window: read %d, inserted %d, updated %d; want 2, 1, 1", rep.Read, rep.Inserted, rep.Updated)
	}
	pgtest.Equal(t, "mirror after the update and the new customer", e.mirrorRows(), []string{
		"1 pro 2026-10-05 10:15:00",
		"2 pro 2026-10-05 09:30:00",
		"3 free 2026-10-05 10:20:00",
	})

	// A row stamped 10:10 whose transaction committed after the
	// watermark reached 10:20.
	e.srcExec(`INSERT INTO src_customers VALUES (4, 'dee@example.com', 'free', '2026-10-05 10:10+00')`)
	e.run(p, "2026-10-05 12:00", nil)
	if n := e.int("SELECT count(*) FROM dw_customers WHERE customer_id = 4"); n != 0 {
		t.Errorf("loaded without lookback: %d, want 0 (the lesson's blind spot)", n)
	}
	lookback := 30 * time.Minute
	rep = e.run(p, "2026-10-05 12:00", &lookback)
	if n := e.int("SELECT count(*) FROM dw_customers WHERE customer_id = 4"); n != 1 {
		t.Errorf("loaded with a 30-minute lookback: %d, want 1", n)
	}
	if rep.Read != 3 || rep.Merged != 1 {
		t.Errorf("lookback run read %d rows and merged %d; want 3 re-read (10:10, 10:15, 10:20) and 1 merged", rep.Read, rep.Merged)
	}
	if wm := e.watermark(); wm != "2026-10-05 10:20:00" {
		t.Errorf("watermark %s, want 2026-10-05 10:20:00 (never backwards)", wm)
	}

	// Every change is a raw change row, once, with ledger rows that add up.
	var ops string
	if err := e.wh.QueryRow(e.ctx, `SELECT string_agg(event_id || ':' || op, ' ' ORDER BY event_time, event_id) FROM raw.customers`).Scan(&ops); err != nil {
		t.Fatal(err)
	}
	if want := "1:insert 2:insert 4:insert 1:update 3:insert"; ops != want {
		t.Errorf("raw change rows %q, want %q", ops, want)
	}
	if n := e.int("SELECT coalesce(sum(rows), 0) FROM tidemark.ingest_ledger WHERE source = 'customers'"); n != 5 {
		t.Errorf("ledger rows sum to %d, want 5", n)
	}
	if got := metricValue(t, e.reg, "tidemark_poll_rows_merged_total", "op", "insert"); got != 4 {
		t.Errorf("tidemark_poll_rows_merged_total{op=insert} = %v, want 4", got)
	}
	if n := e.int("SELECT runs FROM tidemark.poll_watermarks WHERE source = 'customers'"); n != 5 {
		t.Errorf("runs = %d, want 5", n)
	}
}

// metricValue returns the value of the series of name whose label has the
// given value (any series when label is "").
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if label == "" || (lp.GetName() == label && lp.GetValue() == value) {
					switch {
					case m.GetCounter() != nil:
						return m.GetCounter().GetValue()
					case m.GetGauge() != nil:
						return m.GetGauge().GetValue()
					}
				}
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}

// TestPollSharedTimestamp loads many rows sharing one updated_at across
// chunk boundaries, with and without a row limit that falls inside them:
// none is skipped, with no lookback to hide a gap.
func TestPollSharedTimestamp(t *testing.T) {
	tests := []struct {
		name      string
		extra     string
		wantRuns  []int64 // rows read per run until nothing is left
		wantMore  []bool
		wantMarks []string
	}{
		{"chunks of 100", "chunk_rows: 100", []int64{262}, []bool{false}, []string{"2026-10-05 10:30:00"}},
		{"limit inside the shared timestamp", "chunk_rows: 100\nmax_rows_per_run: 50",
			[]int64{255, 7}, []bool{true, false}, []string{"2026-10-05 10:00:00", "2026-10-05 10:30:00"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newPollEnv(t, customersDDL)
			// 5 rows before, 250 rows at exactly 10:00, 7 rows after.
			e.srcExec(`INSERT INTO src_customers
				SELECT i, 'c' || i || '@example.com', 'free',
				       CASE WHEN i <= 5 THEN timestamptz '2026-10-05 09:00+00' + i * interval '1 minute'
				            WHEN i <= 255 THEN timestamptz '2026-10-05 10:00+00'
				            ELSE timestamptz '2026-10-05 10:00+00' + (i - 255) * interval '1 minute' + interval '23 minutes' END
				FROM generate_series(1, 262) AS i`)
			p := e.poller(tt.extra)
			for i, want := range tt.wantRuns {
				rep := e.run(p, "2026-10-05 11:00", nil)
				if rep.Read != want || rep.More != tt.wantMore[i] || e.watermark() != tt.wantMarks[i] {
					t.Errorf("run %d: read %d, more %v, watermark %s; want %d, %v, %s", i+1, rep.Read, rep.More, e.watermark(), want, tt.wantMore[i], tt.wantMarks[i])
				}
			}
			if rep := e.run(p, "2026-10-05 11:00", nil); rep.Read != 0 {
				t.Errorf("a final run read %d rows, want 0", rep.Read)
			}
			if n := e.int("SELECT count(*) FROM dw_customers"); n != 262 {
				t.Errorf("mirror holds %d rows, want 262", n)
			}
			if n := e.int("SELECT count(*) FROM raw.customers"); n != 262 {
				t.Errorf("raw holds %d change rows, want 262", n)
			}
		})
	}
}

// TestPollLocalTimestamp: a timestamp without time zone column is refused
// until the zone its writers use is configured, and then compared in it
// (across a daylight-saving change).
func TestPollLocalTimestamp(t *testing.T) {
	e := newPollEnv(t, `CREATE TABLE src_customers (
		customer_id bigint PRIMARY KEY, email text NOT NULL, tier text NOT NULL, updated_at timestamp NOT NULL)`)
	_, err := e.poller("").RunOnce(e.ctx, poll.Window{Upper: ts("2026-11-01 12:00")})
	if !errors.Is(err, poll.ErrSource) || !strings.Contains(err.Error(), "sources.customers.poll.time_zone") {
		t.Fatalf("err = %v, want a refusal naming sources.customers.poll.time_zone", err)
	}
	// New York leaves daylight saving time at 2026-11-01 02:00 local:
	// 01:30 local happens twice; 00:30 EDT is 04:30 UTC, 03:00 EST 08:00 UTC.
	e.srcExec(`INSERT INTO src_customers VALUES
		(1, 'a@example.com', 'free', '2026-11-01 00:30'),
		(2, 'b@example.com', 'free', '2026-11-01 03:00')`)
	p := e.poller("time_zone: America/New_York")
	rep := e.run(p, "2026-11-01 07:00", nil) // 02:00 EST: only row 1
	if rep.Read != 1 || !rep.Watermark.Equal(ts("2026-11-01 04:30")) {
		t.Errorf("first window read %d, watermark %v; want 1 row, 2026-11-01 04:30 UTC", rep.Read, rep.Watermark)
	}
	rep = e.run(p, "2026-11-01 09:00", nil)
	if rep.Read != 1 || !rep.Watermark.Equal(ts("2026-11-01 08:00")) {
		t.Errorf("second window read %d, watermark %v; want 1 row, 2026-11-01 08:00 UTC", rep.Read, rep.Watermark)
	}
	var evt time.Time
	if err := e.wh.QueryRow(e.ctx, "SELECT event_time FROM raw.customers WHERE event_id = '2'").Scan(&evt); err != nil || !evt.Equal(ts("2026-11-01 08:00")) {
		t.Errorf("raw event time %v (%v), want 2026-11-01 08:00 UTC", evt, err)
	}
}

// TestPollSoftDelete: a soft-deleted source row is an ordinary update of
// the mirror, recorded with op delete.
func TestPollSoftDelete(t *testing.T) {
	e := newPollEnv(t, `CREATE TABLE src_customers (
		customer_id bigint PRIMARY KEY, email text NOT NULL, tier text NOT NULL,
		is_deleted boolean NOT NULL DEFAULT false, updated_at timestamptz NOT NULL)`)
	e.srcExec(`INSERT INTO src_customers VALUES (1, 'a@example.com', 'free', false, '2026-10-05 09:00+00'),
		(2, 'b@example.com', 'free', false, '2026-10-05 09:00+00')`)
	p := e.poller("soft_delete: is_deleted")
	e.run(p, "2026-10-05 10:00", nil)
	e.srcExec(`UPDATE src_customers SET is_deleted = true, updated_at = '2026-10-05 10:30+00' WHERE customer_id = 2`)
	rep := e.run(p, "2026-10-05 11:00", nil)
	if rep.Deleted != 1 || rep.Merged != 1 {
		t.Errorf("deleted %d, merged %d; want 1, 1", rep.Deleted, rep.Merged)
	}
	if n := e.int("SELECT count(*) FROM dw_customers WHERE is_deleted"); n != 1 {
		t.Errorf("mirror rows marked deleted: %d, want 1", n)
	}
	if n := e.int("SELECT count(*) FROM raw.customers WHERE op = 'delete' AND event_id = '2'"); n != 1 {
		t.Errorf("delete change rows for key 2: %d, want 1", n)
	}
}

// TestPollOverlappingRuns: two pollers of the same source running at once
// serialise on the watermark row; every change is recorded once.
func TestPollOverlappingRuns(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers SELECT i, 'c' || i || '@example.com', 'free',
		timestamptz '2026-10-05 09:00+00' + i * interval '1 second' FROM generate_series(1, 20000) AS i`)
	a, b := e.poller("chunk_rows: 1000"), e.poller("chunk_rows: 1000")
	var wg sync.WaitGroup
	reps := make([]poll.Report, 2)
	for i, p := range []*poll.Poller{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := p.RunOnce(e.ctx, poll.Window{Upper: ts("2026-10-06 00:00")})
			if err != nil {
				t.Errorf("run %d: %v", i, err)
			}
			reps[i] = rep
		}()
	}
	wg.Wait()
	if got := reps[0].Merged + reps[1].Merged; got != 20000 {
		t.Errorf("merged %d + %d rows, want 20000 in total", reps[0].Merged, reps[1].Merged)
	}
	if reps[0].Read != 0 && reps[1].Read != 0 {
		t.Errorf("both runs read rows (%d and %d): the second should start from the first's watermark", reps[0].Read, reps[1].Read)
	}
	if n := e.int("SELECT count(*) FROM raw.customers"); n != 20000 {
		t.Errorf("raw change rows %d, want 20000", n)
	}
}

// TestPollSetupErrors: problems with the source table are reported with
// the configuration key to fix.
func TestPollSetupErrors(t *testing.T) {
	tests := []struct {
		name, ddl, extra, want string
	}{
		{"missing table", "CREATE TABLE other (id int)", "", "does not exist"},
		{"key not unique", "CREATE TABLE src_customers (customer_id bigint NOT NULL, updated_at timestamptz)", "", "sources.customers.poll.key"},
		{"nullable key", "CREATE TABLE src_customers (customer_id bigint UNIQUE, updated_at timestamptz)", "", "may be NULL"},
		{"no updated_at", "CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, changed timestamptz)", "", "sources.customers.poll.updated_at"},
		{"text updated_at", "CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, updated_at text)", "", "it must be a timestamptz"},
		{"zone on timestamptz", "CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, updated_at timestamptz)", "time_zone: UTC", "remove time_zone"},
		{"column clash", "CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, updated_at timestamptz, deleted_at timestamptz)", "", "sources.customers.mirror.deleted_column"},
		{"soft delete type", "CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, updated_at timestamptz, gone int)", "soft_delete: gone", "sources.customers.poll.soft_delete"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newPollEnv(t, tt.ddl)
			err := e.poller(tt.extra).Prepare(e.ctx)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestPollSchemaChange: a column added at the source appears in the mirror
// at the next start, with its values.
func TestPollSchemaChange(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers VALUES (1, 'a@example.com', 'free', '2026-10-05 09:00+00')`)
	e.run(e.poller(""), "2026-10-05 10:00", nil)
	e.srcExec(`ALTER TABLE src_customers ADD COLUMN country text`)
	e.srcExec(`INSERT INTO src_customers VALUES (2, 'b@example.com', 'free', '2026-10-05 09:30+00', 'NO')`)
	e.run(e.poller(""), "2026-10-05 10:00", nil)
	if n := e.int("SELECT count(*) FROM dw_customers WHERE country = 'NO'"); n != 1 {
		t.Errorf("rows with the new column's value: %d, want 1", n)
	}
}

// TestPollCreatesPartitionsMidRun: a window spanning several months
// creates the raw partitions it needs between chunks of one transaction.
func TestPollCreatesPartitionsMidRun(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers SELECT i, 'c' || i || '@example.com', 'free',
		timestamptz '2026-07-01 00:00+00' + i * interval '2 days' FROM generate_series(1, 60) AS i`)
	rep := e.run(e.poller("chunk_rows: 7"), "2026-12-01 00:00", nil)
	if rep.Read != 60 || rep.Chunks != 9 {
		t.Errorf("read %d rows in %d chunks, want 60 in 9", rep.Read, rep.Chunks)
	}
	if n := e.int("SELECT count(*) FROM pg_inherits WHERE inhparent = 'raw.customers'::regclass"); n != 4 {
		t.Errorf("raw partitions: %d, want 4 (July to October, monthly)", n)
	}
	if n := e.int("SELECT count(*) FROM raw.customers"); n != 60 {
		t.Errorf("raw change rows: %d, want 60", n)
	}
}

// TestPollEdgeCases covers writes the merge must not miss and source
// shapes it must accept; each case runs against a fresh source.
func TestPollEdgeCases(t *testing.T) {
	const base = `INSERT INTO src_customers VALUES (1, 'a@example.com', 'free', '2026-10-05 09:00+00'), (2, 'b@example.com', 'free', '2026-10-05 09:30+00')`
	hour := time.Hour
	tests := []struct {
		name  string
		ddl   string   // source table; customersDDL when empty
		extra string   // poll keys
		steps []string // source statements, each followed by a run with a one-hour lookback
		check string   // warehouse query returning 1 when the outcome is right
	}{
		{"second write with the same updated_at", "", "", []string{base, `UPDATE src_customers SET tier = 'pro' WHERE customer_id = 1`},
			`SELECT count(*) FROM dw_customers WHERE customer_id = 1 AND tier = 'pro'`},
		{"column added while running", "", "", []string{base, `ALTER TABLE src_customers ADD COLUMN country text;
			INSERT INTO src_customers VALUES (3, 'c@example.com', 'free', '2026-10-05 09:45+00', 'NO')`},
			`SELECT count(*) FROM dw_customers WHERE customer_id = 3 AND country = 'NO'`},
		{"column dropped while running keeps the mirror's values", "", "", []string{base, `ALTER TABLE src_customers DROP COLUMN email;
			UPDATE src_customers SET tier = 'pro', updated_at = '2026-10-05 09:50+00' WHERE customer_id = 1`},
			`SELECT count(*) FROM dw_customers WHERE customer_id = 1 AND tier = 'pro' AND email = 'a@example.com'`},
		{"timestamptz with a precision", `CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, email text NOT NULL,
			tier text NOT NULL, updated_at timestamptz(3) NOT NULL)`, "", []string{base},
			`SELECT count(*) / 2 FROM dw_customers`},
		{"sub-millisecond lookback", "", "lookback: 250us\nsafety_lag: 1us", []string{base},
			`SELECT count(*) / 2 FROM dw_customers`},
		{"columns named like the query's aliases", `CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, s text, r text, t text,
			updated_at timestamptz NOT NULL)`, "", []string{`INSERT INTO src_customers VALUES (1, 's', 'r', 't', '2026-10-05 09:00+00')`},
			`SELECT count(*) FROM dw_customers WHERE s = 's' AND r = 'r' AND t = 't'`},
		{"json column and an unchanged re-read", `CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, doc json,
			updated_at timestamptz NOT NULL)`, "", []string{`INSERT INTO src_customers VALUES (1, '{"a": 1}', '2026-10-05 09:00+00')`, ``},
			`SELECT count(*) FROM raw.customers WHERE op = 'insert'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ddl := tt.ddl
			if ddl == "" {
				ddl = customersDDL
			}
			e := newPollEnv(t, ddl)
			p := e.poller(tt.extra)
			for _, sql := range tt.steps {
				if sql != "" {
					e.srcExec(sql)
				}
				e.run(p, "2026-10-05 12:00", &hour)
			}
			if n := e.int(tt.check); n != 1 {
				t.Errorf("%s = %d, want 1", tt.check, n)
			}
		})
	}
}

// TestPollFlaggedRowReturns: a row flagged deleted (by key
// reconciliation) that exists at the source again is unflagged even when
// its updated_at did not change.
func TestPollFlaggedRowReturns(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers VALUES (1, 'a@example.com', 'free', '2026-10-05 09:00+00')`)
	p := e.poller("lookback: 24h")
	e.run(p, "2026-10-05 12:00", nil)
	if _, err := e.wh.Exec(e.ctx, `UPDATE dw_customers SET deleted_at = '2026-10-05 11:00+00'`); err != nil {
		t.Fatal(err)
	}
	e.run(p, "2026-10-05 12:00", nil)
	if n := e.int("SELECT count(*) FROM dw_customers WHERE deleted_at IS NULL"); n != 1 {
		t.Errorf("the row is still flagged deleted")
	}
}

// TestPollDroppedPartition: a raw partition dropped by an operator is
// created again by the next run.
func TestPollDroppedPartition(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers VALUES (1, 'a@example.com', 'free', '2026-10-05 09:00+00')`)
	p := e.poller("")
	e.run(p, "2026-10-05 12:00", nil)
	if _, err := e.wh.Exec(e.ctx, `DROP TABLE raw.customers_p202610`); err != nil {
		t.Fatal(err)
	}
	e.srcExec(`INSERT INTO src_customers VALUES (2, 'b@example.com', 'free', '2026-10-05 10:00+00')`)
	e.run(p, "2026-10-05 12:00", nil)
	if n := e.int("SELECT count(*) FROM raw.customers"); n != 1 {
		t.Errorf("raw change rows after the partition was dropped and recreated: %d, want 1", n)
	}
}

// TestPollSmallPool: runs of several sources on a pool of one connection
// each create raw partitions without waiting for a second pool connection.
func TestPollSmallPool(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers SELECT i, 'c' || i || '@example.com', 'free',
		timestamptz '2026-01-01 00:00+00' + i * interval '1 day' FROM generate_series(1, 200) AS i`)
	pc, err := pgxpool.ParseConfig(e.whDSN)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(e.ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range []string{"one", "two"} {
		yaml := fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  %s:
    poll: {dsn: %q, table: src_customers, key: [customer_id], updated_at: updated_at, chunk_rows: 20}
    mirror: {table: dw_%s}
`, e.whDSN, name, e.srcDSN, name)
		cfg, err := config.Parse("t.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		p, err := poll.New(pollConfig(t, cfg, name), pool, poll.Options{Now: e.clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.RunOnce(ctx, poll.Window{Upper: ts("2027-01-01 00:00")}); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
	}
	wg.Wait()
	if n := e.int("SELECT (SELECT count(*) FROM raw.one) + (SELECT count(*) FROM raw.two)"); n != 400 {
		t.Errorf("raw change rows %d, want 400", n)
	}
}
