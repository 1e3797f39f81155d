package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/service"
	"github.com/tidemark-dev/tidemark/status"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var testNow = time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)

type bundle struct {
	srv  *pgserver.Server
	addr string
	reg  *prometheus.Registry
	prod *kgo.Client
	stop func()
}

// start runs the whole service against a private PostgreSQL (so that it
// can be halted) and a kfake cluster, with the HTTP server on a free port.
func start(t *testing.T) *bundle {
	t.Helper()
	return startWith(t, func(*pgserver.Server) {})
}

// startWith is start with a hook that runs just before the service starts.
func startWith(t *testing.T, before func(*pgserver.Server)) *bundle {
	t.Helper()
	srv := pgtest.NewServer(t, pgserver.Options{})
	dsn := pgtest.NewDatabaseOn(t, srv)
	srcDSN := pgtest.NewDatabaseOn(t, srv)
	src := pgtest.Pool(t, srcDSN)
	if _, err := src.Exec(context.Background(), `CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, tier text NOT NULL, updated_at timestamptz NOT NULL);
		INSERT INTO src_customers VALUES (1, 'free', '2026-10-05 09:00+00'), (2, 'pro', '2026-10-05 09:30+00')`); err != nil {
		t.Fatal(err)
	}
	src.Close()
	kc := kafkatest.NewCluster(t, 2, "events")
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "127.0.0.1:0"}
kafka: {brokers: [%q], group: svc-test, session_timeout: 1s}
ingest: {batch_max_age: 10ms}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /id
    event_time: /ts
    watermark: {out_of_orderness: 1m}
  customers:
    poll: {dsn: %q, table: src_customers, key: [customer_id], updated_at: updated_at, every: 1s}
    mirror: {table: dw_customers, key_reconcile_every: 1h}
reconcile: {every: 1s}
aggregates:
  hourly_events:
    source: app_events
    table: hourly_events
    partition: {by: hour, column: hour}
    sql: SELECT {{partition}} AS hour, count(*) AS events FROM {{events}} GROUP BY 1
`, dsn, kc.ListenAddrs()[0], srcDSN)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: srv, reg: prometheus.NewRegistry(), prod: kafkatest.Producer(t, kc)}
	before(srv)
	b.addr, b.stop = runService(t, cfg, service.Options{Registry: b.reg, Now: func() time.Time { return testNow }})
	return b
}

// runService runs service.Run with cfg and opts until stop is called or
// the test ends, and returns the HTTP address once it listens. Run
// failing to start, or returning an error, fails the test.
func runService(t *testing.T, cfg *config.Config, opts service.Options) (addr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan string, 1)
	done := make(chan struct{})
	var runErr error // set once done is closed
	opts.Listening = func(a string) { addrs <- a }
	go func() {
		runErr = service.Run(ctx, cfg, opts)
		close(done)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if runErr != nil {
				t.Errorf("service.Run: %v", runErr)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case addr = <-addrs:
	case <-done:
		once.Do(cancel)
		t.Fatalf("service.Run ended before it listened: %v", runErr)
	case <-time.After(time.Minute):
		t.Fatal("service did not start")
	}
	return addr, stop
}

func (b *bundle) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + b.addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (b *bundle) waitStatus(t *testing.T, cond func(*status.Report) bool) *status.Report {
	t.Helper()
	var code int
	var body string
	var rep status.Report
	if waitfor.Poll(waitfor.Timeout, func() bool {
		if code, body = b.get(t, "/status"); code != http.StatusOK {
			return false
		}
		rep = status.Report{}
		if err := json.Unmarshal([]byte(body), &rep); err != nil {
			t.Fatalf("/status is not JSON: %v\n%s", err, body)
		}
		return cond(&rep)
	}) != nil {
		t.Fatalf("/status never reached the expected state; last: %d %s", code, body)
	}
	return &rep
}

// TestEndpoints checks /healthz, /readyz, /status and /metrics of a running
// service, and /readyz failing while the warehouse is down.
func TestEndpoints(t *testing.T) {
	b := start(t)
	kafkatest.Produce(t, b.prod,
		&kgo.Record{Topic: "events", Value: []byte(`{"id":"a","ts":"2026-10-05T11:00:00Z"}`)},
		&kgo.Record{Topic: "events", Value: []byte(`{"id":"b","ts":"2026-10-05T11:30:00Z"}`)},
		&kgo.Record{Topic: "events", Value: []byte(`{"id":"c"}`)})

	rep := b.waitStatus(t, func(r *status.Report) bool {
		return len(r.Sources) == 2 && r.Sources[0].Records == 3 && len(r.Aggregates) == 1 && len(r.Aggregates[0].Partitions) == 1 &&
			r.Aggregates[0].Partitions[0].Rows != nil && // built, not only queued

			r.Sources[1].Poll != nil && r.Sources[1].Poll.RowsMerged == 2 && r.Sources[1].Poll.LastKeyCheck != nil
	})
	// Key reconciliation ran at start (none was recorded before) and
	// found both rows at the source.
	if k := rep.Sources[1].Poll.LastKeyCheck; k.SourceKeys != 2 || k.MissingAtSource != 0 || k.DryRun {
		t.Errorf("last key reconciliation: %+v", k)
	}
	// The poll source runs inside the service too.
	if p := rep.Sources[1].Poll; p.HighWatermark == nil || !p.HighWatermark.Equal(time.Date(2026, 10, 5, 9, 30, 0, 0, time.UTC)) {
		t.Errorf("poll status: %+v", p)
	}
	// The reconciler runs inside the service: both events fall in 11:00.
	if p := rep.Aggregates[0].Partitions[0]; p.Key != "2026-10-05T11:00Z" || p.Rows == nil || *p.Rows != 1 {
		t.Errorf("status of the aggregate: %+v", rep.Aggregates[0])
	}
	src := rep.Sources[0]
	if src.Rows != 2 || src.DeadLetters != 1 || src.DeadLettersByReason["missing_time"] != 1 {
		t.Errorf("status: rows %d, dead letters %d %v", src.Rows, src.DeadLetters, src.DeadLettersByReason)
	}
	if src.Lag == nil || *src.Lag != 0 {
		t.Errorf("status lag = %v, want 0", src.Lag)
	}
	// Both events landed on one partition or two; either way the group's
	// watermark is at most the newest event minus the out-of-orderness.
	if src.EventTimeWatermark == nil || src.EventTimeWatermark.After(time.Date(2026, 10, 5, 11, 29, 0, 0, time.UTC)) {
		t.Errorf("status watermark = %v", src.EventTimeWatermark)
	}

	if code, body := b.get(t, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	code, body := b.get(t, "/readyz")
	if code != http.StatusOK || !strings.Contains(body, `"warehouse":"ok"`) || !strings.Contains(body, `"kafka":"ok"`) {
		t.Errorf("/readyz = %d %s", code, body)
	}

	code, body = b.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`tidemark_ingest_rows_written_total{source="app_events"} 2`,
		`tidemark_ingest_dead_letters_total{reason="missing_time",source="app_events"} 1`,
		`tidemark_source_event_time_watermark_seconds{source="app_events"}`,
		`tidemark_build_info{version=`,
		`tidemark_reconcile_partitions_rebuilt_total{aggregate="hourly_events"}`,
		`tidemark_reconcile_load_watermark_age_seconds{aggregate="hourly_events"}`,
		`tidemark_warehouse_oldest_transaction_seconds`,
		`tidemark_poll_rows_merged_total{op="insert",source="customers"} 2`,
		`tidemark_poll_watermark_age_seconds{source="customers"}`,
		`tidemark_key_reconcile_runs_total{result="ok",source="customers"} 1`,
		`tidemark_state_table_rows{table="tidemark.ingest_ledger"}`,
		`tidemark_state_table_bytes{table="raw.app_events"}`,
		`tidemark_prune_runs_total{result="ok"}`,
		`go_goroutines`, `process_resident_memory_bytes`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// Acceptance item 7: promlint finds nothing, in the registry or in
	// what /metrics serves.
	problems, err := testutil.GatherAndLint(b.reg)
	if err != nil {
		t.Fatal(err)
	}
	served, err := promlint.New(bytes.NewReader([]byte(body))).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(problems, served...) {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}

	// With the warehouse down, the service is alive but not ready.
	if err := b.srv.Halt(false); err != nil {
		t.Fatal(err)
	}
	code, body = b.get(t, "/readyz")
	if code != http.StatusServiceUnavailable || strings.Contains(body, `"warehouse":"ok"`) {
		t.Errorf("/readyz with the warehouse down = %d %s", code, body)
	}
	if code, _ := b.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with the warehouse down = %d", code)
	}
	// /metrics still serves everything it can: an outage must not hide
	// the series that describe it.
	if code, body := b.get(t, "/metrics"); code != http.StatusOK || !strings.Contains(body, "tidemark_ingest_write_errors_total") {
		t.Errorf("/metrics with the warehouse down = %d, write errors present: %v", code, strings.Contains(body, "tidemark_ingest_write_errors_total"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.srv.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// Ready again once the pool reconnects.
	waitfor.Until(t, "/readyz to recover after the warehouse came back", func() bool {
		code, _ := b.get(t, "/readyz")
		return code == http.StatusOK
	})
	b.stop()
}

// TestRunRefusesUnmigratedSchema: with warehouse.migrate: false, the
// service refuses a warehouse whose schema is behind the binary.
func TestRunRefusesUnmigratedSchema(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q, migrate: false}
http: {listen: "off"}
kafka: {brokers: ["127.0.0.1:1"]}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /id
    event_time: /ts
`, dsn)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = service.Run(ctx, cfg, service.Options{})
	if !errors.Is(err, migrate.ErrBehind) {
		t.Fatalf("Run on an unmigrated warehouse = %v, want migrate.ErrBehind", err)
	}
}

// TestWaitsForTheWarehouse: started while the warehouse is down, the
// service answers /healthz, reports what it waits for on /readyz, and
// migrates and ingests once the warehouse is up.
func TestWaitsForTheWarehouse(t *testing.T) {
	b := startWith(t, func(srv *pgserver.Server) {
		if err := srv.Halt(false); err != nil {
			t.Fatal(err)
		}
	})
	if code, _ := b.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while waiting = %d", code)
	}
	code, body := b.get(t, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"schema":"waiting for the warehouse schema"`) {
		t.Errorf("/readyz while waiting = %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.srv.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	kafkatest.Produce(t, b.prod, &kgo.Record{Topic: "events", Value: []byte(`{"id":"a","ts":"2026-10-05T11:00:00Z"}`)})
	b.waitStatus(t, func(r *status.Report) bool {
		return len(r.Sources) == 2 && r.Sources[0].Rows == 1 && r.Sources[1].Poll != nil && r.Sources[1].Poll.RowsMerged == 2
	})
}
