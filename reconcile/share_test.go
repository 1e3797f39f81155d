package reconcile_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// instance is a reconciler with a pool of its own, as a separate
// `tidemark run` process has; its sessions carry application_name name.
func (b *bundle) instance(name string, opts ...func(*reconcile.Options)) *reconcile.Reconciler {
	b.t.Helper()
	pc, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		b.t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(pool.Close)
	o := reconcile.Options{Now: b.clock.Now, Registerer: prometheus.NewRegistry(), Logger: testLogger(b.t)}
	for _, f := range opts {
		f(&o)
	}
	r, err := reconcile.New(b.cfg, pool, o)
	if err != nil {
		b.t.Fatal(err)
	}
	return r
}

// probeSQL is daily_sales's query with share_probe() called once per
// rebuild (per group: one per partition), which records the rebuild.
const probeSQL = `SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1 HAVING public.share_probe(({{partition}})::text)`

// probeFunctionSQL records each rebuild that commits: its partition, the
// backend, and the interval from the start of its transaction (before the
// queue row is picked) to the end of its query, slowed by 20ms.
const probeFunctionSQL = `
CREATE TABLE public.rebuilds (part text NOT NULL, pid int NOT NULL, started timestamptz NOT NULL, ended timestamptz NOT NULL);
CREATE FUNCTION public.share_probe(part text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_sleep(0.02);
    INSERT INTO public.rebuilds VALUES (part, pg_backend_pid(), now(), clock_timestamp());
    RETURN true;
END $$`

// TestInstancesShareQueuedPartitions: three instances, each with its own
// pool, run reconcile passes at once over a catch-up of 120 queued day
// partitions. One claims; all rebuild. Every partition is rebuilt exactly
// once, by one backend, never at the same time as another rebuild of it;
// more than one instance rebuilds; and the aggregate equals what one
// instance alone rebuilds from the same rows.
func TestInstancesShareQueuedPartitions(t *testing.T) {
	a := dailySales("rebuild")
	a.sql = probeSQL
	b := setup(t, 2, a)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, probeFunctionSQL); err != nil {
		t.Fatal(err)
	}
	b.startIngest()
	const days = 120
	first := at("2026-06-01 00:00")
	var recs []*kgo.Record
	for d := range days {
		day := first.AddDate(0, 0, d)
		for i := range 2 {
			recs = append(recs, event(int32(i), fmt.Sprintf("d%d-%d", d, i), day.Add(time.Duration(3+i*12)*time.Hour).Format(time.RFC3339),
				fmt.Sprintf("%d.%02d", d+1, i*25)))
		}
	}
	b.ingestAt("2026-10-01 00:00", recs...)

	var claimed atomic.Bool
	onClaim := func(o *reconcile.Options) {
		o.AfterClaim = func(string) error { claimed.Store(true); return nil }
	}
	names := []string{"instance-a", "instance-b", "instance-c"}
	rebuilt := make([][]string, len(names))
	errs := make([]error, len(names))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i, name := range names {
		r := b.instance(name, onClaim)
		wg.Go(func() {
			// A tick of `tidemark run`, again and again, until the
			// claim is done and nothing is queued.
			for rctx.Err() == nil {
				rep, err := r.RunOnce(rctx, "daily_sales", false)
				busy := err == nil && rep.Busy
				if busy {
					rep, err = r.Help(rctx, "daily_sales")
				}
				if err != nil {
					errs[i] = err
					return
				}
				rebuilt[i] = append(rebuilt[i], rep.Rebuilt...)
				if claimed.Load() && rep.Remaining == 0 {
					return
				}
				if busy && len(rep.Rebuilt) == 0 {
					time.Sleep(5 * time.Millisecond) // the pause between ticks of `tidemark run`, not a wait
				}
			}
			errs[i] = rctx.Err()
		})
	}
	wg.Wait()
	var all []string
	working := 0
	for i, name := range names {
		if errs[i] != nil {
			t.Fatalf("%s: %v", name, errs[i])
		}
		t.Logf("%s rebuilt %d partitions", name, len(rebuilt[i]))
		if len(rebuilt[i]) > 0 {
			working++
		}
		all = append(all, rebuilt[i]...)
	}
	if working < 2 {
		t.Errorf("%d instance(s) rebuilt partitions, want at least 2", working)
	}
	slices.Sort(all)
	if len(all) != days || len(slices.Compact(slices.Clone(all))) != days {
		t.Errorf("reports list %d rebuilds of %d partitions, want each of %d once", len(all), len(slices.Compact(slices.Clone(all))), days)
	}
	pgtest.Equal(t, "queue", b.rows("SELECT count(*) FROM tidemark.pending_partitions"), []string{"0"})
	pgtest.Equal(t, "rebuilds", b.rows("SELECT count(*), count(DISTINCT part), max(n) FROM (SELECT part, count(*) OVER (PARTITION BY part) AS n FROM public.rebuilds) r"),
		[]string{fmt.Sprintf("%d | %d | 1", days, days)})
	pgtest.Equal(t, "overlapping rebuilds of one partition", b.rows(`SELECT x.part FROM public.rebuilds x JOIN public.rebuilds y
		ON x.part = y.part AND x.ctid < y.ctid AND x.started < y.ended AND y.started < x.ended`), nil)
	if pids := b.rows("SELECT count(DISTINCT pid) FROM public.rebuilds"); pids[0] == "1" {
		t.Errorf("one backend did every rebuild")
	}

	// One instance alone, from the same rows, publishes the same table.
	shared := b.rows("SELECT sale_date::text, total, event_count FROM daily_sales ORDER BY 1")
	if _, err := b.pool.Exec(ctx, `
TRUNCATE daily_sales;
INSERT INTO tidemark.pending_partitions (aggregate, partition_start, partition_end, reason, queued_at)
SELECT aggregate, partition_start, partition_end, 'test', now() FROM tidemark.partitions WHERE aggregate = 'daily_sales'`); err != nil {
		t.Fatal(err)
	}
	alone := b.instance("alone")
	for n := 0; ; n++ {
		rep := b.runOnce(alone, "daily_sales")
		if rep.Remaining == 0 {
			break
		}
		if n > days {
			t.Fatalf("the queue does not shrink: %+v", rep)
		}
	}
	pgtest.Equal(t, "aggregate built by several instances, against one", shared,
		b.rows("SELECT sale_date::text, total, event_count FROM daily_sales ORDER BY 1"))
	if len(shared) != days {
		t.Errorf("%d aggregate rows, want %d", len(shared), days)
	}
}

// holdSQL is daily_sales's query behind hold_gate(), which waits while the
// test holds advisory lock 4343.
const holdSQL = `SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1 HAVING public.hold_gate()`

const holdFunctionSQL = `
CREATE FUNCTION public.hold_gate() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(4343);
    RETURN true;
END $$`

// loadRawSQL and loadLedgerSQL write one event with its ledger row, as a
// load transaction does.
const (
	loadRawSQL = `
INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
VALUES ($1, $2, $3, jsonb_build_object('event_id', $1::text, 'amount', $4::numeric))`
	loadLedgerSQL = `
INSERT INTO tidemark.ingest_ledger (source, load_xid, bucket, rows, min_event_time, max_event_time, ingested_at)
VALUES ('app_events', pg_current_xact_id(), date_bin('1 hour', $1, timestamptz '2000-01-01 00:00:00+00'), 1, $1, $1, $2)`
)

// TestClaimWhilePartitionIsRebuilt: a load of a new event for 2026-10-05
// is in progress when an instance that does not hold the aggregate starts
// rebuilding that partition, so the rebuild cannot see it; the load
// commits, and the instance that holds the aggregate claims it while the
// rebuild is still running. The claim waits for that rebuild, which
// publishes the old rows and removes the queue row, then queues the
// partition again, and the partition is rebuilt with the new event. Were
// the claim to find the partition queued and move on, the rebuild in
// progress would delete the queue row and the event would never be
// counted.
func TestClaimWhilePartitionIsRebuilt(t *testing.T) {
	a := dailySales("correction")
	a.sql = holdSQL
	b := setup(t, 1, a)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := b.pool.Exec(ctx, holdFunctionSQL); err != nil {
		t.Fatal(err)
	}
	b.startIngest()
	b.ingestAt("2026-10-05 10:00", event(0, "e1", "2026-10-05T09:00:00Z", "5"))

	// The gate is closed: a rebuild that reaches it waits.
	gate, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Release()
	if _, err := gate.Exec(ctx, "SELECT pg_advisory_lock(4343)"); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = gate.Exec(context.Background(), "SELECT pg_advisory_unlock_all()") }()

	// The holder claims e1's partition and stops after its claim, holding
	// the aggregate.
	release := make(chan struct{})
	var once sync.Once
	releaseHolder := func() { once.Do(func() { close(release) }) }
	defer releaseHolder()
	claimed := make(chan struct{}, 1)
	holder := b.instance("holder", func(o *reconcile.Options) {
		o.AfterClaim = func(string) error {
			select {
			case claimed <- struct{}{}:
				<-release
			default:
			}
			return nil
		}
	})
	helper := b.instance("helper")
	if err := helper.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		rep reconcile.Report
		err error
	}
	holderDone, helperDone := make(chan outcome, 1), make(chan outcome, 1)
	go func() {
		rep, err := holder.RunOnce(ctx, "daily_sales", true)
		holderDone <- outcome{rep, err}
	}()
	<-claimed

	// A load of e2 begins; the helper picks the partition and its query
	// reads the rows without e2, then waits at the gate; the load commits.
	load, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = load.Rollback(context.Background()) }()
	if _, err := load.Exec(ctx, loadRawSQL, "e2", at("2026-10-05 10:30"), at("2026-10-05 11:00"), "7"); err != nil {
		t.Fatal(err)
	}
	if _, err := load.Exec(ctx, loadLedgerSQL, at("2026-10-05 10:30"), at("2026-10-05 11:00")); err != nil {
		t.Fatal(err)
	}
	go func() {
		rep, err := helper.Help(ctx, "daily_sales")
		helperDone <- outcome{rep, err}
	}()
	b.waitFor("the helper's rebuild waits at the gate", `SELECT count(*) > 0 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE a.application_name = 'helper' AND l.locktype = 'advisory' AND l.objid = 4343 AND NOT l.granted`)
	if err := load.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	releaseHolder()
	if o := <-holderDone; o.err != nil || len(o.rep.Rebuilt) != 0 || o.rep.Remaining != 1 {
		t.Fatalf("holder's first run: %+v %v, want nothing rebuilt and the partition queued (the helper has it)", o.rep, o.err)
	}

	// The holder claims e2 while the helper still rebuilds the partition.
	b.clock.Set(at("2026-10-05 11:01"))
	go func() {
		rep, err := holder.RunOnce(ctx, "daily_sales", true)
		holderDone <- outcome{rep, err}
	}()
	// The claim must wait for the rebuild in progress; a claim that does
	// not wait ends its run while the gate is still closed.
	var early *outcome
	b.waitFor("the claim waits for the rebuild in progress, or the run ends", `SELECT count(*) > 0 FROM pg_stat_activity
		WHERE application_name = 'holder' AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`, func() bool {
		select {
		case o := <-holderDone:
			early = &o
			return true
		default:
			return false
		}
	})
	if _, err := gate.Exec(ctx, "SELECT pg_advisory_unlock(4343)"); err != nil {
		t.Fatal(err)
	}
	// The partition the claim queued again is rebuilt once more, by
	// whichever instance picks it first: the helper, still going through
	// the queue, or the holder's run after its claim.
	h := <-helperDone
	if h.err != nil || (!slices.Equal(h.rep.Rebuilt, []string{"2026-10-05"}) && !slices.Equal(h.rep.Rebuilt, []string{"2026-10-05", "2026-10-05"})) {
		t.Fatalf("helper: %+v %v, want 2026-10-05 rebuilt beside the holder (and perhaps again after the claim)", h.rep, h.err)
	}
	if early != nil {
		t.Errorf("the claim did not wait for the rebuild in progress: %+v %v", early.rep, early.err)
	} else if o := <-holderDone; o.err != nil || o.rep.Read != 1 || len(h.rep.Rebuilt)-1+len(o.rep.Rebuilt) != 1 {
		t.Errorf("holder's second run: %+v %v (helper rebuilt %v), want e2's load read and 2026-10-05 rebuilt exactly once more",
			o.rep, o.err, h.rep.Rebuilt)
	}
	pgtest.Equal(t, "daily_sales", b.rows("SELECT sale_date::text, total::text, event_count FROM daily_sales"), []string{"2026-10-05 | 12.00 | 2"})
	pgtest.Equal(t, "queue", b.rows("SELECT count(*) FROM tidemark.pending_partitions"), []string{"0"})
}

// waitFor polls a boolean query until it is true, or until one of stop
// returns true, for up to waitfor.Timeout.
func (b *bundle) waitFor(what, sql string, stop ...func() bool) {
	b.t.Helper()
	err := waitfor.Poll(waitfor.Timeout, func() bool {
		var ok bool
		if err := b.pool.QueryRow(context.Background(), sql).Scan(&ok); err != nil {
			b.t.Fatalf("%s: %v", what, err)
		}
		return ok || slices.ContainsFunc(stop, func(f func() bool) bool { return f() })
	})
	if err != nil {
		b.t.Logf("sessions: %q", b.rows(`SELECT application_name, state, coalesce(wait_event_type, '-'), coalesce(wait_event, '-'), left(query, 60)
			FROM pg_stat_activity WHERE datname = current_database()`))
		b.t.Fatalf("%s: not within %s", what, waitfor.Timeout)
	}
}
