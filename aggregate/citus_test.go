package aggregate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestRebuildAggregatesOnWorkers: on a Citus warehouse whose raw table is
// distributed, the statement of a rebuild reads the partition on the
// workers and aggregates it there, partially, before the coordinator
// combines the few rows per worker (its plan shows an aggregate inside a
// task on a worker).
func TestRebuildAggregatesOnWorkers(t *testing.T) {
	ctx := context.Background()
	cluster := pgtest.SharedCluster(t)
	dsn := cluster.NewDatabase(t, pgtest.ClusterOptions{})
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `
CREATE TABLE public.sales (id text NOT NULL, occurred_at timestamptz NOT NULL, loaded_at timestamptz NOT NULL, amount numeric NOT NULL);
SELECT create_distributed_table('public.sales', 'id');
INSERT INTO public.sales SELECT 's' || g, '2026-10-01 00:00+00'::timestamptz + g * interval '1 minute', now(), g FROM generate_series(1, 1000) g;
ANALYZE public.sales`); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte(`warehouse: {dsn: "`+dsn+`"}
sources:
  sales:
    table: {name: public.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at}
aggregates:
  daily:
    source: sales
    table: daily
    partition: {by: day, column: day}
    sql: SELECT {{partition}} AS day, sum(amount) AS total, count(*) AS n FROM {{events}} GROUP BY 1
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	d, err := aggregate.FromConfig(cfg, "daily")
	if err != nil {
		t.Fatal(err)
	}
	if err := aggregate.Prepare(ctx, conn, d); err != nil {
		t.Fatal(err)
	}
	p := d.Of(time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC))
	lines := pgtest.Rows(t, conn, "EXPLAIN (COSTS OFF) "+aggregate.InsertSQL(d, p))
	plan := strings.Join(lines, "\n")
	if !workerAggregates(lines, cluster.Workers) {
		t.Fatalf("no task on a worker aggregates: the workers send every row to the coordinator:\n%s", plan)
	}
	t.Logf("plan of the rebuild:\n%s", plan)
}

// workerAggregates reports whether a task of the plan's lines that runs on
// one of workers has an aggregate among the nodes under it.
func workerAggregates(lines []string, workers []*pgserver.Server) bool {
	indent := func(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }
	for i, l := range lines {
		if !strings.Contains(l, "->  Task") || i+1 >= len(lines) {
			continue
		}
		onWorker := false
		for _, w := range workers {
			onWorker = onWorker || strings.Contains(lines[i+1], fmt.Sprintf(" port=%d ", w.Port))
		}
		for j := i + 2; onWorker && j < len(lines) && indent(lines[j]) > indent(l); j++ {
			if strings.Contains(lines[j], "Aggregate") {
				return true
			}
		}
	}
	return false
}
