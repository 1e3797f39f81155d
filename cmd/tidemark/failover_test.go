package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os/exec"
	"strconv"
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

// The consumer group and topic of the failover tests.
const failoverGroup, failoverTopic = "failover", "events"

// TestWarehouseFailover runs `tidemark run` with a Kafka source, a CDC
// source and two aggregates reconciled every second, writing to a
// warehouse that has a synchronous standby, with a warehouse.dsn that
// names both (target_session_attrs=read-write). Mid-stream the warehouse
// fails over, and tidemark, left alone, follows it:
//
//   - the primary crashes: replication to the standby stops first, so
//     that tidemark's commits wait for it, then every process of the
//     primary is killed and the standby promoted;
//   - the primary is fenced (default_transaction_read_only, a planned
//     switchover) and stays up, read-only, with tidemark's sessions on
//     it, and the standby is promoted once it has replayed everything.
//
// Afterwards every event of the topic is stored exactly once (raw rows,
// dead letters, offsets, ledger), every source change has exactly one raw
// change row, the mirror equals the source, `tidemark verify` finds no
// drift and no partition is left queued; tidemark never exited.
func TestWarehouseFailover(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fence bool
	}{
		{"primary crashes", false},
		{"primary fenced read-only", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFailover(t, failoverOptions{sync: true, cdc: true})
			f.start()
			if tc.fence {
				f.switchover()
			} else {
				f.crash()
			}
			f.recovered()
			f.finish()
			f.checkKafka()
			f.checkCDC(true)
			f.checkAggregates()
			stopRun(t, f.proc)
		})
	}
}

// TestWarehouseFailoverAsynchronous is TestWarehouseFailover's crash with
// an asynchronous standby: the primary acknowledges loads the standby
// never receives, and they are lost with it, Kafka offsets and CDC
// positions included.
//
//   - Kafka alone: tidemark goes on by itself, and the ingester, whose
//     next write finds the stored offsets behind the ones it wrote, reads
//     the records again from there: every event once.
//   - With a CDC source: its slot is confirmed by then beyond what the
//     promoted warehouse holds, and is refused: tidemark stops with a
//     message that says what happened and how to recover, rather than
//     skip the changes in between. After that recovery (a new slot)
//     the mirror equals the source again, and every event is stored once.
func TestWarehouseFailoverAsynchronous(t *testing.T) {
	t.Run("kafka", func(t *testing.T) {
		f := newFailover(t, failoverOptions{})
		f.start()
		f.crash()
		f.recovered()
		f.finish()
		f.checkKafka()
		f.checkAggregates()
		stopRun(t, f.proc)
	})
	t.Run("kafka and cdc", func(t *testing.T) {
		f := newFailover(t, failoverOptions{cdc: true})
		f.start()
		f.crash()
		select {
		case <-f.proc.exited:
		case <-time.After(3 * time.Minute):
			t.Fatalf("tidemark run did not stop on the CDC slot confirmed beyond the promoted warehouse:\n%s", tail(f.proc.output.String(), 40))
		}
		out := f.proc.output.String()
		var exit *exec.ExitError
		if !errors.As(f.proc.err, &exit) || exit.ExitCode() != exitFailure {
			t.Fatalf("tidemark run: %v, want exit status %d", f.proc.err, exitFailure)
		}
		for _, want := range []string{"beyond what tidemark applied", "the warehouse lost tidemark's last transactions", "tidemark resync shop --new-slot"} {
			if !strings.Contains(out, want) {
				t.Errorf("tidemark run's output lacks %q:\n%s", want, tail(out, 40))
			}
		}
		f.writer.stop(t)

		// The recovery the message gives.
		if code, out, errOut := invoke(t, "resync", "shop", "--new-slot", "-c", f.cfg); code != exitOK {
			t.Fatalf("resync --new-slot: exit %d\n%s%s", code, out, errOut)
		}
		f.proc = startWith(t, nil, "run", "-c", f.cfg)
		f.until(3*time.Minute, "the resync after the new slot to end", func() (bool, error) {
			var pending, done int64
			err := f.wh.QueryRow(f.ctx, `SELECT count(*) FILTER (WHERE state <> 'done'), count(*) FILTER (WHERE state = 'done')
				FROM tidemark.cdc_resyncs WHERE source = 'shop'`).Scan(&pending, &done)
			return pending == 0 && done > 0, err
		})
		f.finish()
		f.checkKafka()
		f.checkCDC(false)
		f.checkAggregates()
		stopRun(t, f.proc)
	})
}

// failoverOptions choose the warehouse's replication, synchronous or
// not, and whether a CDC source (with an aggregate) runs besides the
// Kafka source.
type failoverOptions struct{ sync, cdc bool }

// failover is one run of the failover tests.
type failover struct {
	t *testing.T
	failoverOptions
	ctx context.Context

	primary, standby *pgserver.Server
	// replication is the network between the standby and the primary.
	replication *faultproxy.Proxy
	// whDSN names the warehouse database on the primary; wh is the
	// test's own pool, on the primary, then on the promoted standby.
	whDSN string
	wh    *pgxpool.Pool
	src   *pgxpool.Pool

	cfg      string
	w        *ingesttest.Workload
	stream   *kafkatest.Stream
	writer   *failoverWriter
	proc     *process
	failAt   int64 // the warehouse fails over once this many Kafka records are stored
	storedAt int64 // Kafka records stored when the warehouse failed over
	failedAt time.Time
}

func newFailover(t *testing.T, opts failoverOptions) *failover {
	t.Helper()
	f := &failover{t: t, failoverOptions: opts, ctx: context.Background()}
	f.primary = pgtest.NewServer(t, pgserver.Options{})
	var err error
	if f.replication, err = faultproxy.New(fmt.Sprintf("%s:%d", f.primary.Host, f.primary.Port)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.replication.Close() })
	f.whDSN = pgtest.NewDatabaseOn(t, f.primary)
	f.standby = pgtest.NewStandby(t, f.primary, pgserver.StandbyOptions{Synchronous: f.sync, PrimaryAddr: f.replication.Addr()})
	multi := pgtest.MultiHostDSN(t, f.whDSN, f.primary, f.standby)
	f.wh = pgtest.Pool(t, f.whDSN)

	cdc := ""
	if f.cdc {
		var srcDSN string
		f.src, srcDSN = pgtest.NewPool(t)
		if _, err := f.src.Exec(f.ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, note text);
			INSERT INTO orders SELECT i, i, 'seed' FROM generate_series(1, 1000) AS i`); err != nil {
			t.Fatal(err)
		}
		cdc = fmt.Sprintf(`
  shop:
    cdc: {dsn: %q, tables: [orders], status_every: 200ms}
    mirror: {table: dw_orders, deletes: hard}
    raw_partition: day`, srcDSN)
	}
	kc := kafkatest.NewCluster(t, 4, failoverTopic)
	kafkatest.ExpireSilentMembers(t, kc)
	n := 20_000
	if testing.Short() {
		n = 8_000
	}
	f.w = ingesttest.Make(failoverTopic, n, 4, 11, 0.005, 0.01, time.Now())
	// Somewhere in the first half of the stream.
	f.failAt = int64(n/10 + rand.IntN(n*4/10))
	f.cfg = writeFile(t, "failover.yaml", fmt.Sprintf(`
warehouse: {dsn: %[1]q, max_conns: 6, write_timeout: 20s}
http: {listen: "off"}
log: {level: info}
kafka: {brokers: [%[2]q], group: %[3]s, session_timeout: 3s, rebalance_timeout: 6s}
ingest: {batch_max_rows: 500, batch_max_age: 20ms}
reconcile: {every: 1s, run_timeout: 1m}
sources:
  events:
    kafka: {topics: [%[4]s]}
    event_id: /event_id
    event_time: /event_time
    max_age: 30d%[5]s
%[6]s`, multi, kc.ListenAddrs()[0], failoverGroup, failoverTopic, cdc, aggregatesYAML(f.aggregates()...)))

	producer := kafkatest.Producer(t, kc, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	f.stream = kafkatest.ProduceStream(producer, f.w.Records, n/200, 100*time.Millisecond)
	return f
}

// start runs tidemark and the source's writer once the CDC snapshot is
// done (changes made before the slot exists are in the snapshot), and
// returns once both Kafka records and source changes are being stored.
func (f *failover) start() {
	t := f.t
	f.proc = startWith(t, nil, "run", "-c", f.cfg)
	if f.cdc {
		f.until(2*time.Minute, "the CDC snapshot", func() (bool, error) {
			var state string
			err := f.wh.QueryRow(f.ctx, "SELECT snapshot FROM tidemark.cdc_positions WHERE source = 'shop'").Scan(&state)
			return err == nil && state == "done", nil
		})
		f.writer = startFailoverWriter(f.ctx, f.src)
	}
	f.until(2*time.Minute, "Kafka records and source changes to be stored", func() (bool, error) {
		changes, err := f.changes(f.wh)
		return (!f.cdc || changes > 0) && storedTotal(t, f.wh, failoverGroup, failoverTopic) > f.failAt, err
	})
}

// crash cuts replication to the standby, waits until tidemark's loads
// wait for the standby (synchronous) or until the primary has
// acknowledged loads and a CDC confirmation the standby lacks
// (asynchronous), and fails over: every process of the primary killed,
// the standby promoted.
func (f *failover) crash() {
	t := f.t
	f.replication.Stall()
	onStandby := pgtest.Pool(t, onServer(t, f.whDSN, f.standby))
	onPrimary := pgtest.Pool(t, onServer(t, f.whDSN, f.primary))
	if f.sync {
		f.until(time.Minute, "a commit of tidemark to wait for the standby", func() (bool, error) {
			var waiting int
			err := onPrimary.QueryRow(f.ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&waiting)
			return waiting > 0, err
		})
	} else {
		f.until(time.Minute, "the primary to acknowledge loads the standby lacks", func() (bool, error) {
			ahead, err := f.cdcAhead(onStandby)
			return (!f.cdc || ahead) && storedTotal(t, onPrimary, failoverGroup, failoverTopic) > storedTotal(t, onStandby, failoverGroup, failoverTopic), err
		})
	}
	f.storedAt = storedTotal(t, onPrimary, failoverGroup, failoverTopic)
	f.failedAt = time.Now()
	pgtest.Failover(t, f.primary, f.standby)
	f.wh = onStandby
	t.Logf("failover: %d of %d Kafka records stored when the primary crashed; promoted in %s", f.storedAt, len(f.w.Records),
		time.Since(f.failedAt).Round(time.Millisecond))
	if f.sync && f.cdc {
		// Nothing tidemark confirmed to the source is missing from the
		// promoted warehouse.
		if ahead, err := f.cdcAhead(onStandby); err != nil || ahead {
			t.Fatalf("the slot is confirmed beyond the promoted warehouse's position (%v) with a synchronous standby", err)
		}
	}
}

// cdcAhead reports whether the source's slot is confirmed beyond the
// position the warehouse of pool stores.
func (f *failover) cdcAhead(pool *pgxpool.Pool) (bool, error) {
	if !f.cdc {
		return false, nil
	}
	var stored string
	if err := pool.QueryRow(f.ctx, "SELECT greatest(applied_lsn, confirmed_lsn)::text FROM tidemark.cdc_positions WHERE source = 'shop'").Scan(&stored); err != nil {
		return false, err
	}
	var ahead bool
	err := f.src.QueryRow(f.ctx, "SELECT confirmed_flush_lsn > $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'", stored).Scan(&ahead)
	return ahead, err
}

// switchover fences the primary (default_transaction_read_only) and
// leaves it running, waits until tidemark's writes fail there, and
// promotes the standby once it has replayed everything.
func (f *failover) switchover() {
	t := f.t
	if err := f.primary.Configure(f.ctx, map[string]string{"default_transaction_read_only": "on"}); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, "tidemark's writes to fail on the fenced primary", func() bool {
		return strings.Contains(f.proc.output.String(), "in a read-only transaction")
	})
	f.storedAt = storedTotal(t, f.wh, failoverGroup, failoverTopic)
	f.failedAt = time.Now()
	pgtest.WaitReplayed(t, f.primary, f.standby)
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	if err := f.standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	old := f.wh
	f.wh = pgtest.Pool(t, onServer(t, f.whDSN, f.standby))
	// tidemark leaves the fenced primary: a session that stayed there
	// would read its stale state. (A session that made temporary tables
	// commits their removal as it ends, and waits there for the standby
	// that is gone: its client has left.)
	f.until(time.Minute, "tidemark's sessions to leave the fenced primary", func() (bool, error) {
		left := pgtest.Rows(t, old, `SELECT pid, state, left(query, 60) FROM pg_stat_activity
			WHERE application_name LIKE 'tidemark%' AND wait_event IS DISTINCT FROM 'SyncRep'`)
		if len(left) > 0 {
			return false, fmt.Errorf("sessions left: %q", left)
		}
		return true, nil
	})
	t.Logf("switchover: %d of %d Kafka records stored when the primary was fenced", f.storedAt, len(f.w.Records))
}

// recovered waits until tidemark stores Kafka records and source changes
// on the promoted standby, and logs how long after the failover began.
func (f *failover) recovered() {
	t := f.t
	changes, err := f.changes(f.wh)
	if err != nil {
		t.Fatal(err)
	}
	f.until(2*time.Minute, "tidemark to store on the promoted standby", func() (bool, error) {
		now, err := f.changes(f.wh)
		return (!f.cdc || now > changes) && storedTotal(t, f.wh, failoverGroup, failoverTopic) > f.storedAt, err
	})
	t.Logf("failover: Kafka records and source changes stored again %s after the failover began", time.Since(f.failedAt).Round(100*time.Millisecond))
}

// finish waits for the stream and the writer to end and for tidemark to
// store all of it, the reconciler to settle included; tidemark must not
// have exited.
func (f *failover) finish() {
	t := f.t
	end, err := f.stream.Wait()
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	if f.storedAt >= int64(len(f.w.Records)) {
		t.Fatalf("the failover came after the whole stream was stored")
	}

	f.until(3*time.Minute, "every Kafka record to be stored", func() (bool, error) {
		stored := ingesttest.StoredOffsets(t, f.wh, failoverGroup, failoverTopic)
		for p, o := range end {
			if stored[p] < o {
				return false, nil
			}
		}
		return true, nil
	})
	if f.cdc {
		f.writer.stop(t)
		f.until(3*time.Minute, "every source change to be applied", func() (bool, error) {
			want := strings.Join(pgtest.Rows(t, f.src, failoverMirrorSQL("orders")), "\n")
			got := strings.Join(pgtest.Rows(t, f.wh, failoverMirrorSQL("dw_orders")), "\n")
			return want == got, nil
		})
		t.Logf("failover: %d source changes committed", f.writer.changes.Load())
	}
	f.until(3*time.Minute, "the reconciler to settle", func() (bool, error) {
		var behind, aggs int
		err := f.wh.QueryRow(f.ctx, `SELECT count(*) FILTER (WHERE EXISTS (SELECT FROM tidemark.ingest_ledger l WHERE l.source = w.source AND l.load_xid >= w.load_xid)
			   OR EXISTS (SELECT FROM tidemark.pending_partitions p WHERE p.aggregate = w.aggregate)), count(*) FROM tidemark.load_watermarks w`).Scan(&behind, &aggs)
		return err == nil && behind == 0 && aggs == len(f.aggregates()), err
	})
	select {
	case <-f.proc.exited:
		t.Fatalf("tidemark run exited (%v):\n%s", f.proc.err, tail(f.proc.output.String(), 40))
	default:
	}
}

// checkKafka requires every record of the stream stored exactly once.
func (f *failover) checkKafka() {
	t := f.t
	end := map[int32]int64{}
	for _, r := range f.w.Records {
		end[r.Partition]++
	}
	ingesttest.AssertRaw(t, f.wh, "events", f.w.Good)
	ingesttest.AssertDeadLetters(t, f.wh, f.w)
	ingesttest.AssertStoredEqual(t, f.wh, failoverGroup, failoverTopic, end)
	ingesttest.AssertLedger(t, f.wh, "events")
}

// checkCDC requires the mirror to equal the source and, when every
// change must be there (exact), exactly one raw change row per change.
func (f *failover) checkCDC(exact bool) {
	t := f.t
	pgtest.Equal(t, "dw_orders", pgtest.Rows(t, f.wh, failoverMirrorSQL("dw_orders")), pgtest.Rows(t, f.src, failoverMirrorSQL("orders")))
	if !exact {
		return
	}
	total := f.writer.changes.Load()
	var raw, distinct int64
	if err := f.wh.QueryRow(f.ctx, "SELECT count(*), count(DISTINCT (commit_lsn, event_id)) FROM raw.shop").Scan(&raw, &distinct); err != nil {
		t.Fatal(err)
	}
	if raw != total || distinct != total {
		t.Errorf("raw.shop: %d change rows (%d distinct), want exactly %d", raw, distinct, total)
	}
}

// checkAggregates runs `tidemark verify` on each aggregate.
func (f *failover) checkAggregates() {
	t := f.t
	for _, a := range f.aggregates() {
		if code, out, errOut := invoke(t, "verify", "--aggregate", a.name, "-c", f.cfg); code != exitOK {
			t.Errorf("verify %s: exit %d\n%s%s", a.name, code, out, errOut)
		}
	}
	if n := ingesttest.Scalar(t, f.wh, "SELECT count(*) FROM tidemark.pending_partitions"); n != 0 {
		t.Errorf("%d partitions still queued", n)
	}
}

// changes counts the raw change rows of the CDC source in the warehouse
// of pool; 0 without one.
func (f *failover) changes(pool *pgxpool.Pool) (int64, error) {
	if !f.cdc {
		return 0, nil
	}
	var n int64
	err := pool.QueryRow(f.ctx, "SELECT count(*) FROM raw.shop").Scan(&n)
	return n, err
}

// aggregates are the aggregates of the configuration: over the Kafka
// events, and over the CDC source's changes when there is one.
func (f *failover) aggregates() []testAggregate {
	if f.cdc {
		return []testAggregate{dailySales, shopChanges}
	}
	return []testAggregate{dailySales}
}

// until waits for cond, taking its errors (the warehouse failing over)
// for "not yet", and fails the test with tidemark's output when limit
// passes first or tidemark exits.
func (f *failover) until(limit time.Duration, what string, cond func() (bool, error)) {
	f.t.Helper()
	var last error
	if waitfor.Poll(limit, func() bool {
		select {
		case <-f.proc.exited:
			last = fmt.Errorf("tidemark run exited: %v", f.proc.err)
			return true
		default:
		}
		ok, err := cond()
		last = err
		return ok && err == nil
	}) != nil || f.exited() {
		// SIGQUIT: the Go runtime prints every goroutine's stack, to
		// show where a hang is.
		_ = f.proc.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-f.proc.exited:
		case <-time.After(10 * time.Second):
		}
		f.t.Fatalf("waited %s for %s (last error %v):\n%s", limit, what, last, tail(f.proc.output.String(), 60))
	}
}

// exited reports whether tidemark has exited.
func (f *failover) exited() bool {
	select {
	case <-f.proc.exited:
		return true
	default:
		return false
	}
}

// failoverMirrorSQL reads the orders table or its mirror for comparison.
func failoverMirrorSQL(table string) string {
	return "SELECT id, amount::text, note FROM " + table + " ORDER BY id"
}

// onServer returns dsn pointed at srv.
func onServer(t *testing.T, dsn string, srv *pgserver.Server) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = srv.Host + ":" + strconv.Itoa(srv.Port)
	return u.String()
}

// failoverWriter is an orderWriter at the source for the length of a
// failover test.
type failoverWriter struct {
	*orderWriter
	done    chan struct{}
	written chan error
}

func startFailoverWriter(ctx context.Context, src *pgxpool.Pool) *failoverWriter {
	w := &failoverWriter{orderWriter: &orderWriter{maxOps: 20, pace: 5 * time.Millisecond}, done: make(chan struct{}), written: make(chan error, 1)}
	go func() { w.written <- w.run(ctx, src, w.done) }()
	return w
}

// stop stops the writer, once, and fails t on its error.
func (w *failoverWriter) stop(t *testing.T) {
	t.Helper()
	select {
	case <-w.done:
		return
	default:
	}
	close(w.done)
	if err := <-w.written; err != nil {
		t.Fatalf("the source writer: %v", err)
	}
}
