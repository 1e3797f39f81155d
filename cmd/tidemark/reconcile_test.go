package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/status"
)

// TestReconcileOnce loads the worked example with `tidemark run --only
// ingest`, then reconciles with `tidemark reconcile --once` and checks the
// aggregate and `tidemark status`.
func TestReconcileOnce(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 1, "events")
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: [%q], group: reconcile-test, session_timeout: 1s}
ingest: {batch_max_age: 10ms}
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
    sql: |
      SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*) AS event_count
      FROM {{events}} GROUP BY 1
`, dsn, kc.ListenAddrs()[0]))
	now := time.Date(2026, 10, 5, 9, 15, 0, 0, time.UTC)
	old := serviceClock
	serviceClock = func() time.Time { return now }
	t.Cleanup(func() { serviceClock = old })

	kafkatest.Produce(t, kafkatest.Producer(t, kc),
		&kgo.Record{Topic: "events", Value: []byte(`{"event_id":"e1","event_time":"2026-10-04T22:00:00Z","amount":10}`)},
		&kgo.Record{Topic: "events", Value: []byte(`{"event_id":"e2","event_time":"2026-10-05T08:00:00Z","amount":20}`)},
		&kgo.Record{Topic: "events", Value: []byte(`{"event_id":"e3","event_time":"2026-10-04T23:30:00Z","amount":5}`)})
	ingestUntil(t, cfg, pool, "reconcile-test", "events", map[int32]int64{0: 3})

	code, out, errOut := invoke(t, "reconcile", "--once", "-c", cfg)
	if code != exitOK {
		t.Fatalf("reconcile --once: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "queued 2, rebuilt 2 (2026-10-05, 2026-10-04), 0 still queued") {
		t.Errorf("reconcile --once output: %s", out)
	}
	got := ingesttest.Scalar(t, pool, `SELECT count(*) FROM daily_sales WHERE (sale_date, total, event_count) IN
		(('2026-10-04', 15.00, 2), ('2026-10-05', 20.00, 1))`)
	if got != 2 || ingesttest.Scalar(t, pool, "SELECT count(*) FROM daily_sales") != 2 {
		t.Errorf("daily_sales does not hold the worked example's two rows")
	}
	code, out, _ = invoke(t, "reconcile", "--once", "--aggregate", "daily_sales", "-c", cfg)
	if code != exitOK || !strings.Contains(out, "queued 0, rebuilt 0, 0 still queued") {
		t.Errorf("second reconcile --once: exit %d: %s", code, out)
	}

	code, out, errOut = invoke(t, "status", "-c", cfg)
	if code != exitOK {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	compact := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"aggregate daily_sales (source app_events, table daily_sales, day in UTC partitions, horizon 3d, beyond horizon: correction)",
		"queued partitions 0",
		// The 5th is open: event time has not passed its end. The 4th is
		// closed: it has, but its horizon has not.
		"2026-10-05 open 1 - 2026-10-05T09:15:00Z 2026-10-09T00:00:00Z",
		"2026-10-04 closed 1 - 2026-10-05T09:15:00Z 2026-10-08T00:00:00Z"} {
		if !strings.Contains(compact, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = invoke(t, "status", "--json", "-c", cfg)
	var rep status.Report
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Aggregates) != 1 || len(rep.Aggregates[0].Partitions) != 2 {
		t.Errorf("status --json: exit %d: %s", code, out)
	}

	for _, args := range [][]string{{"reconcile", "-c", cfg}, {"reconcile", "--once", "--aggregate", "nope", "-c", cfg}} {
		if code, _, _ := invoke(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
	backfillVerifyRefresh(t, cfg, pool)
}

// ingestUntil runs `tidemark run --only ingest` in-process until the
// group has stored the end offsets of topic, then stops it as SIGTERM
// does and requires exit status 0.
func ingestUntil(t *testing.T, cfg string, pool *pgxpool.Pool, group, topic string, end map[int32]int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"run", "--only", "ingest", "-c", cfg}, &strings.Builder{}, &strings.Builder{})
	}()
	ingesttest.WaitStored(t, pool, group, topic, end, time.Minute)
	cancel()
	if code := <-exit; code != exitOK {
		t.Fatalf("run --only ingest: exit %d", code)
	}
}

// backfillVerifyRefresh drives `tidemark verify`, `backfill` and `refresh`
// over the reconciled worked example.
func backfillVerifyRefresh(t *testing.T, cfg string, pool *pgxpool.Pool) {
	t.Helper()
	expect := func(wantCode int, wants []string, args ...string) {
		t.Helper()
		code, out, errOut := invoke(t, append(args, "-c", cfg)...)
		if code != wantCode {
			t.Errorf("%v: exit %d, want %d\n%s%s", args, code, wantCode, out, errOut)
		}
		compact := strings.Join(strings.Fields(out+errOut), " ")
		for _, want := range wants {
			if !strings.Contains(compact, want) {
				t.Errorf("%v: output lacks %q:\n%s%s", args, want, out, errOut)
			}
		}
	}
	expect(exitOK, []string{"daily_sales: 2 partitions verified, 0 differ"}, "verify", "--aggregate", "daily_sales")
	if _, err := pool.Exec(context.Background(), "UPDATE daily_sales SET total = 0 WHERE sale_date = '2026-10-04'"); err != nil {
		t.Fatal(err)
	}
	expect(exitFailure, []string{"2 partitions verified, 1 differ", "2026-10-04 1 rows missing, 1 rows extra", "--reprocess completed"},
		"verify", "--aggregate", "daily_sales")
	expect(exitOK, []string{"3 chunks, 1 to rebuild (--reprocess missing)", "run 2026-10-03 1 of 1 partitions never built",
		"skip 2026-10-04 built"}, "backfill", "--aggregate", "daily_sales", "--from", "2026-10-03", "--to", "2026-10-05", "--dry-run")
	expect(exitOK, []string{"3 chunks, 3 to rebuild (--reprocess completed)", "3 chunks rebuilt (2 rows), 0 failed, 0 skipped"},
		"backfill", "--aggregate", "daily_sales", "--from", "2026-10-03", "--to", "2026-10-05", "--reprocess", "completed", "--concurrency", "2")
	expect(exitOK, []string{"2 partitions verified, 0 differ"}, "verify", "--aggregate", "daily_sales", "--from", "2026-10-04", "--to", "2026-10-05")
	expect(exitOK, []string{"refresh 2026-10-04 .. 2026-10-05 (UTC), chunks of 2d: 1 chunks, 1 to rebuild", "1 chunks rebuilt (2 rows)"},
		"refresh", "--full", "--aggregate", "daily_sales", "--chunk", "2d")
	expect(exitOK, []string{"last refresh run 2, 2026-10-04T00:00:00Z .. 2026-10-06T00:00:00Z, --reprocess completed: done, 1 of 1 chunks done, 0 failed"},
		"status")
	if _, err := pool.Exec(context.Background(), "UPDATE daily_sales SET total = 1 WHERE sale_date = '2026-10-05'"); err != nil {
		t.Fatal(err)
	}
	expect(exitOK, []string{"shadow 2026-10-04 .. 2026-10-05 (UTC), chunks of 1d: 2 chunks, 2 to rebuild (--reprocess completed)",
		`2 chunks built into "public"."daily_sales__shadow" (2 rows)`,
		"2026-10-05 rows 1 -> 1 (1 only published, 1 only in the shadow); total 1 -> 20.00",
		"1 of 2 partitions differ from what is published; to publish what was compared: tidemark backfill --aggregate daily_sales --from 2026-10-04 --to 2026-10-05 --publish"},
		"backfill", "--aggregate", "daily_sales", "--from", "2026-10-04", "--to", "2026-10-05", "--shadow")
	expect(exitOK, []string{`2 chunks published from "public"."daily_sales__shadow" (2 rows), 0 failed`},
		"backfill", "--aggregate", "daily_sales", "--from", "2026-10-04", "--to", "2026-10-05", "--publish")
	// The printed command run again publishes nothing; its dry run says
	// why, and a range with a day never built is refused whole.
	expect(exitFailure, []string{"every partition of the range was published from its shadow build",
		"run backfill --shadow over the range first"},
		"backfill", "--aggregate", "daily_sales", "--from", "2026-10-04", "--to", "2026-10-05", "--publish")
	expect(exitOK, []string{"skip 2026-10-04 already published: the build of run 3 was published by run 4"},
		"backfill", "--aggregate", "daily_sales", "--from", "2026-10-04", "--to", "2026-10-05", "--publish", "--dry-run")
	expect(exitFailure, []string{"partition 2026-10-03 has no shadow build",
		"tidemark backfill --aggregate daily_sales --from 2026-10-03 --to 2026-10-03 --shadow"},
		"backfill", "--aggregate", "daily_sales", "--from", "2026-10-03", "--to", "2026-10-05", "--publish")
	expect(exitOK, []string{"3 partitions verified, 0 differ"}, "verify", "--aggregate", "daily_sales")
	if got := ingesttest.Scalar(t, pool, "SELECT count(*) FROM tidemark.backfill_runs WHERE status = 'done' AND kind IN ('backfill', 'refresh')"); got != 2 {
		t.Errorf("%d runs recorded as done, want 2", got)
	}
	for _, args := range [][]string{
		{"backfill", "--aggregate", "nope", "--from", "2026-10-01", "--to", "2026-10-02"},
		{"backfill", "--aggregate", "daily_sales", "--from", "2026-10-05", "--to", "2026-10-01"},
		{"backfill", "--aggregate", "daily_sales", "--from", "2026-10-01"},
		{"backfill", "--aggregate", "daily_sales", "--from", "2026-10-01", "--to", "2026-10-02", "--reprocess", "sometimes"},
		{"backfill", "--aggregate", "daily_sales", "--from", "2026-10-01", "--to", "2026-10-02", "--chunk", "0"},
		{"backfill", "--aggregate", "daily_sales", "--from", "2026-10-01", "--to", "2026-10-02", "--concurrency", "0"},
		{"refresh", "--aggregate", "daily_sales"},
		{"verify", "--aggregate", "daily_sales", "--from", "2026-10-01"},
		{"backfill", "--aggregate", "daily_sales", "--from", "2026-10-01", "--to", "2026-10-02", "--shadow", "--publish"},
	} {
		expect(exitUsage, nil, args...)
	}
}
