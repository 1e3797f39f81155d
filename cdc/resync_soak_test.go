package cdc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
)

// The variables that size TestResyncSoak: unset, the run of `make test`
// (20,000 rows); make soak-resync sets 1,000,000 rows.
const (
	// envSoakRows is the rows of the orders table the test resyncs.
	envSoakRows = "TIDEMARK_RESYNC_SOAK_ROWS"
	// envSoakChunkRows is cdc.resync_chunk_rows; default a tenth of
	// the rows (at least 1,000), so that the kill falls in the middle
	// of the copy, and at most the configuration's default, 10,000.
	envSoakChunkRows = "TIDEMARK_RESYNC_SOAK_CHUNK_ROWS"
	// envSoakRate is the workload's transactions a second on orders
	// (default 200), each of four statements: an update, a delete, an
	// insert and a key change.
	envSoakRate = "TIDEMARK_RESYNC_SOAK_RATE"
)

// soakFeedRate is how many rows a second are inserted into customers, the
// table whose lag TestResyncSoak measures, each in a transaction of its
// own.
const soakFeedRate = 50

// soakPhase is the part of TestResyncSoak a feed transaction was committed
// in.
type soakPhase int32

const (
	phaseBefore    soakPhase = iota // the workload running, no resync
	phaseCopy                       // the resync copying, the first reader
	phaseRestarted                  // the resync copying: the rows not yet applied at the reader's kill, and those after
	phaseAfter                      // the resync done
	phases
)

func (p soakPhase) String() string {
	return [...]string{"before the resync", "during the copy", "after the kill (the reader down, then catching up)", "after the resync"}[p]
}

// TestResyncSoak is the acceptance of a resync under load: a table of
// TIDEMARK_RESYNC_SOAK_ROWS rows (20,000; make soak-resync: 1,000,000),
// its mirror made wrong, is resynced while a steady workload updates,
// inserts, deletes and changes keys in it, and the reader is killed once
// half its chunks are applied and started again. Meanwhile another table
// of the source, customers, gets a row every 20 ms. The mirror of orders
// ends md5-equal to the source, the rows the source never had removed;
// the other table's lag (from a source commit to its row visible in the
// mirror) is logged for each phase, and during the copy its maximum must
// stay below half of the copy's time (or 10 s): the stream is never held
// for most of the copy.
func TestResyncSoak(t *testing.T) {
	rows := envInt(t, envSoakRows, 20_000)
	if testing.Short() && os.Getenv(envSoakRows) == "" {
		t.Skip("the resync soak runs without -short (make soak-resync: 1,000,000 rows)")
	}
	if pgtest.OnCitus() {
		t.Skip("the resync soak runs on a server of its own, not on Citus")
	}
	chunkRows := envInt(t, envSoakChunkRows, min(10000, max(1000, rows/10)))
	rate := envInt(t, envSoakRate, 200)
	limit := max(waitfor.Timeout, time.Duration(rows/1000)*time.Second)

	// A durable server of its own, as in production, with room for the
	// table between checkpoints.
	srv := pgtest.NewServer(t, pgserver.Options{Durable: true, Settings: map[string]string{
		"shared_buffers": "512MB", "max_wal_size": "4GB", "checkpoint_timeout": "15min"}})
	e := newCDCEnvOn(t, srv)
	e.exec(fmt.Sprintf(`INSERT INTO orders SELECT %d + i, i %% 100, i %% 997, timestamptz '2026-10-01 00:00+00' + i * interval '1 second'
		FROM generate_series(1, %d) AS i; ANALYZE orders`, resyncBase, rows))
	cfg := e.config(fmt.Sprintf("snapshot: initial\nresync_chunk_rows: %d", chunkRows), "deletes: hard")
	done, cancel := e.run(cfg, cdc.Options{})
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	})
	waitfor.Within(t, limit, "the initial snapshot", func() bool {
		return e.count(`SELECT count(*) FROM tidemark.cdc_positions WHERE snapshot = 'done'`) == 1
	})
	e.waitStreaming(done)
	e.waitDigests(limit)
	stale := breakMirror(t, e)

	var phase atomic.Int32
	stop := make(chan struct{})
	load := steadyChurn(e.ctx, e, rows, rate, stop)
	feed := startLagFeed(t, e, &phase, stop)
	stopped := false
	stopLoad := func() {
		if stopped {
			return
		}
		stopped = true
		close(stop)
		if err := <-load.ended; err != nil {
			t.Error(err)
		}
		if err := feed.wait(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(stopLoad)

	// The lag without a resync, under the same workload: a few seconds of
	// the feed's transactions.
	waitfor.Within(t, limit, "the feed's transactions before the resync", func() bool {
		return feed.sentIn(t, phaseBefore) >= 3*soakFeedRate
	})
	phase.Store(int32(phaseCopy))
	if r, asked, err := cdc.RequestResync(e.ctx, e.wh, "shop", "public.orders", "test", time.Now()); err != nil || !asked {
		t.Fatalf("RequestResync: %+v asked %v, %v", r, asked, err)
	}
	// Rows the workload changed while their chunk was read are left to
	// the stream and not counted as copied: the chunks are.
	half := int64(max(1, rows/chunkRows/2))
	waitfor.Within(t, limit, "half of the chunks to be applied", func() bool {
		return resyncState(t, e).Chunks >= half
	})
	// The kill: the reader's run is cancelled where it is, a warehouse
	// transaction under way abandoned.
	phase.Store(int32(phaseRestarted))
	feed.killed()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("reader: %v", err)
	}
	killed := resyncState(t, e)
	if killed.State == "done" {
		t.Fatalf("the resync ended before the kill: %+v", killed)
	}
	done, cancel = e.run(cfg, cdc.Options{})
	waitfor.Within(t, limit, "the resync to end", func() bool {
		return resyncState(t, e).State == "done"
	})
	phase.Store(int32(phaseAfter))
	waitfor.Within(t, limit, "the feed's transactions after the resync", func() bool {
		return feed.sentIn(t, phaseAfter) >= soakFeedRate
	})
	stopLoad()
	e.waitDigests(limit)

	got := resyncState(t, e)
	if got.Removed != stale {
		t.Errorf("the resync removed %d rows, want the %d the source never had", got.Removed, stale)
	}
	if n := e.count(`SELECT count(*) FROM tidemark.cdc_resync_keys`); n != 0 {
		t.Errorf("%d resync keys left after the resync ended", n)
	}
	copyTime := got.FinishedAt.Sub(*got.StartedAt)
	t.Logf("resync of %d rows in chunks of %d, killed with %d chunks applied: copied in %s (the kill and restart included), %.0f rows/s; %d rows copied, %d removed",
		rows, chunkRows, killed.Chunks, copyTime.Round(time.Millisecond), float64(rows)/copyTime.Seconds(), got.Rows, got.Removed)
	t.Logf("workload on orders: %.0f transactions/s (%d asked for), about %.0f row changes/s", load.rate(), rate, 4*load.rate())
	lags := feed.lags()
	for p := range phases {
		l := lags[p]
		if len(l) == 0 {
			t.Errorf("no feed transactions %s", p)
			continue
		}
		t.Logf("customers lag %s: %d transactions, p50 %s, p95 %s, max %s", p, len(l),
			percentile(l, 0.50).Round(time.Millisecond), percentile(l, 0.95).Round(time.Millisecond), l[len(l)-1].Round(time.Millisecond))
	}
	// The stream applies the other table's rows between the chunks, so
	// their lag is bounded by a chunk's time, not the copy's: it must
	// stay below half the copy (and 10 s, which a busy machine may take
	// on a short copy).
	if l := lags[phaseCopy]; len(l) > 0 && l[len(l)-1] > max(copyTime/2, 10*time.Second) {
		t.Errorf("the other table's lag reached %s during a copy of %s: the stream held its changes for most of the copy", l[len(l)-1], copyTime)
	}
}

// newCDCEnvOn is newCDCEnv on a server of the test's own.
func newCDCEnvOn(t *testing.T, srv *pgserver.Server) *cdcEnv {
	t.Helper()
	e := &cdcEnv{t: t, ctx: context.Background(), reg: prometheus.NewRegistry()}
	e.srcDSN, e.whDSN = pgtest.NewDatabaseOn(t, srv), pgtest.NewDatabaseOn(t, srv)
	e.src, e.wh, e.readers = pgtest.Pool(t, e.srcDSN), pgtest.Pool(t, e.whDSN), pgtest.Pool(t, e.whDSN)
	if _, err := migrate.Up(e.ctx, e.whDSN, nil); err != nil {
		t.Fatal(err)
	}
	e.exec(shopDDL)
	return e
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// digestSQL renders a table as its row count and the md5 of its rows in
// key order, the same way on both sides.
var digestSQL = map[string]string{
	"orders":    `SELECT count(*), coalesce(md5(string_agg(ROW(id, customer_id, amount, placed_at)::text, E'\n' ORDER BY id)), '') FROM %s`,
	"customers": `SELECT count(*), coalesce(md5(string_agg(ROW(id, name, tier, doc, md5(big))::text, E'\n' ORDER BY id)), '') FROM %s`,
}

// waitDigests waits until both mirrors are md5-equal to their source
// tables.
func (e *cdcEnv) waitDigests(limit time.Duration) {
	e.t.Helper()
	var diff string
	if err := waitfor.Poll(limit, func() bool {
		diff = ""
		for table, sql := range digestSQL {
			var n, m int64
			var want, got string
			if err := e.src.QueryRow(e.ctx, fmt.Sprintf(sql, table)).Scan(&n, &want); err != nil {
				e.t.Fatal(err)
			}
			if err := e.wh.QueryRow(e.ctx, fmt.Sprintf(sql, "mirror."+table)).Scan(&m, &got); err != nil {
				e.t.Fatal(err)
			}
			if want != got {
				diff += fmt.Sprintf("; %s: source %d rows (md5 %s), mirror %d rows (md5 %s)", table, n, want, m, got)
			}
		}
		return diff == ""
	}); err != nil {
		e.t.Fatalf("the mirrors were not md5-equal to their tables within %s%s", limit, diff)
	}
}

// churnLoad is the workload steadyChurn runs.
type churnLoad struct {
	ended   <-chan error
	txns    atomic.Int64
	started time.Time
	took    atomic.Int64 // nanoseconds, once ended
}

// rate is the workload's transactions a second.
func (l *churnLoad) rate() float64 {
	return float64(l.txns.Load()) / time.Duration(l.took.Load()).Seconds()
}

// steadyChurn runs, perSecond times a second until stop is closed, a
// transaction on orders (a table of rows rows from resyncBase) that
// updates a row, deletes one, inserts one and changes the key of one,
// over the whole key range, as pgbench runs a script at a fixed rate. A
// transaction that takes longer than its turn delays the next: the rate
// achieved is what rate reports.
func steadyChurn(ctx context.Context, e *cdcEnv, rows, perSecond int, stop <-chan struct{}) *churnLoad {
	ended := make(chan error, 1)
	l := &churnLoad{ended: ended, started: time.Now()}
	go func() {
		defer func() { l.took.Store(int64(time.Since(l.started))) }()
		rng := rand.New(rand.NewPCG(3, 4))
		next := int64(resyncBase + rows + 1)
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		for {
			select {
			case <-stop:
				ended <- nil
				return
			case <-tick.C: // the workload's pace, not a wait
			}
			id := func() int64 { return resyncBase + 1 + rng.Int64N(next-resyncBase-1) }
			err := pgx.BeginFunc(ctx, e.src, func(tx pgx.Tx) error {
				for _, st := range []struct {
					sql string
					arg int64
				}{
					{`UPDATE orders SET amount = amount + 1 WHERE id = $1`, id()},
					{`DELETE FROM orders WHERE id = $1`, id()},
					{`INSERT INTO orders VALUES ($1, 7, 1.00, '2026-10-05 09:00+00') ON CONFLICT DO NOTHING`, next},
					{`UPDATE orders SET id = id + 50000000 WHERE id = $1 AND id < 50000000`, id()},
				} {
					if _, err := tx.Exec(ctx, st.sql, st.arg); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				ended <- fmt.Errorf("workload: %w", err)
				return
			}
			l.txns.Add(1)
			next++
		}
	}()
	return l
}

// lagFeed inserts a row into customers soakFeedRate times a second, each
// in a transaction of its own, and watches the mirror for them: the lag
// of a row is the time from its COMMIT returning at the source to the
// first look that finds it in the mirror.
type lagFeed struct {
	mu     sync.Mutex
	sent   []feedRow
	seen   []seenMax
	killAt time.Time // when the reader was killed
	wg     sync.WaitGroup
	err    error
}

type feedRow struct {
	id    int64
	at    time.Time
	phase soakPhase
}

// seenMax is one look at the mirror: the largest id it held then.
type seenMax struct {
	id int64
	at time.Time
}

// startLagFeed starts the feed and its watcher, which run until stop is
// closed; phase is the part of the test each row is committed in.
func startLagFeed(t *testing.T, e *cdcEnv, phase *atomic.Int32, stop <-chan struct{}) *lagFeed {
	t.Helper()
	f := &lagFeed{}
	ctx := e.ctx
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		tick := time.NewTicker(time.Second / soakFeedRate)
		defer tick.Stop()
		for id := int64(1); ; id++ {
			select {
			case <-stop:
				return
			case <-tick.C: // the feed's pace, not a wait
			}
			p := soakPhase(phase.Load())
			if _, err := e.src.Exec(ctx, `INSERT INTO customers (id, name) VALUES ($1::bigint, 'feed ' || $1::bigint)`, id); err != nil {
				f.mu.Lock()
				f.err = fmt.Errorf("feed: %w", err)
				f.mu.Unlock()
				return
			}
			f.mu.Lock()
			f.sent = append(f.sent, feedRow{id: id, at: time.Now(), phase: p})
			f.mu.Unlock()
		}
	}()
	go func() {
		defer f.wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C: // how often the lag is sampled, not a wait
			}
			var m int64
			if err := e.wh.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM mirror.customers`).Scan(&m); err == nil {
				f.mu.Lock()
				f.seen = append(f.seen, seenMax{m, time.Now()})
				f.mu.Unlock()
			}
		}
	}()
	return f
}

// sentIn counts the rows committed in phase p; a feed that failed fails
// the test.
func (f *lagFeed) sentIn(t *testing.T, p soakPhase) int {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		t.Fatal(f.err)
	}
	n := 0
	for _, s := range f.sent {
		if s.phase == p {
			n++
		}
	}
	return n
}

// killed notes that the reader is being killed: the rows of the copy
// not in the mirror yet are then counted after the kill.
func (f *lagFeed) killed() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.killAt = time.Now()
}

// wait waits for the feed and its watcher to stop, once stop is closed,
// and returns the feed's error.
func (f *lagFeed) wait() error {
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// lags returns the lags of the rows the watcher saw, sorted, by phase.
// Rows committed after the watcher's last look are left out.
func (f *lagFeed) lags() [phases][]time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [phases][]time.Duration
	j := 0
	for _, s := range f.sent {
		for j < len(f.seen) && (f.seen[j].id < s.id || f.seen[j].at.Before(s.at)) {
			j++
		}
		if j == len(f.seen) {
			break
		}
		p := s.phase
		if p == phaseCopy && !f.killAt.IsZero() && f.seen[j].at.After(f.killAt) {
			p = phaseRestarted
		}
		out[p] = append(out[p], f.seen[j].at.Sub(s.at))
	}
	for p := range out {
		slices.Sort(out[p])
	}
	return out
}

// percentile returns the q-quantile of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
