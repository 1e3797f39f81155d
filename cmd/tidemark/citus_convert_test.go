package main

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/docsql"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestCitusConvertWarehouse runs the conversion that docs/citus.md gives
// for a warehouse whose raw tables were created on the coordinator: a
// warehouse loaded with warehouse.distribute false, tidemark stopped, the
// page's SQL run as written, tidemark started again with the default.
// Every event of both loads is then stored once, the ledger agrees, the
// raw table is distributed and verify exits 0.
func TestCitusConvertWarehouse(t *testing.T) {
	pgtest.OnlyOnCitus(t)
	ctx := context.Background()
	dsn := pgtest.SharedCluster(t).NewDatabase(t, pgtest.ClusterOptions{})
	pool := pgtest.Pool(t, dsn)
	kc := kafkatest.NewCluster(t, 2, "events")
	kafkatest.ExpireSilentMembers(t, kc)
	const group = "citus-convert"
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	config := func(warehouseExtra string) string {
		return writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q%s}
http: {listen: "off"}
kafka: {brokers: [%q], group: %s, session_timeout: 1s, rebalance_timeout: 2s}
ingest: {batch_max_age: 20ms}
reconcile: {every: 1s}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
    max_age: 30d
aggregates:
  daily_sales:
    source: app_events
    table: daily_sales
    partition: {by: day, column: sale_date}
    lateness_horizon: 30d
    sql: |
      SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*) AS event_count
      FROM {{events}} GROUP BY 1
`, dsn, warehouseExtra, kc.ListenAddrs()[0], group))
	}
	producer := kafkatest.Producer(t, kc, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	end := map[int32]int64{}
	load := func(cfg string, w *ingesttest.Workload) {
		t.Helper()
		res := producer.ProduceSync(ctx, w.Records...)
		if err := res.FirstErr(); err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			end[r.Record.Partition] = max(end[r.Record.Partition], r.Record.Offset+1)
		}
		p := startRun(t, cfg, now)
		ingesttest.WaitStored(t, pool, group, "events", end, 2*time.Minute)
		waitfor.Within(t, 2*time.Minute, "the reconciler to settle", func() bool {
			return reconcilerSettled(t, pool, 1)
		})
		stopRun(t, p)
	}
	placement := func() string { return pgtest.Placement(t, pool, "raw.app_events") }

	before := ingesttest.Make("events", 2000, 2, 21, 0.01, 0.01, now)
	load(config(", distribute: false"), before)
	if placement() != "" {
		t.Fatal("warehouse.distribute false created a distributed raw table")
	}
	for _, q := range docsql.Statements(t, "../../docs/citus.md", "Converting an existing warehouse", "raw.app_events") {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if placement() != "distributed by event_id" {
		t.Fatal("the conversion left raw.app_events on the coordinator")
	}
	after := ingesttest.Make("events", 2000, 2, 22, 0.01, 0.01, now)
	load(config(""), after)

	good := maps.Clone(before.Good)
	maps.Copy(good, after.Good)
	ingesttest.AssertRaw(t, pool, "app_events", good)
	ingesttest.AssertStoredEqual(t, pool, group, "events", end)
	ingesttest.AssertLedger(t, pool, "app_events")
	old := serviceClock
	serviceClock = func() time.Time { return now }
	defer func() { serviceClock = old }()
	code, out, errOut := invoke(t, "verify", "--aggregate", "daily_sales", "-c", config(""))
	if code != exitOK || !strings.Contains(out, " 0 differ") {
		t.Errorf("verify: exit %d\n%s%s", code, out, errOut)
	}
}
