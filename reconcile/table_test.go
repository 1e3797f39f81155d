package reconcile_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// TestTimestampMode reconciles an aggregate over a raw table that another
// tool writes, in timestamp mode: the worked example's lookback case. A
// row stamped 10:10 becomes visible after the watermark has reached 10:15;
// without a lookback it is missed, with a 30-minute lookback it is read.
// The watermark is the newest ingestion time read, never now(), and rows
// newer than now() - safety_lag wait.
func TestTimestampMode(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA partner;
		CREATE TABLE partner.sales (id bigint PRIMARY KEY, occurred_at timestamptz NOT NULL, loaded_at timestamptz NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	clk := clock.New(at("2026-10-05 11:00"))
	reconciler := func(lookback string) *reconcile.Reconciler {
		t.Helper()
		cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
sources:
  partner:
    table: {name: partner.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at, lookback: %s, safety_lag: 1h}
aggregates:
  partner_daily:
    source: partner
    table: partner_daily
    partition: {by: day, column: day}
    lateness_horizon: 72h
    sql: SELECT {{partition}} AS day, sum(amount) AS total, count(*) AS n FROM {{events}} GROUP BY 1
`, dsn, lookback)), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		r, err := reconcile.New(cfg, pool, reconcile.Options{Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	insert := func(id int, occurred, loaded string, amount int) {
		t.Helper()
		if _, err := pool.Exec(ctx, "INSERT INTO partner.sales VALUES ($1, $2, $3, $4)", id, at(occurred), at(loaded), amount); err != nil {
			t.Fatal(err)
		}
	}
	b := &bundle{t: t, pool: pool}
	daily := "SELECT day::text, total, n FROM partner_daily ORDER BY 1"
	r := reconciler("0s")

	insert(1, "2026-10-05 09:00", "2026-10-05 09:00", 1)
	insert(2, "2026-10-05 09:30", "2026-10-05 09:30", 2)
	rep := b.runOnce(r, "partner_daily")
	pgtest.Equal(t, "watermark after two rows", []string{rep.Watermark}, []string{"2026-10-05T09:30:00Z"})
	insert(3, "2026-10-05 10:15", "2026-10-05 10:15", 4)
	b.runOnce(r, "partner_daily")
	// Stamped 10:10, visible only now: behind the watermark.
	insert(4, "2026-10-05 10:10", "2026-10-05 10:10", 8)
	rep = b.runOnce(r, "partner_daily")
	pgtest.Equal(t, "rebuilt without lookback", rep.Rebuilt, nil)
	pgtest.Equal(t, "without lookback", b.rows(daily), []string{"2026-10-05 | 7 | 3"})

	r = reconciler("30m")
	rep = b.runOnce(r, "partner_daily")
	pgtest.Equal(t, "rebuilt with lookback", rep.Rebuilt, []string{"2026-10-05"})
	pgtest.Equal(t, "with a 30-minute lookback", b.rows(daily), []string{"2026-10-05 | 15 | 4"})
	pgtest.Equal(t, "watermark", []string{rep.Watermark}, []string{"2026-10-05T10:15:00Z"})

	// A row stamped now by the warehouse clock is inside the safety lag.
	if _, err := pool.Exec(ctx, "INSERT INTO partner.sales VALUES (5, '2026-10-05 10:30+00', now(), 16)"); err != nil {
		t.Fatal(err)
	}
	rep = b.runOnce(r, "partner_daily")
	pgtest.Equal(t, "watermark with a row inside the safety lag", []string{rep.Watermark}, []string{"2026-10-05T10:15:00Z"})
	pgtest.Equal(t, "row inside the safety lag", b.rows(daily), []string{"2026-10-05 | 15 | 4"})

	// Beyond the horizon: recorded as a correction, keyed by the key columns.
	insert(6, "2026-10-01 12:00", "2026-10-05 10:20", 32)
	b.runOnce(r, "partner_daily")
	pgtest.Equal(t, "corrections", b.rows("SELECT event_key, event->>'amount' FROM tidemark.corrections"), []string{"6 | 32"})
	pgtest.Equal(t, "aggregate after the late row", b.rows(daily), []string{"2026-10-05 | 15 | 4"})
}

// TestCompleteness checks the completeness estimate: two final days each
// received 8 of their 10 events by their end and 2 six hours later, so a
// day one hour past its end is estimated 80% complete. It also checks the
// lateness counts.
func TestCompleteness(t *testing.T) {
	a := dailySales("correction")
	a.horizon = "24h"
	b := setup(t, 1, a)
	b.startIngest()
	r, reg := b.reconciler()
	n := 0
	sales := func(clock, day string, hours ...int) {
		t.Helper()
		var recs []*kgo.Record
		for _, h := range hours {
			n++
			recs = append(recs, event(0, fmt.Sprintf("e%d", n), fmt.Sprintf("%sT%02d:00:00Z", day, h), "1"))
		}
		b.ingestAt(clock, recs...)
		b.runOnce(r, "daily_sales")
	}
	for _, d := range []struct{ day, next string }{{"2026-10-01", "2026-10-02"}, {"2026-10-02", "2026-10-03"}} {
		sales(d.day+" 12:00", d.day, 0, 1, 2, 3, 4, 5, 6, 7)
		sales(d.next+" 06:00", d.day, 20, 21)
	}
	sales("2026-10-03 12:00", "2026-10-03", 0, 1, 2, 3, 4, 5, 6, 7)
	// One hour past the end of 3 October; event time is still at 07:00 on
	// the 3rd (the newest event), so that day is open.
	b.clock.Set(at("2026-10-04 01:00"))
	b.runOnce(r, "daily_sales")
	pgtest.Equal(t, "states and completeness", b.rows("SELECT partition_key, state, round(completeness::numeric, 2)::text FROM tidemark.partitions ORDER BY 1"),
		[]string{"2026-10-01 | final | 1.00", "2026-10-02 | final | 1.00", "2026-10-03 | open | 0.80"})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "tidemark_partition_completeness_ratio" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == "2026-10-03" && m.GetGauge().GetValue() == 0.8 {
					found = true
				}
				if l.GetName() == "partition" && l.GetValue() != "2026-10-03" {
					t.Errorf("completeness exported for final partition %s", l.GetValue())
				}
			}
		}
	}
	if !found {
		t.Error("tidemark_partition_completeness_ratio{partition=\"2026-10-03\"} is not 0.8")
	}
	if got := lateness(t, reg, "on_time"); got != 24 {
		t.Errorf("on-time events %v, want 24", got)
	}
	if got := lateness(t, reg, "under_6h"); got != 4 {
		t.Errorf("events up to 6h late %v, want 4", got)
	}
	// tidemark_partitions counts the open and closed partitions; once
	// event time passes 3 October, that day is closed and the 4th open.
	moving(t, b, map[string]float64{"open": 1, "closed": 0})
	sales("2026-10-04 03:00", "2026-10-04", 2)
	moving(t, b, map[string]float64{"open": 1, "closed": 1})
}

// moving checks tidemark_partitions of daily_sales, as the collector reads
// it from the warehouse, against want and against the table.
func moving(t *testing.T, b *bundle, want map[string]float64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	// A configured aggregate that has not run yet is exported at 0.
	reg.MustRegister(reconcile.NewCollector(b.pool, b.clock.Now, []string{"daily_sales", "not_run_yet"}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got, other := map[string]float64{}, map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tidemark_partitions" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch labels["aggregate"] {
			case "daily_sales":
				got[labels["state"]] = m.GetGauge().GetValue()
			case "not_run_yet":
				other[labels["state"]] = m.GetGauge().GetValue()
			default:
				t.Errorf("tidemark_partitions of an aggregate not asked for: %v", labels)
			}
		}
	}
	if v, ok := other["open"]; !ok || v != 0 || len(other) != 2 {
		t.Errorf("tidemark_partitions of an aggregate that has not run: %v, want open and closed at 0", other)
	}
	for state, n := range want {
		var inTable float64
		if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM tidemark.partitions WHERE aggregate = 'daily_sales' AND state = $1", state).Scan(&inTable); err != nil {
			t.Fatal(err)
		}
		if v, ok := got[state]; !ok || v != n || v != inTable {
			t.Errorf("tidemark_partitions{state=%q} = %v (exported %v), want %v; the table has %v", state, v, ok, n, inTable)
		}
	}
}

func lateness(t *testing.T, reg interface {
	Gather() ([]*dto.MetricFamily, error)
}, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tidemark_reconcile_late_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "lateness" && l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// TestPrepareRefuses checks the configuration problems found against the
// warehouse: a table source's columns, and an aggregate whose source was
// changed after it was built.
func TestPrepareRefuses(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE a (id int, occurred_at timestamptz, loaded_at timestamp);
		CREATE TABLE b (id int, occurred_at timestamptz, loaded_at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	prepare := func(table, key string) error {
		t.Helper()
		cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
sources:
  src:
    table: {name: %s, key: [%s], event_time: occurred_at, ingested_at: loaded_at}
aggregates:
  agg:
    source: src
    table: agg
    partition: {by: day, column: day}
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
`, dsn, table, key)), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		r, err := reconcile.New(cfg, pool, reconcile.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Prepare(ctx)
	}
	for _, tt := range []struct{ table, key, want string }{
		{"missing", "id", "sources.src.table.name: table \"public\".\"missing\" does not exist"},
		{"a", "id", "sources.src.table.ingested_at: \"public\".\"a\".loaded_at is timestamp without time zone"},
		{"b", "nope", "sources.src.table.key[0]: \"public\".\"b\" has no column \"nope\""},
	} {
		if err := prepare(tt.table, tt.key); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("prepare(%s, %s) = %v, want %q", tt.table, tt.key, err, tt.want)
		}
	}
	if err := prepare("b", "id"); err != nil {
		t.Fatalf("a valid table source: %v", err)
	}
	// The aggregate's state says it was built from another source: refused.
	if _, err := pool.Exec(ctx, "UPDATE tidemark.load_watermarks SET source = 'old_src'"); err != nil {
		t.Fatal(err)
	}
	if err := prepare("b", "id"); err == nil || !strings.Contains(err.Error(), "aggregates.agg.source: the aggregate was built from source old_src") {
		t.Errorf("prepare after the source changed = %v", err)
	}
}
