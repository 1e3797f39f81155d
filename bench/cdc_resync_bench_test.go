package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// resyncTable is the table BenchmarkResync copies again, as tidemark
// names it.
const resyncTable = "public.src_customers"

// feedInFlight is how many of the other table's transactions the feed
// of BenchmarkResync keeps written and not yet applied.
const feedInFlight = 30

// BenchmarkResync measures `tidemark resync` of the poll benchmark's
// 1M-row table against the initial snapshot of the same table, fsync on.
// One CDC source streams that table, src_customers, and BenchmarkCDC's
// orders, each into its mirror:
//
//	(a) a reader's first start on the source, a new slot: the initial
//	    snapshot (BenchmarkCDCSnapshot's (b)), until recorded done;
//	(b) the same reader, streaming, asked to resync src_customers: from
//	    the resync's start to its end as tidemark.cdc_resyncs records
//	    them, every row read again in chunks of cdc.resync_chunk_rows
//	    between two marks and applied by the stream into the full mirror,
//	    with a raw change row each;
//	(c) the stream's apply rate of the other table's changes without a
//	    resync: BenchmarkCDC's workload written to orders in transactions
//	    of 1,000 changes, as fast as the reader applies them (at most
//	    feedInFlight written and not yet applied), for as long as (b)
//	    took, at least 10 s;
//	(d) the same while a second resync of src_customers runs, from its
//	    start to its end, and that resync's own rate.
//
// It reports the medians over TIDEMARK_BENCH_ROUNDS rounds (3), each on a
// fresh warehouse and slot, of (b)/(a) and (d)/(c); (c) and (d) alternate
// which goes first. TIDEMARK_BENCH_RESYNC_CHUNK_ROWS sets
// cdc.resync_chunk_rows (default: the configuration's).
func BenchmarkResync(b *testing.B) {
	rows := size("TIDEMARK_BENCH_RESYNC_ROWS", pollRows, pollRows/10)
	rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
	chunkRows := envInt("TIDEMARK_BENCH_RESYNC_CHUNK_ROWS", 0)
	for range b.N {
		e, srcDSN, src := pollSource(b, rows)
		if _, err := src.Exec(context.Background(), cdcSourceDDL); err != nil {
			b.Fatal(err)
		}
		var copyRatios, applyRatios []float64
		var chunk int
		for r := range rounds {
			other := meterCPU()
			rd := startResyncRound(b, e, srcDSN, src, rows, chunkRows)
			chunk = rd.chunkRows
			quiesce(b, e.srv)
			prof := startProfile(b, e.srv, dbName(b, srcDSN), dbName(b, rd.whDSN))
			quiet := rd.resync(b, nil)
			prof.report(b, "(b) tidemark resync, no other changes")

			var idle, busy feedRate
			var loaded resyncRun
			measureIdle := func() {
				quiesce(b, e.srv)
				idle = rd.feed.run(b, rd.rr, rd.wh, nil, max(10*time.Second, quiet.took))
			}
			measureBusy := func() {
				quiesce(b, e.srv)
				loaded = rd.resync(b, rd.feed)
				busy = loaded.feed
			}
			if r%2 == 0 {
				measureIdle()
				measureBusy()
			} else {
				measureBusy()
				measureIdle()
			}
			rd.finish(b, src)

			snapRate, quietRate := float64(rows)/rd.snapshot.Seconds(), float64(rows)/quiet.took.Seconds()
			copyRatios = append(copyRatios, quietRate/snapRate)
			applyRatios = append(applyRatios, busy.rate()/idle.rate())
			fmt.Fprintf(os.Stderr, `
resync, %d rows of about 150 bytes, cdc.resync_chunk_rows %d, fsync on, round %d:
  (a) initial snapshot, a new slot                 %8.0f rows/s     (%s)
  (b) resync, no other changes                     %8.0f rows/s     (%s; %s from the request)   (b)/(a) = %.2f
  (c) the other table's changes, no resync          %8.0f changes/s  (%d in %s)
  (d) the same during a resync                      %8.0f changes/s  (%d in %s)   (d)/(c) = %.2f
      that resync                                  %8.0f rows/s     (%s)
  other load during the round: %.2f cores
`, rows, rd.chunkRows, r+1, snapRate, rd.snapshot.Round(time.Millisecond),
				quietRate, quiet.took.Round(time.Millisecond), quiet.wall.Round(time.Millisecond), quietRate/snapRate,
				idle.rate(), idle.changes, idle.took.Round(time.Millisecond),
				busy.rate(), busy.changes, busy.took.Round(time.Millisecond), busy.rate()/idle.rate(),
				float64(rows)/loaded.took.Seconds(), loaded.took.Round(time.Millisecond), other.otherCores())
		}
		copyRatio, applyRatio := medianOf(copyRatios), medianOf(applyRatios)
		b.ReportMetric(copyRatio, "resync/snapshot")
		b.ReportMetric(applyRatio, "apply_during/apply_without")
		fmt.Fprintf(os.Stderr, "  medians over %d rounds, %d rows, chunks of %d: (b)/(a) = %.2f, (d)/(c) = %.2f\n",
			rounds, rows, chunk, copyRatio, applyRatio)
	}
}

// resyncRound is one round of BenchmarkResync: a fresh warehouse, and a
// reader streaming both tables into it from a new slot.
type resyncRound struct {
	whDSN     string
	wh        *pgxpool.Pool
	rr        *runningReader
	rows      int
	chunkRows int
	snapshot  time.Duration // (a)
	feed      *feeder
	resyncs   int
}

// startResyncRound empties orders, starts a reader on a fresh warehouse
// with a new slot, and measures its initial snapshot (a).
func startResyncRound(b *testing.B, e *env, srcDSN string, src *pgxpool.Pool, rows, chunkRows int) *resyncRound {
	b.Helper()
	ctx := context.Background()
	// Before the slot exists: not streamed.
	if _, err := src.Exec(ctx, `TRUNCATE orders`); err != nil {
		b.Fatal(err)
	}
	whDSN := e.freshDatabase(b)
	wh, cfg := cdcWarehouse(b, whDSN, srcDSN, "src_customers, orders", "{schema: public}")
	if chunkRows > 0 {
		cfg.Sources["shop"].CDC.ResyncChunkRows = chunkRows
	}
	rd := &resyncRound{whDSN: whDSN, wh: wh, rows: rows, chunkRows: cfg.Sources["shop"].CDC.ResyncChunkRows,
		feed: &feeder{src: src}}
	prof := startProfile(b, e.srv, dbName(b, srcDSN), dbName(b, whDSN))
	started := time.Now()
	rd.rr = startReader(b, cfg, wh)
	rd.rr.waitFor(b, wh, "the initial snapshot to finish", 20*time.Minute,
		`SELECT snapshot = 'done' FROM tidemark.cdc_positions WHERE source = 'shop'`)
	rd.snapshot = time.Since(started)
	prof.report(b, "(a) tidemark's CDC snapshot")
	if n := rd.mirrored(b); n != int64(rows) {
		b.Fatalf("the snapshot left %d rows in the mirror, want %d", n, rows)
	}
	return rd
}

// resyncRun is what one resync of BenchmarkResync measured.
type resyncRun struct {
	took time.Duration // from its start to its end, as recorded
	wall time.Duration // from the request to its end being seen
	feed feedRate      // the other table's changes meanwhile, when fed
}

// resync asks for a resync of src_customers and waits until it is done,
// feeding the other table meanwhile when f is not nil.
func (rd *resyncRound) resync(b *testing.B, f *feeder) resyncRun {
	b.Helper()
	ctx := context.Background()
	requested := time.Now()
	r, asked, err := cdc.RequestResync(ctx, rd.wh, "shop", resyncTable, "bench", requested)
	if err != nil || !asked {
		b.Fatalf("request the resync: %+v asked %v, %v", r, asked, err)
	}
	rd.resyncs++
	const limit = 20 * time.Minute
	state := func() string {
		r, _, err := cdc.LastResync(ctx, rd.wh, "shop", resyncTable)
		if err != nil {
			b.Fatal(err)
		}
		return r.State
	}
	var run resyncRun
	if f == nil {
		rd.rr.waitFor(b, rd.wh, "the resync to end", limit,
			`SELECT state = 'done' FROM tidemark.cdc_resyncs WHERE source = 'shop' AND source_table = $1`, resyncTable)
	} else {
		// The feed is measured from the moment the copy is seen under
		// way to the moment it is seen done.
		run.feed = f.run(b, rd.rr, rd.wh, func() (started, ended bool) {
			s := state()
			return s == "copying" || s == "done", s == "done"
		}, limit)
	}
	run.wall = time.Since(requested)
	r, _, err = cdc.LastResync(ctx, rd.wh, "shop", resyncTable)
	if err != nil {
		b.Fatal(err)
	}
	if r.State != "done" || r.StartedAt == nil || r.FinishedAt == nil {
		b.Fatalf("resync not done: %+v", r)
	}
	if r.Rows != int64(rd.rows) || r.Removed != 0 {
		b.Fatalf("the resync copied %d rows and removed %d, want %d and none", r.Rows, r.Removed, rd.rows)
	}
	run.took = r.FinishedAt.Sub(*r.StartedAt)
	return run
}

// mirrored counts the rows of the mirror of src_customers.
func (rd *resyncRound) mirrored(b *testing.B) int64 {
	b.Helper()
	var n int64
	if err := rd.wh.QueryRow(context.Background(), `SELECT count(*) FROM public.src_customers WHERE deleted_at IS NULL`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// finish checks what the round left in the warehouse, stops the reader
// and drops its slot, so that the next round's reader starts afresh.
func (rd *resyncRound) finish(b *testing.B, src *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	if n := rd.mirrored(b); n != int64(rd.rows) {
		b.Fatalf("the mirror of src_customers holds %d rows, want %d", n, rd.rows)
	}
	var snapshots int64
	if err := rd.wh.QueryRow(ctx, `SELECT count(*) FROM raw.shop WHERE op = 'snapshot'`).Scan(&snapshots); err != nil {
		b.Fatal(err)
	}
	if want := int64(rd.resyncs * rd.rows); snapshots != want {
		b.Fatalf("%d raw change rows of op snapshot, want %d", snapshots, want)
	}
	// The feed waited for a position inside its last transaction, which
	// a chunk's mark written meanwhile may have carried applied_lsn past
	// before that transaction's commit was applied.
	var want int64
	if err := src.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&want); err != nil {
		b.Fatal(err)
	}
	rd.rr.waitFor(b, rd.wh, fmt.Sprintf("the mirror of orders to hold the source's %d rows", want), time.Minute,
		`SELECT count(*) = $1 FROM public.orders WHERE deleted_at IS NULL`, want)
	rd.rr.stop(b)
	// The walsender of the reader just stopped may hold the slot a moment
	// longer.
	waitfor.Until(b, "the reader's walsender to free the slot", func() bool {
		var active bool
		if err := src.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'`).Scan(&active); err != nil {
			b.Fatal(err)
		}
		return !active
	})
	if _, err := src.Exec(ctx, `SELECT pg_drop_replication_slot('tidemark_shop')`); err != nil {
		b.Fatal(err)
	}
	rd.wh.Close()
}

// feeder writes BenchmarkCDC's workload to orders, one transaction of
// cdcTxnChanges changes after another, as fast as the reader applies
// them: at most feedInFlight transactions written and not yet applied.
type feeder struct {
	src  *pgxpool.Pool
	lsns []pglogrepl.LSN // a position inside each transaction written
}

// feedRate is how many of the fed changes the reader applied in a time.
type feedRate struct {
	changes int64
	took    time.Duration
}

func (f feedRate) rate() float64 { return float64(f.changes) / f.took.Seconds() }

// run feeds orders and returns the rate at which the reader applied the
// changes: with window nil, over d; otherwise from the first moment
// window reports started to the first it reports ended, within d. It
// then waits until every transaction written is applied.
func (f *feeder) run(b *testing.B, rr *runningReader, wh *pgxpool.Pool, window func() (started, ended bool), d time.Duration) feedRate {
	b.Helper()
	ctx := context.Background()
	if window == nil {
		end := time.Now().Add(d)
		window = func() (bool, bool) { return true, !time.Now().Before(end) }
	}
	var (
		from, to time.Time
		at0      int
	)
	deadline := time.Now().Add(d)
	for {
		started, ended := window()
		if started && from.IsZero() {
			from, at0 = time.Now(), f.applied(b, wh)
		}
		if ended {
			to = time.Now()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("fed the other table for %s: the window did not end", d)
		}
		if n := len(f.lsns); n >= feedInFlight {
			rr.waitApplied(b, wh, f.lsns[n-feedInFlight].String(), 10*time.Minute)
		}
		end, err := writeCDCTxn(ctx, f.src, len(f.lsns))
		if err != nil {
			b.Fatal(err)
		}
		lsn, err := pglogrepl.ParseLSN(end)
		if err != nil {
			b.Fatal(err)
		}
		f.lsns = append(f.lsns, lsn)
	}
	applied := f.applied(b, wh) - at0
	if len(f.lsns) > 0 {
		rr.waitApplied(b, wh, f.lsns[len(f.lsns)-1].String(), 10*time.Minute)
	}
	return feedRate{changes: int64(applied) * cdcTxnChanges, took: to.Sub(from)}
}

// applied returns how many of the transactions written the reader has
// applied.
func (f *feeder) applied(b *testing.B, wh *pgxpool.Pool) int {
	b.Helper()
	var text string
	if err := wh.QueryRow(context.Background(), `SELECT applied_lsn::text FROM tidemark.cdc_positions WHERE source = 'shop'`).Scan(&text); err != nil {
		b.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(text)
	if err != nil {
		b.Fatal(err)
	}
	return sort.Search(len(f.lsns), func(i int) bool { return f.lsns[i] > lsn })
}

// quiesce checkpoints srv and waits until no autovacuum worker runs, so
// that neither falls into the measurement that follows.
func quiesce(b *testing.B, srv *pgserver.Server) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
	waitNoAutovacuum(b, srv)
}
