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
	"github.com/tidemark-dev/tidemark/migrate"
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
	conn := pgtest.Conn(t, dsn)
	if _, err := conn.Exec(ctx, `
CREATE TABLE public.sales (id text NOT NULL, occurred_at timestamptz NOT NULL, loaded_at timestamptz NOT NULL, amount numeric NOT NULL);
SELECT create_distributed_table('public.sales', 'id');
INSERT INTO public.sales SELECT 's' || g, '2026-10-01 00:00+00'::timestamptz + g * interval '1 minute', now(), g FROM generate_series(1, 1000) g;
ANALYZE public.sales`); err != nil {
		t.Fatal(err)
	}
	d := dailyOnCitus(t, conn, dsn)
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

// TestRebuildWaitsForWorkers: a rebuild records the snapshot's xmin as the
// loads it holds (backfill --publish trusts a shadow build's the same
// way). On Citus a load committed on the coordinator whose COMMIT PREPARED
// has not reached a worker is below that xmin while its rows there are not
// visible: the rebuild must wait for it, not record rows it did not read.
func TestRebuildWaitsForWorkers(t *testing.T) {
	ctx := context.Background()
	dsn, proxy := pgtest.SharedCluster(t).NewDatabaseBehindProxy(t, 1)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Conn(t, dsn)
	if _, err := conn.Exec(ctx, `
CREATE TABLE public.sales (id text NOT NULL, occurred_at timestamptz NOT NULL, loaded_at timestamptz NOT NULL, amount numeric NOT NULL);
SELECT create_distributed_table('public.sales', 'id')`); err != nil {
		t.Fatal(err)
	}
	d := dailyOnCitus(t, conn, dsn)
	p := d.Of(time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC))

	proxy.Hold([]byte("COMMIT PREPARED"))
	load := pgtest.Conn(t, dsn)
	committed := make(chan error, 1)
	go func() {
		_, err := load.Exec(ctx, `INSERT INTO public.sales SELECT 's' || g, '2026-10-01 00:00+00'::timestamptz + g * interval '1 minute', now(), 1 FROM generate_series(1, 100) g`)
		committed <- err
	}()
	select {
	case <-proxy.Held():
	case err := <-committed:
		t.Fatalf("the load committed on every worker while COMMIT PREPARED was held: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no COMMIT PREPARED was sent to the second worker")
	}
	rebuild := func(ctx context.Context, conn *pgx.Conn) (aggregate.Result, error) {
		var res aggregate.Result
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			res, err = aggregate.Rebuild(ctx, tx, d, p, time.Now())
			return err
		})
		return res, err
	}
	// Its own session: the cancelled wait closes it.
	held := pgtest.Conn(t, dsn)
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := rebuild(short, held)
	cancel()
	if err == nil {
		var n int
		_ = conn.QueryRow(ctx, "SELECT n FROM daily").Scan(&n)
		t.Fatalf("a rebuild while a worker's COMMIT PREPARED is held succeeded, with %d of 100 events", n)
	}
	t.Logf("rebuild while held: %v", err)
	proxy.Release()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild(ctx, conn); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT n FROM daily").Scan(&n); err != nil || n != 100 {
		t.Fatalf("daily.n = %d (%v), want 100", n, err)
	}
}

// dailyOnCitus prepares the aggregate daily over public.sales.
func dailyOnCitus(t *testing.T, conn *pgx.Conn, dsn string) *aggregate.Definition {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(`warehouse: {dsn: "`+dsn+`"}
sources:
  sales:
    table: {name: public.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at}
aggregates:
  daily:
    source: sales
    table: daily
    partition: {by: day, column: day}
    beyond_horizon: rebuild
    sql: SELECT {{partition}} AS day, sum(amount) AS total, count(*) AS n FROM {{events}} GROUP BY 1
`), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	d, err := aggregate.FromConfig(cfg, "daily")
	if err != nil {
		t.Fatal(err)
	}
	if err := aggregate.Prepare(context.Background(), conn, d); err != nil {
		t.Fatal(err)
	}
	return d
}
