package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestCitusCDCFaults: `tidemark run` follows a source table through
// logical replication into a Citus warehouse (a coordinator and two
// workers of its own, the second behind a fault proxy; the change table
// and the mirror distributed over both) while the source, a server of
// its own, commits a stream of inserts, updates and deletes and the
// cluster fails under it, or grows by a third worker that shards move to. Afterwards the mirror
// equals the source, every change has exactly one raw change row, and no
// transaction is left prepared on a worker.
func TestCitusCDCFaults(t *testing.T) {
	pgtest.OnlyOnCitus(t)
	for _, tt := range []struct {
		name    string
		workers int // started; two are registered
		fault   func(f *cdcFault)
	}{
		{"tidemark killed before a worker's PREPARE TRANSACTION", 2, killApplyHolding("PREPARE TRANSACTION")},
		{"tidemark killed before a worker's COMMIT PREPARED", 2, killApplyHolding("COMMIT PREPARED")},
		{"a worker crashes mid-apply", 2, (*cdcFault).crashWorker},
		{"the coordinator crashes before a worker's COMMIT PREPARED", 2, (*cdcFault).crashCoordinator},
		{"a worker added and the shards rebalanced", 3, (*cdcFault).rebalance},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newCDCFault(t, tt.workers)
			tt.fault(f)
			f.finish()
		})
	}
}

// cdcFault is one case of TestCitusCDCFaults.
type cdcFault struct {
	t       *testing.T
	cluster *pgtest.Cluster
	proxy   *faultproxy.Proxy // in front of the second worker
	wh, src *pgxpool.Pool
	cfg     string
	now     time.Time
	proc    *process

	w       *orderWriter // commits changes at the source
	stop    chan struct{}
	written chan error
}

func newCDCFault(t *testing.T, workers int) *cdcFault {
	t.Helper()
	ctx := context.Background()
	c := pgtest.StartCluster(t, workers)
	whDSN, proxy := c.NewDatabaseBehindProxyWith(t, 1, pgtest.ClusterOptions{Register: 2})
	// The source is a server of its own, which a crash of the
	// coordinator leaves running.
	srcDSN := pgtest.NewDatabaseOn(t, pgtest.NewServer(t, pgserver.Options{}))
	f := &cdcFault{t: t, cluster: c, proxy: proxy, wh: pgtest.Pool(t, whDSN), src: pgtest.Pool(t, srcDSN),
		now: time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC), w: &orderWriter{maxOps: 20, pace: 2 * time.Millisecond},
		stop: make(chan struct{}), written: make(chan error, 1)}
	recoverQuickly(t, f.wh)
	if _, err := f.src.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, note text);
		INSERT INTO orders SELECT i, i, 'seed' FROM generate_series(1, 1000) AS i`); err != nil {
		t.Fatal(err)
	}
	f.cfg = writeFile(t, "cdc.yaml", fmt.Sprintf(`warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: info}
sources:
  shop:
    cdc: {dsn: %q, tables: [orders], snapshot: initial, status_every: 200ms}
    mirror: {table: dw_orders, deletes: hard}
`, whDSN, srcDSN))
	f.proc = startCommand(t, f.now, "run", "--only", "cdc", "-c", f.cfg)
	waitfor.Within(t, 2*time.Minute, "the snapshot to finish", func() bool {
		var state string
		return f.wh.QueryRow(ctx, "SELECT snapshot FROM tidemark.cdc_positions WHERE source = 'shop'").Scan(&state) == nil && state == "done"
	})
	for table, want := range map[string]string{"raw.shop": "distributed by event_id", "dw_orders": "distributed by id"} {
		if got := pgtest.Placement(t, f.wh, table); got != want {
			t.Fatalf("%s is %q, want %s: the test would not cover two-phase commits of its writes", table, got, want)
		}
	}
	go func() { f.written <- f.w.run(context.Background(), f.src, f.stop) }()
	waitfor.Within(t, time.Minute, "changes to be applied", func() bool {
		return ingesttest.Scalar(t, f.wh, "SELECT count(*) FROM raw.shop") > 0
	})
	return f
}

// killApplyHolding holds back the next message to the second worker that
// contains what, SIGKILLs tidemark while its apply waits for it, lets the
// message through, and starts tidemark again.
func killApplyHolding(what string) func(f *cdcFault) {
	return func(f *cdcFault) {
		f.t.Helper()
		holdThen(f.t, f.proxy, what, func() {
			f.t.Logf("killing tidemark with %s held, %d changes committed at the source", what, f.w.changes.Load())
			if err := f.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				f.t.Fatal(err)
			}
			<-f.proc.exited
		})
		f.proc = startCommand(f.t, f.now, "run", "--only", "cdc", "-c", f.cfg)
	}
}

// crashWorker stops the first worker as a crash does and starts it again;
// tidemark rides it out.
func (f *cdcFault) crashWorker() {
	f.t.Helper()
	f.t.Logf("crashing worker 0 with %d changes committed at the source", f.w.changes.Load())
	if err := f.cluster.Workers[0].Restart(context.Background(), true); err != nil {
		f.t.Fatal(err)
	}
}

// crashCoordinator holds back the second worker's COMMIT PREPARED, so
// that a group is committed on the coordinator and only prepared on that
// worker, then crashes the coordinator and starts it again: Citus's
// recovery must commit the worker's part, and tidemark rides it out.
func (f *cdcFault) crashCoordinator() {
	f.t.Helper()
	holdThen(f.t, f.proxy, "COMMIT PREPARED", func() {
		f.t.Logf("crashing the coordinator with %d changes committed at the source", f.w.changes.Load())
		if err := f.cluster.Coordinator.Halt(true); err != nil {
			f.t.Fatal(err)
		}
	})
	if err := f.cluster.Coordinator.Resume(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	// The test's own connections died with the coordinator.
	f.wh.Reset()
}

// rebalance registers the third worker while changes are applied and
// moves shards (the change table's and the mirror's) onto it.
func (f *cdcFault) rebalance() {
	f.t.Helper()
	f.t.Logf("adding worker 2 with %d changes committed at the source", f.w.changes.Load())
	moved := addWorkerAndRebalance(f.t, f.wh, f.cluster.Workers[2])
	mirrored := ingesttest.Scalar(f.t, f.wh, "SELECT count(*) FROM citus_shards WHERE nodeport = $1 AND table_name = 'dw_orders'::regclass", f.cluster.Workers[2].Port)
	f.t.Logf("rebalanced: %d shards on the new worker (%d of the mirror), %d changes committed", moved, mirrored, f.w.changes.Load())
	if mirrored == 0 {
		f.t.Error("the rebalance moved none of the mirror's shards")
	}
}

// finish lets the writer go on a little after the fault, stops it, waits
// for the mirror to catch up, stops tidemark and checks the warehouse.
func (f *cdcFault) finish() {
	t := f.t
	t.Helper()
	ctx := context.Background()
	after := f.w.changes.Load()
	waitfor.Within(t, time.Minute, "the source to commit changes after the fault", func() bool {
		return f.w.changes.Load() >= after+500
	})
	close(f.stop)
	if err := <-f.written; err != nil {
		t.Fatalf("writer: %v", err)
	}
	total := f.w.changes.Load()
	const rows = `SELECT id, amount::text, note FROM %s ORDER BY id`
	var equal bool
	var rawRows int64
	if err := waitfor.Poll(2*time.Minute, func() bool {
		select {
		case <-f.proc.exited:
			t.Fatalf("tidemark run exited during the test: %v\n%s", f.proc.err, tail(f.proc.output.String(), 40))
		default:
		}
		want := strings.Join(pgtest.Rows(t, f.src, fmt.Sprintf(rows, "orders")), "\n")
		got := strings.Join(pgtest.Rows(t, f.wh, fmt.Sprintf(rows, "dw_orders")), "\n")
		rawRows = ingesttest.Scalar(t, f.wh, "SELECT count(*) FROM raw.shop")
		equal = want == got
		return equal && rawRows >= total
	}); err != nil {
		t.Fatalf("no convergence within 2m: mirror equal %v, raw change rows %d of %d", equal, rawRows, total)
	}
	waitfor.Within(t, 2*time.Minute, "no transaction to stay prepared on a worker", func() bool {
		return ingesttest.Scalar(t, f.wh, `SELECT coalesce(sum(result::bigint), 0)::bigint FROM run_command_on_workers(
			format('SELECT count(*) FROM pg_prepared_xacts WHERE database = %L', current_database()))`) == 0
	})
	stopRun(t, f.proc)
	var raw, distinct int64
	if err := f.wh.QueryRow(ctx, "SELECT count(*), count(DISTINCT (commit_lsn, event_id)) FROM raw.shop").Scan(&raw, &distinct); err != nil {
		t.Fatal(err)
	}
	if raw != total || distinct != total {
		t.Errorf("raw change rows %d (%d distinct), want exactly %d", raw, distinct, total)
	}
	ingesttest.AssertLedger(t, f.wh, "shop")
	t.Logf("%d changes, mirror equal to the source", total)
}
