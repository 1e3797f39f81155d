package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestCitusFaults: `tidemark run` loads a steady stream into a Citus
// warehouse (a coordinator and two workers of its own, the second behind a
// fault proxy; the raw table distributed over both) and rebuilds
// daily_sales, while the cluster fails under it. Afterwards every good
// event is stored once, the offsets and the ledger agree, no transaction is
// left prepared on a worker, and `tidemark verify` exits 0.
func TestCitusFaults(t *testing.T) {
	pgtest.OnlyOnCitus(t)
	tests := []struct {
		name    string
		workers int // started; the first two are registered
		fault   func(f *citusFault)
	}{
		{"a worker crashes mid-load", 2, (*citusFault).crashWorker},
		{"the coordinator crashes before a worker's COMMIT PREPARED", 2, (*citusFault).crashCoordinator},
		{"tidemark killed before a worker's PREPARE TRANSACTION", 2, killHolding("PREPARE TRANSACTION")},
		{"tidemark killed before a worker's COMMIT PREPARED", 2, killHolding("COMMIT PREPARED")},
		{"a worker added and the shards rebalanced", 3, (*citusFault).rebalance},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCitusFault(t, tt.workers)
			f.waitLoading()
			tt.fault(f)
			f.finish()
		})
	}
}

// citusFault is one case of TestCitusFaults: a private cluster, a Kafka
// topic with a workload streaming into it, and the tidemark process.
type citusFault struct {
	t       *testing.T
	cluster *pgtest.Cluster
	proxy   *faultproxy.Proxy // in front of the second worker
	dsn     string
	pool    *pgxpool.Pool
	cfg     string
	now     time.Time
	w       *ingesttest.Workload
	proc    *process
	// stream produces the workload in 100 chunks, one every 200 ms, so
	// that a fault lands while records still arrive and are written.
	stream *kafkatest.Stream
}

const citusFaultGroup = "citus-faults"

func newCitusFault(t *testing.T, workers int) *citusFault {
	t.Helper()
	c := pgtest.StartCluster(t, workers)
	dsn, proxy := c.NewDatabaseBehindProxyWith(t, 1, pgtest.ClusterOptions{Register: 2})
	pool := pgtest.Pool(t, dsn)
	recoverQuickly(t, pool)

	n := 30_000
	if testing.Short() {
		n = 8_000
	}
	kc := kafkatest.NewCluster(t, 4, "events")
	kafkatest.ExpireSilentMembers(t, kc)
	f := &citusFault{
		t: t, cluster: c, proxy: proxy, dsn: dsn, pool: pool,
		now: time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC),
	}
	f.cfg = writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: info}
kafka:
  brokers: [%q]
  group: %s
  session_timeout: 1s
  rebalance_timeout: 2s
ingest: {batch_max_rows: 500, batch_max_age: 20ms}
reconcile: {every: 1s, run_timeout: 1m}
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
`, dsn, kc.ListenAddrs()[0], citusFaultGroup))
	f.w = ingesttest.Make("events", n, 4, 11, 0.005, 0.01, f.now)
	f.proc = startRun(t, f.cfg, f.now)
	producer := kafkatest.Producer(t, kc, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	f.stream = kafkatest.ProduceStream(producer, f.w.Records, len(f.w.Records)/100, 200*time.Millisecond)
	return f
}

// waitLoading waits until the process has stored records.
func (f *citusFault) waitLoading() {
	f.t.Helper()
	waitfor.Within(f.t, 2*time.Minute, "tidemark to store records", func() bool {
		return storedTotal(f.t, f.pool, citusFaultGroup, "events") > 0
	})
}

// stored is the number of records stored now, for the log.
func (f *citusFault) stored() int64 { return storedTotal(f.t, f.pool, citusFaultGroup, "events") }

// crashWorker stops the first worker as a crash does (immediate shutdown,
// crash recovery on start) and starts it again.
func (f *citusFault) crashWorker() {
	f.t.Helper()
	f.t.Logf("crashing worker 0 with %d records stored", f.stored())
	if err := f.cluster.Workers[0].Restart(context.Background(), true); err != nil {
		f.t.Fatal(err)
	}
}

// crashCoordinator holds back the second worker's COMMIT PREPARED, so
// that a batch is committed on the coordinator and only prepared on that
// worker, then crashes the coordinator and starts it again: Citus's
// recovery must commit the worker's part.
func (f *citusFault) crashCoordinator() {
	f.t.Helper()
	f.holdThen("COMMIT PREPARED", func() {
		f.t.Logf("crashing the coordinator with %d records stored", f.stored())
		if err := f.cluster.Coordinator.Halt(true); err != nil {
			f.t.Fatal(err)
		}
	})
	if err := f.cluster.Coordinator.Resume(context.Background()); err != nil {
		f.t.Fatal(err)
	}
}

// killHolding holds back the first message to the second worker that
// contains what, SIGKILLs tidemark while it waits for its commit, lets the
// message through, and starts tidemark again.
func killHolding(what string) func(f *citusFault) {
	return func(f *citusFault) {
		f.t.Helper()
		f.holdThen(what, func() {
			f.t.Logf("killing tidemark with %s held, %d records stored", what, f.stored())
			if err := f.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				f.t.Fatal(err)
			}
			<-f.proc.exited
		})
		f.proc = startRun(f.t, f.cfg, f.now)
	}
}

// holdThen holds back the next message to the second worker containing
// what, runs fault while it is held, and releases it.
func (f *citusFault) holdThen(what string, fault func()) {
	f.t.Helper()
	holdThen(f.t, f.proxy, what, fault)
}

// holdThen holds back the next message through proxy (to a worker)
// containing what, runs fault while it is held, and releases it.
func holdThen(t *testing.T, proxy *faultproxy.Proxy, what string, fault func()) {
	t.Helper()
	proxy.Hold([]byte(what))
	select {
	case <-proxy.Held():
	case <-time.After(time.Minute):
		t.Fatalf("no %s reached the worker within a minute", what)
	}
	fault()
	proxy.Release()
}

// recoverQuickly makes the Citus coordinator behind pool recover commits
// left in doubt every second instead of every recover_2pc_interval (a
// minute by default), which keeps the fault tests short.
func recoverQuickly(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, q := range []string{"ALTER SYSTEM SET citus.recover_2pc_interval = '1s'", "SELECT pg_reload_conf()"} {
		if _, err := pool.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// rebalance registers the third worker while records are loading and
// moves shards onto it with citus_rebalance_start.
func (f *citusFault) rebalance() {
	f.t.Helper()
	f.t.Logf("adding worker 2 with %d records stored", f.stored())
	moved := addWorkerAndRebalance(f.t, f.pool, f.cluster.Workers[2])
	f.t.Logf("rebalanced: %d shards on the new worker, %d records stored", moved, f.stored())
}

// addWorkerAndRebalance registers worker w with the coordinator of pool,
// moves shards onto it with citus_rebalance_start and waits for the moves
// to finish; it returns the number of shards on w, and fails the test
// when there are none.
func addWorkerAndRebalance(t *testing.T, pool *pgxpool.Pool, w *pgserver.Server) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, q := range []string{
		fmt.Sprintf("SELECT citus_add_node('%s', %d)", w.Host, w.Port),
		"SELECT citus_rebalance_start()",
		"SELECT citus_rebalance_wait()",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	moved := ingesttest.Scalar(t, pool, "SELECT count(*) FROM citus_shards WHERE nodeport = $1", w.Port)
	if moved == 0 {
		t.Fatal("the rebalance moved no shard onto the new worker")
	}
	return moved
}

// alive fails the test when tidemark has exited: it must ride out each
// fault of the cluster.
func (f *citusFault) alive() {
	f.t.Helper()
	select {
	case <-f.proc.exited:
		f.t.Fatalf("tidemark run exited during the test: %v\n%s", f.proc.err, tail(f.proc.output.String(), 40))
	default:
	}
}

// finish waits for the stream to be stored and the aggregate rebuilt,
// stops tidemark with SIGTERM and checks the warehouse.
func (f *citusFault) finish() {
	t := f.t
	t.Helper()
	end, err := f.stream.Wait()
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	var total int64
	for _, o := range end {
		total += o
	}
	waitfor.Within(t, 5*time.Minute, "every record to be stored", func() bool {
		f.alive()
		return f.stored() == total
	})
	waitfor.Within(t, 3*time.Minute, "the reconciler to settle and no transaction to stay prepared on a worker", func() bool {
		f.alive()
		prepared := ingesttest.Scalar(t, f.pool, `SELECT coalesce(sum(result::bigint), 0)::bigint FROM run_command_on_workers(
			format('SELECT count(*) FROM pg_prepared_xacts WHERE database = %L', current_database()))`)
		return prepared == 0 && reconcilerSettled(t, f.pool, 1)
	})
	stopRun(t, f.proc)

	ingesttest.AssertRaw(t, f.pool, "app_events", f.w.Good)
	ingesttest.AssertDeadLetters(t, f.pool, f.w)
	ingesttest.AssertStoredEqual(t, f.pool, citusFaultGroup, "events", end)
	ingesttest.AssertLedger(t, f.pool, "app_events")
	old := serviceClock
	serviceClock = func() time.Time { return f.now }
	defer func() { serviceClock = old }()
	code, out, errOut := invoke(t, "verify", "--aggregate", "daily_sales", "-c", f.cfg)
	if code != exitOK || !strings.Contains(out, " 0 differ") {
		t.Errorf("verify: exit %d\n%s%s", code, out, errOut)
	}
	t.Log(strings.TrimSpace(out))
}

// reconcilerSettled reports whether every one of the aggregates
// aggregates has read the ledger to its end and has no partition queued.
func reconcilerSettled(t *testing.T, pool *pgxpool.Pool, aggregates int64) bool {
	t.Helper()
	return ingesttest.Scalar(t, pool, `SELECT count(*) FROM tidemark.load_watermarks w
		WHERE NOT EXISTS (SELECT FROM tidemark.ingest_ledger l WHERE l.source = w.source AND l.load_xid >= w.load_xid)
		  AND NOT EXISTS (SELECT FROM tidemark.pending_partitions p WHERE p.aggregate = w.aggregate)`) == aggregates
}
