package reconcile_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// sale is one generated event and when it was first ingested.
type sale struct {
	id         string
	at         time.Time
	amount     int
	ingestedAt time.Time
}

var errCrash = errors.New("simulated crash between claim and rebuild")

// TestReconcileMatchesModel is acceptance item 4, a property test: random
// streams of events (out of order, late, beyond the horizon, duplicated
// across Kafka partitions) are ingested through Kafka in steps, with
// reconcile runs in between, some of which crash between claim and
// rebuild. After a final run, every partition of the aggregate must equal
// what the policy defines, computed independently from the generated
// events.
func TestReconcileMatchesModel(t *testing.T) {
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue && f.DefValue == "100" {
		checks := "30"
		if testing.Short() {
			checks = "6"
		}
		if err := flag.Set("rapid.checks", checks); err != nil {
			t.Fatal(err)
		}
	}
	rapid.Check(t, func(rt *rapid.T) { checkAgainstModel(t, rt) })
}

func checkAgainstModel(t *testing.T, rt *rapid.T) {
	ctx := context.Background()
	zone := rapid.SampledFrom([]string{"UTC", "America/New_York", "Asia/Kolkata"}).Draw(rt, "zone")
	by := rapid.SampledFrom([]string{"day", "hour"}).Draw(rt, "by")
	policy := rapid.SampledFrom([]string{"correction", "arrival", "rebuild"}).Draw(rt, "policy")
	horizon := rapid.SampledFrom([]time.Duration{6 * time.Hour, 24 * time.Hour, 72 * time.Hour}).Draw(rt, "horizon")

	dsn := pgtest.NewDatabase(t)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		rt.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		rt.Fatal(err)
	}
	defer pool.Close()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "app-events"), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		rt.Fatal(err)
	}
	defer kc.Close()
	cfg, err := config.Parse("property.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
kafka: {brokers: [%q], group: prop, session_timeout: 1s}
ingest: {batch_max_age: 5ms}
sources:
  app_events:
    kafka: {topics: [app-events]}
    event_id: /event_id
    event_time: /event_time
    max_age: 365d
aggregates:
  sales:
    source: app_events
    table: sales
    partition: {by: %s, column: k, time_zone: %q}
    lateness_horizon: %s
    beyond_horizon: %s
    sql: SELECT {{partition}} AS k, sum((payload->>'amount')::int) AS total, count(*) AS n FROM {{events}} GROUP BY 1
`, dsn, kc.ListenAddrs()[0], by, zone, horizon, policy)), func(string) (string, bool) { return "", false })
	if err != nil {
		rt.Fatal(err)
	}

	now := time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)
	clk := clock.New(now)
	in, err := kafka.New(kafka.ConfigFrom(cfg), kafka.Options{Now: clk.Now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		rt.Fatal(err)
	}
	ictx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(ictx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			rt.Errorf("ingester: %v", err)
		}
	}()
	crash := false
	r, err := reconcile.New(cfg, pool, reconcile.Options{Now: clk.Now, AfterClaim: func(string) error {
		if crash {
			crash = false
			return errCrash
		}
		return nil
	}})
	if err != nil {
		rt.Fatal(err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		rt.Fatal(err)
	}
	defer prod.Close()

	var sales []*sale
	end := map[int32]int64{}
	steps := rapid.IntRange(3, 10).Draw(rt, "steps")
	for i := 0; i < steps; i++ {
		switch rapid.IntRange(0, 2).Draw(rt, "action") {
		case 0: // ingest a few events
			now = now.Add(time.Duration(rapid.IntRange(0, 8*60).Draw(rt, "advance_minutes")) * time.Minute)
			clk.Set(now)
			var recs []*kgo.Record
			for k := rapid.IntRange(1, 6).Draw(rt, "events"); k > 0; k-- {
				var s *sale
				if len(sales) > 0 && rapid.IntRange(0, 3).Draw(rt, "duplicate") == 0 {
					s = sales[rapid.IntRange(0, len(sales)-1).Draw(rt, "of")]
				} else {
					late := time.Duration(rapid.IntRange(0, 5*24*60).Draw(rt, "late_minutes")) * time.Minute
					s = &sale{id: fmt.Sprintf("s%d", len(sales)), at: now.Add(-late), amount: rapid.IntRange(1, 100).Draw(rt, "amount")}
					sales = append(sales, s)
				}
				if s.ingestedAt.IsZero() {
					s.ingestedAt = now
				}
				recs = append(recs, &kgo.Record{Topic: "app-events", Partition: int32(rapid.IntRange(0, 1).Draw(rt, "partition")),
					Value: []byte(fmt.Sprintf(`{"event_id":%q,"event_time":%q,"amount":%d}`, s.id, s.at.Format(time.RFC3339), s.amount))})
			}
			res := prod.ProduceSync(ctx, recs...)
			if err := res.FirstErr(); err != nil {
				rt.Fatal(err)
			}
			for _, rec := range res {
				end[rec.Record.Partition] = max(end[rec.Record.Partition], rec.Record.Offset+1)
			}
			if err := waitStored(ctx, pool, end); err != nil {
				rt.Fatal(err)
			}
		case 1: // a reconcile run
			if _, err := r.RunOnce(ctx, "sales", true); err != nil {
				rt.Fatal(err)
			}
		case 2: // a run that crashes after its claim committed
			crash = true
			if _, err := r.RunOnce(ctx, "sales", true); !errors.Is(err, errCrash) {
				rt.Fatalf("crashing run: %v", err)
			}
		}
	}
	now = now.Add(time.Minute)
	clk.Set(now)
	if err := finalRun(ctx, r, pool); err != nil {
		rt.Fatal(err)
	}

	// The model: each distinct event once, in its own partition if it
	// arrived within the horizon, otherwise as the policy says.
	cal := aggregate.Calendar{By: by, Loc: cfg.Aggregates["sales"].Partition.Location()}
	type cell struct{ total, n int }
	want := map[int64]cell{}
	for _, s := range sales {
		p := cal.Of(s.at)
		if !s.ingestedAt.After(p.End.Add(horizon)) || policy == "rebuild" {
			c := want[p.Key().Unix()]
			want[p.Key().Unix()] = cell{c.total + s.amount, c.n + 1}
			continue
		}
		if policy == "arrival" {
			a := cal.Of(s.ingestedAt)
			c := want[a.Key().Unix()]
			want[a.Key().Unix()] = cell{c.total + s.amount, c.n + 1}
		}
	}
	rows, err := pool.Query(ctx, "SELECT extract(epoch FROM k)::bigint, total, n FROM sales")
	if err != nil {
		rt.Fatal(err)
	}
	got := map[int64]cell{}
	for rows.Next() {
		var k int64
		var c cell
		if err := rows.Scan(&k, &c.total, &c.n); err != nil {
			rt.Fatal(err)
		}
		got[k] = c
	}
	rows.Close()
	for k, w := range want {
		if got[k] != w {
			rt.Errorf("partition %s: got %+v, want %+v", time.Unix(k, 0).UTC().Format(time.RFC3339), got[k], w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			rt.Errorf("partition %s: got %+v, want no row", time.Unix(k, 0).UTC().Format(time.RFC3339), g)
		}
	}
	var queued int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM tidemark.pending_partitions").Scan(&queued); err != nil || queued != 0 {
		rt.Errorf("%d partitions still queued after the final run (%v)", queued, err)
	}
}

// finalRun runs the reconciler until its load watermark has passed every
// load in the ledger. A run's upper bound is its snapshot's xmin, which
// any transaction holding an xid anywhere on the server at that moment
// (autovacuum analyzing the catalogs of a database just created, say)
// holds back: the loads above it are the next run's, by design.
func finalRun(ctx context.Context, r *reconcile.Reconciler, pool *pgxpool.Pool) error {
	var behind int
	var err error
	if waitfor.Poll(time.Minute, func() bool {
		if _, err = r.RunOnce(ctx, "sales", true); err != nil {
			return true
		}
		err = pool.QueryRow(ctx, `SELECT count(*) FROM tidemark.ingest_ledger l, tidemark.load_watermarks w
			WHERE w.aggregate = 'sales' AND l.source = w.source AND l.load_xid >= w.load_xid`).Scan(&behind)
		return err != nil || behind == 0
	}) != nil {
		return fmt.Errorf("after a minute of runs, %d ledger rows are still above the load watermark", behind)
	}
	return err
}

// waitStored waits until the warehouse has stored offsets reaching end.
func waitStored(ctx context.Context, pool *pgxpool.Pool, end map[int32]int64) error {
	stored := map[int32]int64{}
	var err error
	if waitfor.Poll(time.Minute, func() bool {
		clear(stored)
		var rows pgx.Rows
		if rows, err = pool.Query(ctx, "SELECT partition, next_offset FROM tidemark.kafka_offsets WHERE topic = 'app-events'"); err != nil {
			return true
		}
		var p int32
		var o int64
		if _, err = pgx.ForEachRow(rows, []any{&p, &o}, func() error { stored[p] = o; return nil }); err != nil {
			return true
		}
		for p, e := range end {
			if stored[p] < e {
				return false
			}
		}
		return true
	}) != nil {
		return fmt.Errorf("offsets %v did not reach %v", stored, end)
	}
	return err
}
