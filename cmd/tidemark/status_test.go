package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/status"
)

// TestRunAndStatus runs `tidemark run` in-process until it has loaded a
// few records, then checks `tidemark status` in both formats, and that
// cancelling run (as SIGTERM does) exits 0.
func TestRunAndStatus(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 2, "events")
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: [%q], group: status-test, session_timeout: 1s}
ingest: {batch_max_age: 10ms}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /id
    event_time: /ts
    max_age: 36500d
    max_future_skew: 36500d
`, dsn, kc.ListenAddrs()[0]))
	prod := kafkatest.Producer(t, kc, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	kafkatest.Produce(t, prod,
		&kgo.Record{Topic: "events", Partition: 0, Value: []byte(`{"id":"a","ts":"2026-10-05T10:00:00Z"}`)},
		&kgo.Record{Topic: "events", Partition: 0, Value: []byte(`{"id":"a","ts":"2026-10-05T10:00:00Z"}`)},
		&kgo.Record{Topic: "events", Partition: 1, Value: []byte(`{"id":"b","ts":"2026-10-05T11:00:00Z"}`)},
		&kgo.Record{Topic: "events", Partition: 1, Value: []byte(`not json`)})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	var runErr bytes.Buffer
	go func() { exit <- run(ctx, []string{"run", "-c", cfg}, &bytes.Buffer{}, &runErr) }()
	ingesttest.WaitStored(t, pool, "status-test", "events", map[int32]int64{0: 2, 1: 2}, time.Minute)

	code, out, errOut := invoke(t, "status", "-c", cfg)
	if code != exitOK {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"source app_events (kafka: events)", "rows                  2", "duplicates dropped    1",
		"dead letters          1 (invalid_json 1)", "events/0", "events/1", "lag                   0"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = invoke(t, "status", "--json", "-c", cfg)
	if code != exitOK {
		t.Fatalf("status --json: exit %d: %s", code, errOut)
	}
	var rep status.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	if len(rep.Sources) != 1 || rep.Sources[0].Rows != 2 || len(rep.Sources[0].Partitions) != 2 ||
		*rep.Sources[0].Partitions[1].StoredOffset != 2 || rep.Sources[0].EventTimeWatermark == nil {
		t.Errorf("status --json = %s", out)
	}

	cancel()
	select {
	case code := <-exit:
		if code != exitOK {
			t.Errorf("run after cancellation: exit %d\n%s", code, runErr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("run did not stop within a minute")
	}
}

// TestStatusShowsNoQueryText: the oldest transaction that status reports
// (what holds the load watermarks back) names its process, state, age
// and application, never its statement, which may hold a password.
func TestStatusShowsNoQueryText(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
sources:
  partner:
    table: {name: partner_sales, key: [id], event_time: occurred_at, ingested_at: loaded_at}
aggregates:
  daily:
    source: partner
    table: daily
    partition: {by: day, column: day}
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
`, dsn))
	if code, _, errOut := invoke(t, "migrate", "-c", cfg); code != exitOK {
		t.Fatalf("migrate: %s", errOut)
	}
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var pid int32
	const secret = "ALTER ROLE app PASSWORD 'hunter2'"
	if _, err := tx.Exec(ctx, "SET LOCAL application_name = 'nightly-job'"); err != nil {
		t.Fatal(err)
	}
	var xid string
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid(), pg_current_xact_id()::text").Scan(&pid, &xid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT '"+strings.ReplaceAll(secret, "'", "''")+"'"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"status", "--json", "-c", cfg}, {"status", "-c", cfg}} {
		code, out, errOut := invoke(t, args...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		if strings.Contains(out, "hunter2") {
			t.Errorf("%v shows another session's statement:\n%s", args, out)
		}
		for _, want := range []string{fmt.Sprint(pid), "nightly-job"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v does not name the transaction's %s:\n%s", args, want, out)
			}
		}
	}
}
