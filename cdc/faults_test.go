package cdc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// netFault is a network fault injected while changes stream: inject
// starts it, and the test goes on writing for a while before heal ends it.
type netFault struct {
	name   string
	inject func(p *faultproxy.Proxy, e *cdcEnv)
	heal   func(p *faultproxy.Proxy)
	// slow is set for a fault that only slows the network: the reader
	// must ride it out without restarting.
	slow bool
	// sourceOnly is set for a fault that only the source side gets.
	sourceOnly bool
}

// on adapts a proxy method to inject.
func on(f func(*faultproxy.Proxy)) func(*faultproxy.Proxy, *cdcEnv) {
	return func(p *faultproxy.Proxy, _ *cdcEnv) { f(p) }
}

// netFaults are the faults the reader is tested against.
var netFaults = []netFault{
	{name: "latency", inject: on(func(p *faultproxy.Proxy) { p.SetLatency(30 * time.Millisecond) }), heal: func(p *faultproxy.Proxy) { p.SetLatency(0) }, slow: true},
	{name: "stall then resume", inject: on((*faultproxy.Proxy).Stall), heal: (*faultproxy.Proxy).Resume},
	{name: "half-open", inject: on((*faultproxy.Proxy).HalfOpen), heal: func(*faultproxy.Proxy) {}},
	{name: "reset", inject: on((*faultproxy.Proxy).Reset), heal: func(*faultproxy.Proxy) {}},
	{name: "refuse then resume", inject: on(func(p *faultproxy.Proxy) { p.Refuse(); p.Reset() }), heal: (*faultproxy.Proxy).Resume},
	{name: "stall while starting", inject: stallWhileStarting, heal: (*faultproxy.Proxy).Resume, sourceOnly: true},
}

// stallWhileStarting resets every connection and stalls the network as
// soon as the reader, starting again, has connected to the source: its
// first query there, the source check's (held back by the proxy until
// the stall), goes into a black hole, as does everything after it while
// it checks the source and prepares its tables and its replication
// connection, before the stream's own bound of silence applies.
func stallWhileStarting(p *faultproxy.Proxy, e *cdcEnv) {
	e.t.Helper()
	p.Hold([]byte(cdc.CheckFirstSQL))
	p.Reset()
	select {
	case <-p.Held():
	case <-time.After(waitfor.Timeout):
		e.t.Fatalf("the reader, starting again, sent no query to the source within %s", waitfor.Timeout)
	}
	p.Stall()
	p.Release() // lost: the connection is a black hole now
}

// faultRecovery is how soon after a fault heals the reader must have
// caught up: the silence bound (the source's wal_sender_timeout, 2 s
// here), the 1 s client deadline and session limits, the connect timeout
// and the restart backoff, with room for a slow machine.
const faultRecovery = 30 * time.Second

// waitCaughtUp waits until, within faultRecovery of healed, the raw change
// table holds changes rows, the mirrors equal the source and the slot is
// confirmed past the last change.
func (e *cdcEnv) waitCaughtUp(healed time.Time, changes int) {
	e.t.Helper()
	if err := waitfor.Poll(time.Until(healed.Add(faultRecovery)), func() bool {
		return e.count("SELECT count(*) FROM raw.shop") >= int64(changes) && e.mirrored() &&
			e.confirmedPast("SELECT max(commit_lsn)::text FROM raw.shop")
	}); err != nil {
		e.t.Fatalf("not caught up %s after the fault healed: %d raw change rows of %d, mirrored %v, slot confirmed at %s",
			faultRecovery, e.count("SELECT count(*) FROM raw.shop"), changes, e.mirrored(), e.confirmed())
	}
}

// faultSettings make a stalled or silent connection short-lived on both
// ends: the source's walsender ends a session it does not hear from within
// 2 s, which the reader also takes as its bound of silence, and a
// connection attempt into a black hole gives up after 2 s.
const faultSettings = "&connect_timeout=2&options=-c%20wal_sender_timeout%3D2s"

// workload writes numbered source transactions of inserts, updates and
// hard deletes on both tracked tables, some of many rows, and records the
// changes each committed transaction made, as "op table key".
type workload struct {
	e       *cdcEnv
	mu      sync.Mutex
	n       int      // transactions committed
	changes []string // in commit order
}

// txn runs transaction i.
func (w *workload) txn(ctx context.Context, i int) error {
	var made []string
	err := pgx.BeginFunc(ctx, w.e.src, func(tx pgx.Tx) error {
		made = made[:0]
		exec := func(sql string, args ...any) error {
			_, err := tx.Exec(ctx, sql, args...)
			return err
		}
		// Four orders in one statement; every fifth transaction a
		// hundred more.
		rows := 4
		if i%5 == 4 {
			rows = 100
		}
		base := 1000 * i
		if err := exec(`INSERT INTO orders SELECT $1::bigint + g, $2, g * 1.25, timestamptz '2026-10-05 09:00+00' + g * interval '1 second'
			FROM generate_series(1, $3::int) AS g`, base, i, rows); err != nil {
			return err
		}
		for g := 1; g <= rows; g++ {
			made = append(made, fmt.Sprintf("insert public.orders %d", base+g))
		}
		if i >= 1 {
			// Two orders of the transaction before, in one statement.
			prev := 1000 * (i - 1)
			if err := exec(`UPDATE orders SET amount = amount + 1, customer_id = -customer_id WHERE id IN ($1, $2)`, prev+1, prev+2); err != nil {
				return err
			}
			made = append(made, fmt.Sprintf("update public.orders %d", prev+1), fmt.Sprintf("update public.orders %d", prev+2))
		}
		if i >= 2 {
			old := 1000*(i-2) + 3
			if err := exec(`DELETE FROM orders WHERE id = $1`, old); err != nil {
				return err
			}
			made = append(made, fmt.Sprintf("delete public.orders %d", old))
		}
		if err := exec(`INSERT INTO customers VALUES ($1, $2, 'free', '{"n": 1}', NULL)`, i, fmt.Sprintf("c%d", i)); err != nil {
			return err
		}
		made = append(made, fmt.Sprintf("insert public.customers %d", i))
		if i >= 1 {
			if err := exec(`UPDATE customers SET tier = 'pro', doc = jsonb_set(doc, '{n}', to_jsonb($2::int)) WHERE id = $1`, i-1, i); err != nil {
				return err
			}
			made = append(made, fmt.Sprintf("update public.customers %d", i-1))
		}
		if i >= 2 && i%2 == 0 {
			if err := exec(`DELETE FROM customers WHERE id = $1`, i-2); err != nil {
				return err
			}
			made = append(made, fmt.Sprintf("delete public.customers %d", i-2))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("source transaction %d: %w", i, err)
	}
	w.mu.Lock()
	w.n++
	w.changes = append(w.changes, made...)
	w.mu.Unlock()
	return nil
}

// run writes transactions, one every pause, until stop is closed, and
// reports the first error on the returned channel when it ends.
func (w *workload) run(ctx context.Context, stop <-chan struct{}, pause time.Duration) <-chan error {
	ended := make(chan error, 1)
	go func() {
		for {
			w.mu.Lock()
			i := w.n
			w.mu.Unlock()
			if err := w.txn(ctx, i); err != nil {
				ended <- err
				return
			}
			select {
			case <-stop:
				ended <- nil
				return
			case <-time.After(pause):
			}
		}
	}()
	return ended
}

// committed returns the number of transactions committed so far.
func (w *workload) committed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// waitCommitted waits until n more transactions than from have committed.
func (w *workload) waitCommitted(t *testing.T, from, n int) {
	t.Helper()
	waitfor.Until(t, fmt.Sprintf("%d more source transactions", n), func() bool { return w.committed() >= from+n })
}

// made returns the changes of the committed transactions.
func (w *workload) made() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.changes)
}

// TestCDCFaults streams a workload of inserts, updates and hard deletes
// while the connections to the source (the replication connection, the
// reader's source queries and its heartbeats) or to the warehouse (the
// group transactions, the slot's lock session, raw partition DDL) suffer
// each fault. Soon after the fault heals the mirrors equal the source row
// for row, the raw change table holds exactly one row per change the
// workload made, the slot is confirmed past the last of them, and once
// the reader stops no goroutine of it is left.
func TestCDCFaults(t *testing.T) {
	pgtest.ServerIndependent(t)
	for _, side := range []string{"source", "warehouse"} {
		for _, f := range netFaults {
			if f.sourceOnly && side != "source" {
				continue
			}
			t.Run(side+"/"+f.name, func(t *testing.T) {
				faulttest.CheckNoLeaks(t)
				started := time.Now()
				e := newCDCEnv(t)
				cfg := e.config("snapshot: never\nheartbeat_every: 1s", "deletes: hard")
				px, logs, done := e.startReader(t, cfg, side)
				e.waitStreaming(done)

				w := &workload{e: e}
				for i := 0; i < 5; i++ {
					if err := w.txn(e.ctx, i); err != nil {
						t.Fatal(err)
					}
				}
				e.waitMirrored("")
				before := e.confirmed()

				// Faults strike while transactions stream.
				stop := make(chan struct{})
				writing := w.run(e.ctx, stop, 50*time.Millisecond)
				w.waitCommitted(t, w.committed(), 5)
				f.inject(px, e)
				time.Sleep(3 * time.Second) // the fault's duration, not a wait
				f.heal(px)
				healed := time.Now()
				w.waitCommitted(t, w.committed(), 10)
				close(stop)
				if err := <-writing; err != nil {
					t.Fatal(err)
				}
				want := w.made()

				// Caught up: one raw row per change, the mirrors equal to the
				// source, the slot confirmed past the last change.
				e.waitCaughtUp(healed, len(want))
				t.Logf("%d transactions, %d changes; caught up %s after the fault healed; proxy %+v",
					w.n, len(want), time.Since(healed).Round(time.Millisecond), px.Stats())
				e.waitMirrored("")
				missing, extra := multisetDiff(want, pgtest.Rows(t, e.wh, `SELECT op || ' ' || source_table || ' ' || row_key FROM raw.shop`))
				if len(missing) > 0 || len(extra) > 0 {
					t.Errorf("raw change rows against the changes made: %d lost %q, %d doubled or unknown %q", len(missing), missing, len(extra), extra)
				}
				if n := e.count("SELECT count(DISTINCT event_id) FROM raw.shop"); n != int64(len(want)) {
					t.Errorf("%d distinct raw event ids, want %d", n, len(want))
				}
				if after := e.confirmed(); after == before {
					t.Errorf("the slot's confirmed position stayed at %s", before)
				}
				if restarts := strings.Count(logs.String(), "restarting"); f.slow && restarts > 0 {
					t.Errorf("a network that was only slow restarted the reader %d times", restarts)
				} else if !f.slow && restarts == 0 {
					t.Errorf("the fault did not make the reader reconnect: the test did not exercise it")
				}
				t.Logf("subtest ran %s before stopping", time.Since(started).Round(time.Millisecond))
			})
		}
	}
}

// mirrored reports whether both mirrors equal their source tables.
func (e *cdcEnv) mirrored() bool {
	e.t.Helper()
	for _, q := range []struct{ sql, src, dst string }{{customerRows, "customers", "mirror.customers"}, {orderRows, "orders", "mirror.orders"}} {
		want := pgtest.Rows(e.t, e.src, fmt.Sprintf(q.sql, q.src, ""))
		got := pgtest.Rows(e.t, e.wh, fmt.Sprintf(q.sql, q.dst, ""))
		if strings.Join(want, "\n") != strings.Join(got, "\n") {
			return false
		}
	}
	return true
}

// confirmedPast reports whether the slot is confirmed beyond the LSN that
// the warehouse query sql returns.
func (e *cdcEnv) confirmedPast(sql string) bool {
	e.t.Helper()
	var lsn *string
	if err := e.wh.QueryRow(e.ctx, sql).Scan(&lsn); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	if lsn == nil {
		return false
	}
	var past bool
	if err := e.src.QueryRow(e.ctx, "SELECT coalesce((SELECT confirmed_flush_lsn > $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'), false)", *lsn).Scan(&past); err != nil {
		e.t.Fatal(err)
	}
	return past
}

// multisetDiff returns the lines of want that got lacks and the lines of
// got beyond those of want, each as often as they differ.
func multisetDiff(want, got []string) (missing, extra []string) {
	n := map[string]int{}
	for _, l := range want {
		n[l]++
	}
	for _, l := range got {
		n[l]--
	}
	for l, c := range n {
		for ; c > 0; c-- {
			missing = append(missing, l)
		}
		for ; c < 0; c++ {
			extra = append(extra, l)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	return missing, extra
}

// setupRun is a reader setting up (creating its slot, copying the initial
// snapshot) behind a fault proxy, as a setupFault sees it.
type setupRun struct {
	t    *testing.T
	e    *cdcEnv
	px   *faultproxy.Proxy
	logs *syncbuf.Buffer
	// watch holds how long the reader has watched each walsender create
	// the slot.
	watch *creationWatch
	// healed is when the fault ended; zero for none.
	healed time.Time
}

// creationWatch records, per walsender, how long the reader's watch of a
// slot's creation has seen it creating the slot.
type creationWatch struct {
	mu     sync.Mutex
	waited map[int64]time.Duration
}

func (w *creationWatch) record(pid int64, waited time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waited[pid] = max(w.waited[pid], waited)
}

// waitWatched waits until the reader has watched walsender pid create
// the slot for at least d without giving the creation up.
func (run *setupRun) waitWatched(pid int64, d time.Duration) {
	run.t.Helper()
	waitfor.Until(run.t, fmt.Sprintf("the reader to watch walsender %d create the slot for %s", pid, d), func() bool {
		run.watch.mu.Lock()
		defer run.watch.mu.Unlock()
		return run.watch.waited[pid] >= d
	})
}

// setupFault is a fault injected while the reader sets up: strike waits
// for the moment it strikes at, injects it, heals it and sets
// run.healed.
type setupFault struct {
	name   string
	side   string // "source" or "warehouse": what the proxy is in front of
	strike func(run *setupRun)
	// restarts is set when the fault must restart the reader, and
	// recopies when the snapshot must then be copied again.
	restarts, recopies bool
	// logged are texts the reader must have logged.
	logged []string
}

// setupFaults are the faults the reader's setup is tested against.
var setupFaults = []setupFault{
	{name: "stall while copying the snapshot", side: "source", strike: stallWhileCopying, restarts: true, recopies: true},
	{name: "stall while copying the snapshot", side: "warehouse", strike: stallWhileCopying, restarts: true, recopies: true},
	{name: "stall while creating the slot", side: "source", strike: stallWhileCreatingSlot, restarts: true,
		logged: []string{"creating the replication slot waits for transactions open on the source", "no progress"}},
	{name: "slot creation waits for a transaction", side: "source", strike: waitWhileCreatingSlot,
		logged: []string{"creating the replication slot waits for transactions open on the source"}},
}

// snapshotRows is how many orders the source holds before the reader
// starts: 50 snapshot chunks of 1000 rows, keys apart from the workload's.
const snapshotRows = 50000

// stallWhileCopying slows the network until a few snapshot chunks are
// copied, so that the copy lasts, then stalls it until the reader gives
// the copy up: the chunks under way must end within write_timeout, and the
// snapshot must be taken again, whole, with a new slot.
func stallWhileCopying(run *setupRun) {
	run.t.Helper()
	run.px.SetLatency(5 * time.Millisecond)
	waitfor.Until(run.t, "the snapshot to copy three chunks", func() bool {
		return run.e.metric("tidemark_cdc_snapshot_chunks_copied") >= 3
	})
	if n := run.e.count("SELECT count(*) FROM tidemark.cdc_positions WHERE snapshot = 'done'"); n != 0 {
		run.t.Fatal("the snapshot was done before the stall: the test did not exercise it")
	}
	restarts := strings.Count(run.logs.String(), "restarting")
	run.px.Stall()
	stalled := time.Now()
	waitfor.Within(run.t, 30*time.Second, "the reader to give the stalled copy up", func() bool {
		return strings.Count(run.logs.String(), "restarting") > restarts
	})
	run.t.Logf("the copy was given up %s after the stall (%d restarts before it)", time.Since(stalled).Round(time.Millisecond), restarts)
	run.px.SetLatency(0)
	run.px.Resume()
	run.healed = time.Now()
}

// holdTransaction opens a transaction on the source that has a
// transaction id, which a slot's creation waits for, and returns its
// backend's pid and the function that commits it.
func holdTransaction(run *setupRun) (pid int64, commit func()) {
	run.t.Helper()
	conn, err := run.e.src.Acquire(run.e.ctx)
	if err != nil {
		run.t.Fatal(err)
	}
	tx, err := conn.Begin(run.e.ctx)
	if err != nil {
		conn.Release()
		run.t.Fatal(err)
	}
	if err := tx.QueryRow(run.e.ctx, "INSERT INTO untracked (note) VALUES ('held') RETURNING pg_backend_pid()").Scan(&pid); err != nil {
		conn.Release()
		run.t.Fatal(err)
	}
	var once sync.Once
	commit = func() {
		once.Do(func() {
			defer conn.Release()
			if err := tx.Commit(run.e.ctx); err != nil {
				run.t.Fatal(err)
			}
		})
	}
	run.t.Cleanup(commit)
	return pid, commit
}

// creatingWalsender waits until a walsender of the reader, other than
// those of not, waits for a lock (for a transaction, in
// CREATE_REPLICATION_SLOT), and returns its pid.
func creatingWalsender(run *setupRun, not ...int64) int64 {
	run.t.Helper()
	var pid int64
	waitfor.Until(run.t, "a walsender of the reader to wait to create the slot", func() bool {
		var pids []int64
		if err := run.e.src.QueryRow(run.e.ctx, `SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
			WHERE application_name = 'tidemark-cdc' AND backend_type = 'walsender' AND wait_event_type = 'Lock'`).Scan(&pids); err != nil {
			run.t.Fatal(err)
		}
		for _, p := range pids {
			if !slices.Contains(not, p) {
				pid = p
				return true
			}
		}
		return false
	})
	return pid
}

// alive reports whether a backend of pid runs on the source.
func alive(run *setupRun, pid int64) bool {
	run.t.Helper()
	var n int64
	if err := run.e.src.QueryRow(run.e.ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
		run.t.Fatal(err)
	}
	return n > 0
}

// waitLogged waits up to d until the reader has logged text.
func waitLogged(run *setupRun, text string, d time.Duration) {
	run.t.Helper()
	waitfor.Within(run.t, d, fmt.Sprintf("the reader to log %q", text), func() bool {
		return strings.Contains(run.logs.String(), text)
	})
}

// stallWhileCreatingSlot holds a transaction open on the source so that
// creating the slot waits for it, lets the creation wait longer than
// write_timeout (a legitimate wait must not fail), then stalls the
// network: the creation must end within write_timeout. After the stall
// heals, the next start ends the walsender left waiting at the server,
// so that it cannot finish a slot nobody reads, and waits for the
// transaction again; once it commits, the reader snapshots and streams.
func stallWhileCreatingSlot(run *setupRun) {
	run.t.Helper()
	_, commit := holdTransaction(run)
	first := creatingWalsender(run)
	run.waitWatched(first, 1500*time.Millisecond) // longer than write_timeout
	if strings.Contains(run.logs.String(), "restarting") {
		run.t.Fatalf("a slot creation waiting for a transaction was given up:\n%s", run.logs.String())
	}
	run.px.Stall()
	stalled := time.Now()
	waitLogged(run, "restarting", 10*time.Second)
	run.t.Logf("the slot's creation ended %s after the stall", time.Since(stalled).Round(time.Millisecond))
	if !alive(run, first) {
		run.t.Fatal("the walsender that was creating the slot ended by itself: the test does not show that the reader ends it")
	}
	time.Sleep(time.Second) // the rest of the stall, not a wait
	run.px.Resume()
	run.healed = time.Now()
	second := creatingWalsender(run, first)
	waitfor.Within(run.t, 10*time.Second, fmt.Sprintf("the walsender %d left creating the slot to be ended", first), func() bool {
		return !alive(run, first)
	})
	run.t.Logf("walsender %d, left creating the slot, was ended; %d creates it now", first, second)
	commit()
}

// waitWhileCreatingSlot holds a transaction open on the source for more
// than twice write_timeout while the slot's creation waits for it, then
// commits it: the watched creation succeeds, with no restart.
func waitWhileCreatingSlot(run *setupRun) {
	run.t.Helper()
	holder, commit := holdTransaction(run)
	run.waitWatched(creatingWalsender(run), 2500*time.Millisecond) // more than twice write_timeout
	commit()
	waitLogged(run, fmt.Sprintf("oldest_pid=%d", holder), 10*time.Second)
}

// TestCDCSetupFaults runs the reader's setup with snapshot: initial,
// creating the slot and copying a table of 50 chunks, behind each
// setupFault. Soon after the fault heals the reader streams; the mirrors
// then equal the source, the raw change table holds exactly one row per
// change made after the snapshot, and once the reader stops no goroutine
// of it is left.
func TestCDCSetupFaults(t *testing.T) {
	pgtest.ServerIndependent(t)
	for _, f := range setupFaults {
		t.Run(f.side+"/"+f.name, func(t *testing.T) {
			faulttest.CheckNoLeaks(t)
			started := time.Now()
			e := newCDCEnv(t)
			e.exec(fmt.Sprintf(`INSERT INTO orders SELECT 10000000 + i, i %% 100, i %% 997, timestamptz '2026-10-01 00:00+00' + i * interval '1 second'
				FROM generate_series(1, %d) AS i; ANALYZE orders`, snapshotRows))
			cfg := e.config("snapshot: initial\nsnapshot_workers: 2\nsnapshot_chunk_rows: 1000\nheartbeat_every: 1s", "deletes: hard")
			watch := &creationWatch{waited: map[int64]time.Duration{}}
			opts := cdc.Options{GroupAge: 20 * time.Millisecond}
			cdc.SetOnSlotCreationWatched(&opts, watch.record)
			px, logs, done := e.startReaderWith(t, cfg, f.side, time.Second, opts)

			run := &setupRun{t: t, e: e, px: px, logs: logs, watch: watch}
			f.strike(run)
			if run.healed.IsZero() {
				run.healed = time.Now()
			}
			e.waitStreaming(done)
			t.Logf("streaming %s after the fault healed", time.Since(run.healed).Round(time.Millisecond))

			w := &workload{e: e}
			for i := range 5 {
				if err := w.txn(e.ctx, i); err != nil {
					t.Fatal(err)
				}
			}
			want := w.made()
			e.waitCaughtUp(run.healed, len(want))
			t.Logf("caught up %s after the fault healed; proxy %+v", time.Since(run.healed).Round(time.Millisecond), px.Stats())
			missing, extra := multisetDiff(want, pgtest.Rows(t, e.wh, `SELECT op || ' ' || source_table || ' ' || row_key FROM raw.shop`))
			if len(missing) > 0 || len(extra) > 0 {
				t.Errorf("raw change rows against the changes made: %d lost %q, %d doubled or unknown %q", len(missing), missing, len(extra), extra)
			}
			if n := e.count("SELECT count(*) FROM mirror.orders WHERE id > 10000000"); n != snapshotRows {
				t.Errorf("%d snapshot rows mirrored, want %d", n, snapshotRows)
			}
			restarts := strings.Count(logs.String(), "restarting")
			if f.restarts && restarts == 0 {
				t.Errorf("the fault did not make the reader restart: the test did not exercise it")
			} else if !f.restarts && restarts > 0 {
				t.Errorf("the reader restarted %d times", restarts)
			}
			if copied := e.metric("tidemark_cdc_snapshot_rows_total"); f.recopies != (copied > snapshotRows) {
				t.Errorf("%v rows copied by snapshots: want %d in one attempt, or more when the snapshot is taken again (%v)", copied, snapshotRows, f.recopies)
			}
			for _, text := range f.logged {
				if !strings.Contains(logs.String(), text) {
					t.Errorf("the reader did not log %q", text)
				}
			}
			var slots int64
			if err := e.src.QueryRow(e.ctx, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&slots); err != nil {
				t.Fatal(err)
			}
			if slots != 1 {
				t.Errorf("%d replication slots in the source database, want 1", slots)
			}
			t.Logf("subtest ran %s before stopping", time.Since(started).Round(time.Millisecond))
		})
	}
}

// startReader puts the side ("source" or "warehouse") of cfg's
// connections behind a fault proxy, sets the short limits of these tests,
// and runs a reader on a pool of its own until the test ends, when it
// must stop within 45 s and without an error. It returns the proxy, the
// reader's log, and the channel on which Run returns.
func (e *cdcEnv) startReader(t *testing.T, cfg *config.Config, side string) (*faultproxy.Proxy, *syncbuf.Buffer, chan error) {
	t.Helper()
	return e.startReaderWith(t, cfg, side, time.Second, cdc.Options{GroupAge: 20 * time.Millisecond})
}

// startReaderWith is startReader with the warehouse's write_timeout and
// the reader's options; side "" puts no proxy in front of either database.
// Each of before is called with the proxy before the reader starts.
func (e *cdcEnv) startReaderWith(t *testing.T, cfg *config.Config, side string, write time.Duration, opts cdc.Options, before ...func(*faultproxy.Proxy)) (*faultproxy.Proxy, *syncbuf.Buffer, chan error) {
	t.Helper()
	srcDSN, whDSN := e.srcDSN+faultSettings, e.whDSN+"&connect_timeout=2"
	var px *faultproxy.Proxy
	switch side {
	case "source":
		srcDSN, px = faulttest.Front(t, srcDSN)
	case "warehouse":
		whDSN, px = faulttest.Front(t, whDSN)
	}
	cfg.Sources["shop"].CDC.DSN = srcDSN
	cfg.Warehouse.DSN = whDSN
	cfg.Warehouse.WriteTimeout = config.Duration(write)
	idle := config.Duration(time.Second)
	cfg.Warehouse.IdleInTransactionSessionTimeout = idle
	pool, err := pgconnect.Pool(e.ctx, cfg.Warehouse.Settings(), "tidemark-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, logs), nil))
	opts.Logger, opts.Registerer = log, e.reg
	r, err := cdc.New(shopConfig(t, cfg), pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range before {
		f(px)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		stopping := time.Now()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("reader: %v", err)
			}
			t.Logf("the reader stopped in %s", time.Since(stopping).Round(time.Millisecond))
		case <-time.After(45 * time.Second):
			t.Errorf("the reader did not stop within 45s")
		}
	})
	return px, logs, done
}

// TestSourceLostWhileDescribing: the connection to the source reset while
// the reader describes a source table at start (the mirror's column query
// held back by the proxy until then) is a lost connection, retried like
// any other, not a setup the reader cannot use: the reader restarts and
// streams, and Run does not end.
func TestSourceLostWhileDescribing(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	px, logs, done := e.startReaderWith(t, e.config("snapshot: never", "deletes: hard"), "source", time.Second,
		cdc.Options{GroupAge: 20 * time.Millisecond}, func(px *faultproxy.Proxy) {
			px.Hold([]byte("AND NOT a.attisdropped"))
		})
	select {
	case <-px.Held():
	case err := <-done:
		done <- err // for the cleanup that waits for the reader
		t.Fatalf("the reader stopped before it described the table: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the reader did not describe the source table within a minute")
	}
	px.Reset()
	px.Release()
	e.waitStreaming(done)
	if !strings.Contains(logs.String(), "mirror shop: read source columns") {
		t.Errorf("the reader did not restart after losing the source while describing its table:\n%s", logs.String())
	}
	e.exec(`INSERT INTO orders VALUES (1, 1, 1, '2026-10-05 09:00+00')`)
	waitfor.Until(t, "the insert to be mirrored", func() bool { return e.count("SELECT count(*) FROM mirror.orders") == 1 })
}

// TestWaitingGroupStaysAlive: a group that waits for a commit slot (two
// groups commit at once) holds its warehouse transaction open. With each
// group's mirror statements made to take 2.5 s by a trigger, the group
// third in line waits longer than the warehouse's
// idle_in_transaction_session_timeout (1 s); the reader keeps that
// transaction busy meanwhile, so the server does not end it and the
// reader does not restart.
func TestWaitingGroupStaysAlive(t *testing.T) {
	e := newCDCEnv(t)
	_, logs, done := e.startReaderWith(t, withTriggers(e.config("snapshot: never", "deletes: hard")), "", 10*time.Second,
		cdc.Options{GroupChanges: 1, GroupAge: time.Second})
	e.waitStreaming(done)
	if _, err := e.wh.Exec(e.ctx, `CREATE FUNCTION slow_apply() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_sleep(2.5);
		RETURN NULL;
	END $$;
	CREATE TRIGGER slow_apply BEFORE INSERT ON mirror.orders FOR EACH STATEMENT EXECUTE FUNCTION slow_apply()`); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		e.exec(`INSERT INTO orders VALUES ($1, 1, 1, '2026-10-05 09:00+00')`, i)
	}
	e.waitMirrored("")
	if n := strings.Count(logs.String(), "restarting"); n > 0 {
		t.Errorf("the reader restarted %d times:\n%s", n, logs.String())
	}
}
