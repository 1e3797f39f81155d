package reconcile_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/retention"
)

// process is a reconciler and a pruner of one configuration, as one
// tidemark process runs them, on the bundle's warehouse and clock.
type process struct {
	b   *bundle
	cfg *config.Config
	r   *reconcile.Reconciler
	reg *prometheus.Registry
	p   *retention.Pruner
}

// process starts the reconciler and pruner of cfg (as configured, with
// raw rows kept rawDays days).
func (b *bundle) process(cfg *config.Config, rawDays int) *process {
	b.t.Helper()
	cfg.Sources["app_events"].Retention.Raw = config.Duration(time.Duration(rawDays) * 24 * time.Hour)
	in := &process{b: b, cfg: cfg, reg: prometheus.NewRegistry()}
	var err error
	in.r, err = reconcile.New(cfg, b.pool, reconcile.Options{Now: b.clock.Now, Registerer: in.reg, Logger: testLogger(b.t)})
	if err != nil {
		b.t.Fatal(err)
	}
	in.p, err = retention.New(cfg, b.pool, retention.Options{Now: b.clock.Now, Registerer: prometheus.NewRegistry(), Logger: testLogger(b.t)})
	if err != nil {
		b.t.Fatal(err)
	}
	return in
}

// exec runs a statement on the warehouse.
func (b *bundle) exec(sql string, args ...any) {
	b.t.Helper()
	if _, err := b.pool.Exec(context.Background(), sql, args...); err != nil {
		b.t.Fatal(err)
	}
}

// run reconciles every aggregate of the instance once.
func (in *process) run() {
	in.b.t.Helper()
	for _, name := range in.r.Aggregates() {
		in.b.runOnce(in.r, name)
	}
}

// prune prunes once and returns the report.
func (in *process) prune() *retention.Report {
	in.b.t.Helper()
	return in.b.prune(in.p, false)
}

// counted is what the instance's reconciler counted as recorded in
// tidemark.corrections for aggregate.
func (in *process) counted(aggregate string) float64 {
	in.b.t.Helper()
	n, err := promreg.SumWhere(in.reg, "tidemark_reconcile_beyond_horizon_events_total", "aggregate", aggregate)
	if err != nil {
		in.b.t.Fatal(err)
	}
	return n
}

// salesOf is an aggregate over app_events with its own table, listing the
// event ids it counts, so that a test can tell where each event went.
func salesOf(name, horizon, policy string) aggregateYAML {
	return aggregateYAML{name: name, table: name, by: "day", column: "day", zone: "UTC", horizon: horizon, policy: policy,
		sql: "SELECT {{partition}} AS day, string_agg(payload->>'event_id', ',' ORDER BY payload->>'event_id') AS ids FROM {{events}} GROUP BY 1"}
}

// TestHorizonRaisedAfterPrune: retention dropped 1 October under a
// one-hour horizon; the horizon is then raised to 72 hours. An event for
// 1 October that arrives inside the new horizon cannot be rebuilt into its
// archived partition: it is recorded in tidemark.corrections, marked a
// possible duplicate, and counted. (It used to be in no place at all: the
// records kept only events later than the horizon.)
func TestHorizonRaisedAfterPrune(t *testing.T) {
	b := setup(t, 1, salesOf("sales", "1h", "correction"))
	b.startIngest()
	x := b.process(b.cfg, 1)
	b.ingestAt("2026-10-01 12:00", event(0, "a", "2026-10-01T10:00:00Z", "1"))
	x.run()
	b.clock.Set(at("2026-10-03 00:00"))
	x.run()
	if raw := table(x.prune(), "raw.app_events"); raw.Partitions == 0 {
		t.Fatalf("nothing pruned: %+v", raw)
	}

	x = b.process(b.configure(salesOf("sales", "72h", "correction")), 1)
	b.ingestAt("2026-10-03 06:00", event(0, "b", "2026-10-01T11:00:00Z", "1"))
	rep := b.runOnce(x.r, "sales")
	if rep.Recorded != 1 || len(rep.Rebuilt) != 0 {
		t.Errorf("run: %+v, want b recorded and nothing rebuilt", rep)
	}
	pgtest.Equal(t, "corrections", b.rows("SELECT event_key, possible_duplicate FROM tidemark.corrections"),
		[]string{"b|2026-10-01 11:00:00+00 | true"})
	if n := x.counted("sales"); n != 1 {
		t.Errorf("counted %v, want 1", n)
	}
	pgtest.Equal(t, "sales", b.rows("SELECT day::text, ids FROM sales ORDER BY 1"), []string{"2026-10-01 | a"})
}

// TestAggregateRemovedAndReturned: of two aggregates, the one with the
// 72-hour horizon is removed from the configuration. Retention keeps what
// it needs all the same (its definition is registered in the warehouse),
// so when it returns it rebuilds 1 October with the event that arrived
// while it was gone; later retention archives both aggregates' partitions,
// and status and verify agree on it.
func TestAggregateRemovedAndReturned(t *testing.T) {
	short, long := salesOf("short", "1h", "correction"), salesOf("long", "72h", "correction")
	b := setup(t, 1, short, long)
	b.startIngest()
	both := b.process(b.cfg, 1)
	b.ingestAt("2026-10-01 12:00", event(0, "a", "2026-10-01T10:00:00Z", "1"))
	both.run()

	// long is removed. On the 3rd, 1 October is final for short only.
	b.clock.Set(at("2026-10-03 00:00"))
	alone := b.process(b.configure(short), 1)
	alone.run()
	rep := alone.prune()
	if raw := table(rep, "raw.app_events"); raw.Partitions != 0 ||
		!strings.Contains(rep.Sources[0].Kept, "is kept: aggregate long (not in this configuration: add it back, or remove its state with tidemark forget --aggregate long)") {
		t.Errorf("dropped %+v, kept %q; want everything kept for long", raw, rep.Sources[0].Kept)
	}
	b.ingestAt("2026-10-03 06:00", event(0, "b", "2026-10-01T11:00:00Z", "1"))
	alone.run()

	// long returns.
	b.clock.Set(at("2026-10-04 00:00"))
	both = b.process(b.configure(short, long), 1)
	both.run()
	pgtest.Equal(t, "long", b.rows("SELECT day::text, ids FROM long ORDER BY 1"), []string{"2026-10-01 | a,b"})
	pgtest.Equal(t, "short", b.rows("SELECT day::text, ids FROM short ORDER BY 1"), []string{"2026-10-01 | a"})
	pgtest.Equal(t, "corrections", b.rows("SELECT aggregate, event_key FROM tidemark.corrections"),
		[]string{"short | b|2026-10-01 11:00:00+00"})

	// Once final for long too, the partition goes, and both aggregates'
	// partitions are archived, as verify sees them.
	b.clock.Set(at("2026-10-06 00:00"))
	both.run()
	both.prune()
	pgtest.Equal(t, "states", b.rows("SELECT aggregate, partition_key, state FROM tidemark.partitions ORDER BY 1, 2"),
		[]string{"long | 2026-10-01 | archived", "short | 2026-10-01 | archived"})
	for _, name := range []string{"short", "long"} {
		d, err := both.r.Definition(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		checks, err := backfill.Verify(context.Background(), b.pool, d, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(checks) != 1 || !checks[0].Archived {
			t.Errorf("verify %s: %+v, want 1 October archived", name, checks)
		}
	}
}

// TestPrepareArchivesBeforeTheBound: a partition before its source's
// retention bound that a drop left unarchived (an older version archived
// only the pruning configuration's aggregates) is archived when its
// aggregate is prepared, so that status and verify agree on it.
func TestPrepareArchivesBeforeTheBound(t *testing.T) {
	b := setup(t, 1, salesOf("sales", "1h", "correction"))
	b.startIngest()
	x := b.process(b.cfg, 1)
	b.ingestAt("2026-10-01 12:00", event(0, "a", "2026-10-01T10:00:00Z", "1"))
	x.run()
	b.clock.Set(at("2026-10-03 00:00"))
	x.run()
	x.prune()
	b.exec("UPDATE tidemark.partitions SET state = 'final', archived_at = NULL")
	x = b.process(b.cfg, 1)
	x.run()
	pgtest.Equal(t, "state", b.rows("SELECT partition_key, state FROM tidemark.partitions"), []string{"2026-10-01 | archived"})
}

// TestShorterHorizonElsewhere: two instances run one aggregate with
// different horizons (a change rolled out to one of them). The longer
// one's claim reads an event a day late and queues its partition; the
// shorter one rebuilds the queue beside it, leaving the event out, and
// records it in tidemark.corrections, counted, rather than losing it.
func TestShorterHorizonElsewhere(t *testing.T) {
	b := setup(t, 1, salesOf("sales", "72h", "correction"))
	b.startIngest()
	x := b.process(b.cfg, 10)
	y := b.process(b.configure(salesOf("sales", "1h", "correction")), 10)
	b.ingestAt("2026-10-01 12:00", event(0, "a", "2026-10-01T10:00:00Z", "1"))
	x.run()

	// b arrives a day late: inside x's horizon, beyond y's. x claims it
	// and queues 1 October; y rebuilds the queue beside it.
	b.ingestAt("2026-10-03 00:00", event(0, "b", "2026-10-01T11:00:00Z", "1"))
	ctx := context.Background()
	claim, err := reconcile.New(x.cfg, b.pool, reconcile.Options{Now: b.clock.Now, AfterClaim: func(string) error { return errCrash }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := claim.RunOnce(ctx, "sales", true); err == nil {
		t.Fatal("the claim did not stop after claiming")
	}
	rep, err := y.r.Help(ctx, "sales")
	if err != nil || strings.Join(rep.Rebuilt, ",") != "2026-10-01" || rep.Recorded != 1 {
		t.Fatalf("y's rebuild: %v %+v", err, rep)
	}
	pgtest.Equal(t, "sales", b.rows("SELECT day::text, ids FROM sales ORDER BY 1"), []string{"2026-10-01 | a"})
	pgtest.Equal(t, "corrections", b.rows("SELECT event_key, possible_duplicate FROM tidemark.corrections"),
		[]string{"b|2026-10-01 11:00:00+00 | false"})
	if n := y.counted("sales"); n != 1 {
		t.Errorf("y counted %v, want 1", n)
	}
}

// TestEveryEventCounted is a property test of where events end up under
// retention and changes of configuration: random orders of late events
// (producer retries among them), reconcile runs (some stopping after
// their claim), prunes, a raised or shortened horizon, the removal and
// return of an aggregate, and a second instance that runs the older
// configuration (reconciling, rebuilding beside the first, pruning).
// After a final run of the current configuration, every event is in
// each aggregate's partition of its date or recorded in
// tidemark.corrections for it, and the records are exactly what the
// reconcilers counted.
func TestEveryEventCounted(t *testing.T) {
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue && f.DefValue == "100" {
		checks := "20"
		if testing.Short() {
			checks = "4"
		}
		if err := flag.Set("rapid.checks", checks); err != nil {
			t.Fatal(err)
		}
	}
	rapid.Check(t, func(rt *rapid.T) { checkEveryEventCounted(t, rt) })
}

type produced struct {
	id string
	at time.Time
}

func checkEveryEventCounted(t *testing.T, rt *rapid.T) {
	ctx := context.Background()
	short := salesOf("short", "1h", "correction")
	long := func(h string) aggregateYAML { return salesOf("long", h, "correction") }
	horizon := rapid.SampledFrom([]string{"1h", "72h"}).Draw(rt, "horizon")
	b := setup(t, 1, short, long(horizon))
	b.clock.Set(at("2026-10-01 00:00"))
	b.startIngest()

	// The other instance runs the configuration from before: long with
	// a one-hour horizon, or no long at all.
	older := []aggregateYAML{short}
	olderHasLong := rapid.Bool().Draw(rt, "older_has_long")
	if olderHasLong {
		older = append(older, long("1h"))
	}
	var regs []*prometheus.Registry
	start := func(aggs ...aggregateYAML) *process {
		p := b.process(b.configure(aggs...), 1)
		regs = append(regs, p.reg)
		return p
	}
	present := true
	current := func() []aggregateYAML {
		if present {
			return []aggregateYAML{short, long(horizon)}
		}
		return []aggregateYAML{short}
	}
	x, y := start(current()...), start(older...)
	// stopper is x's reconciler stopping after its claim, as a crash does.
	stopper := func() *reconcile.Reconciler {
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		r, err := reconcile.New(x.cfg, b.pool, reconcile.Options{Now: b.clock.Now, Registerer: reg, AfterClaim: func(string) error { return errCrash }})
		if err != nil {
			rt.Fatal(err)
		}
		return r
	}
	x.run() // both aggregates are registered from the start

	var events []produced
	now := b.clock.Now()
	for i, steps := 0, rapid.IntRange(16, 40).Draw(rt, "steps"); i < steps; i++ {
		switch rapid.IntRange(0, 9).Draw(rt, "action") {
		case 0, 1: // events arrive, late and out of order, some retried
			now = now.Add(time.Duration(rapid.IntRange(0, 20).Draw(rt, "advance_hours")) * time.Hour)
			b.clock.Set(now)
			var recs []*kgo.Record
			for k := rapid.IntRange(1, 4).Draw(rt, "events"); k > 0; k-- {
				var e produced
				if len(events) > 0 && rapid.IntRange(0, 3).Draw(rt, "retry") == 0 {
					e = events[rapid.IntRange(0, len(events)-1).Draw(rt, "of")]
				} else {
					late := time.Duration(rapid.IntRange(0, 4*48).Draw(rt, "late_half_hours")) * 30 * time.Minute
					e = produced{id: fmt.Sprintf("e%d", len(events)), at: now.Add(-late)}
					events = append(events, e)
				}
				recs = append(recs, event(0, e.id, e.at.Format(time.RFC3339), "1"))
			}
			res := b.producer.ProduceSync(ctx, recs...)
			if err := res.FirstErr(); err != nil {
				rt.Fatal(err)
			}
			for _, r := range res {
				b.end[r.Record.Partition] = max(b.end[r.Record.Partition], r.Record.Offset+1)
			}
			if err := waitStored(ctx, b.pool, b.end); err != nil {
				rt.Fatal(err)
			}
		case 2:
			x.run()
		case 3, 4: // x stops after its claim; y rebuilds the queue beside it
			if !present {
				break
			}
			if _, err := stopper().RunOnce(ctx, "long", true); !errors.Is(err, errCrash) {
				rt.Fatalf("stopping run: %v", err)
			}
			if olderHasLong {
				if _, err := y.r.Help(ctx, "long"); err != nil {
					rt.Fatal(err)
				}
			}
		case 5:
			y.run()
		case 6:
			x.prune()
		case 7:
			y.prune()
		case 8: // the horizon of long changes
			horizon = map[string]string{"1h": "72h", "72h": "1h"}[horizon]
			x = start(current()...)
		case 9: // long is removed from x's configuration, or returns
			present = !present
			x = start(current()...)
		}
	}

	// The current configuration, with long, runs last.
	present = true
	now = now.Add(time.Minute)
	b.clock.Set(now)
	x = start(current()...)
	for _, name := range []string{"short", "long"} {
		if err := runUntilRead(ctx, x.r, b.pool, name); err != nil {
			rt.Fatal(err)
		}
	}

	recorded := map[string]bool{}
	for _, r := range b.rows("SELECT aggregate || ' ' || split_part(event_key, '|', 1) FROM tidemark.corrections") {
		recorded[r] = true
	}
	for _, name := range []string{"short", "long"} {
		counted := map[string]bool{}
		for _, r := range b.rows(fmt.Sprintf("SELECT day::text, ids FROM %s", name)) {
			day, ids, _ := strings.Cut(r, " | ")
			for _, id := range strings.Split(ids, ",") {
				counted[day+" "+id] = true
			}
		}
		for _, e := range events {
			if !counted[e.at.UTC().Format(time.DateOnly)+" "+e.id] && !recorded[name+" "+e.id] {
				rt.Errorf("%s: event %s of %s is neither counted nor recorded", name, e.id, e.at.Format(time.RFC3339))
			}
		}
		var sum float64
		for _, reg := range regs {
			n, err := promreg.SumWhere(reg, "tidemark_reconcile_beyond_horizon_events_total", "aggregate", name)
			if err != nil {
				rt.Fatal(err)
			}
			sum += n
		}
		rows := b.rows("SELECT count(*) FROM tidemark.corrections WHERE aggregate = $1", name)
		if fmt.Sprint(sum) != rows[0] {
			rt.Errorf("%s: %s events recorded, %v counted", name, rows[0], sum)
		}
	}
}

// runUntilRead runs the reconciler of aggregate name until its load
// watermark has passed every load of the ledger and nothing is queued.
func runUntilRead(ctx context.Context, r *reconcile.Reconciler, pool *pgxpool.Pool, name string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := r.RunOnce(ctx, name, true); err != nil {
			return err
		}
		var behind int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM tidemark.ingest_ledger l, tidemark.load_watermarks w
			WHERE w.aggregate = $1 AND l.source = w.source AND l.load_xid >= w.load_xid)
			+ (SELECT count(*) FROM tidemark.pending_partitions WHERE aggregate = $1 AND attempts = 0)`, name).Scan(&behind); err != nil {
			return err
		}
		if behind == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after a minute of runs, %s still has %d ledger rows to read or partitions queued", name, behind)
		}
	}
}
