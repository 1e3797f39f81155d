package reconcile_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// TestWorkedExample is acceptance item 1: the worked example's daily_sales
// through Kafka, with the service clock at the example's ingestion times.
func TestWorkedExample(t *testing.T) {
	b := setup(t, 1, dailySales("correction"))
	b.startIngest()
	r, _ := b.reconciler()

	b.ingestAt("2026-10-04 22:01", event(0, "e1", "2026-10-04T22:00:00Z", "10"))
	b.runOnce(r, "daily_sales")
	b.ingestAt("2026-10-05 08:00", event(0, "e2", "2026-10-05T08:00:00Z", "20"))
	rep := b.runOnce(r, "daily_sales")
	pgtest.Equal(t, "rebuilt after e2", rep.Rebuilt, []string{"2026-10-05"})

	// e3 happened on the 4th and arrived on the 5th: only the 4th is
	// rebuilt.
	b.ingestAt("2026-10-05 09:15", event(0, "e3", "2026-10-04T23:30:00Z", "5"))
	rep = b.runOnce(r, "daily_sales")
	pgtest.Equal(t, "rebuilt after e3", rep.Rebuilt, []string{"2026-10-04"})

	want := []string{"2026-10-04 | 15.00 | 2", "2026-10-05 | 20.00 | 1"}
	pgtest.Equal(t, "daily_sales", b.rows("SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1"), want)
	status := "SELECT partition_key, rows, rebuilds, to_char(rebuilt_at, 'YYYY-MM-DD HH24:MI') FROM tidemark.partitions ORDER BY 1"
	pgtest.Equal(t, "partition status", b.rows(status), []string{"2026-10-04 | 1 | 2 | 2026-10-05 09:15", "2026-10-05 | 1 | 1 | 2026-10-05 08:00"})

	// Running again changes nothing.
	b.clock.Set(at("2026-10-05 10:00"))
	rep = b.runOnce(r, "daily_sales")
	if len(rep.Rebuilt) != 0 || rep.Queued != 0 || rep.Remaining != 0 {
		t.Errorf("second run did work: %+v", rep)
	}
	pgtest.Equal(t, "daily_sales after a second run", b.rows("SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1"), want)
	pgtest.Equal(t, "partition status after a second run", b.rows(status), []string{"2026-10-04 | 1 | 2 | 2026-10-05 09:15", "2026-10-05 | 1 | 1 | 2026-10-05 08:00"})
}

// writeLikeIngester writes one sale the way an ingest transaction does (a
// raw row and a ledger row carrying the transaction's id), in tx.
func writeLikeIngester(t *testing.T, tx pgx.Tx, id, eventTime, ingestedAt string, amount int) {
	t.Helper()
	ctx := context.Background()
	et, ia := at(eventTime), at(ingestedAt)
	if _, err := tx.Exec(ctx, `INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
		VALUES ($1, $2, $3, jsonb_build_object('event_id', $1::text, 'amount', $4::int))`, id, et, ia, amount); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO tidemark.ingest_ledger (source, load_xid, bucket, rows, min_event_time, max_event_time, ingested_at)
		VALUES ('app_events', pg_current_xact_id(), date_bin('1 hour', $1::timestamptz, timestamptz '2000-01-01 00:00:00+00'), 1, $1, $1, $2)`, et, ia); err != nil {
		t.Fatal(err)
	}
}

// TestCommitLag is acceptance item 2, the timestamp watermark's blind
// spot. Load transaction A stamps its row 10:10 and stays open. B1, which
// started before A, commits a row stamped 10:15, and B2, which started
// after A, commits one stamped 10:16; a run then reconciles B1. A timestamp
// watermark would now stand past 10:15 and never read A's row, and an
// upper bound taken from the newest transaction id (snapshot xmax) would
// step over A as well. The exact load watermark is held back by A (B2
// waits too), and the first run after A commits reflects A, with no
// lookback configured.
func TestCommitLag(t *testing.T) {
	b := setup(t, 1, dailySales("correction"))
	b.startIngest()
	r, _ := b.reconciler()
	b.ingestAt("2026-10-05 10:00", event(0, "e1", "2026-10-05T09:00:00Z", "1"))
	b.runOnce(r, "daily_sales")

	ctx := context.Background()
	begin := func() pgx.Tx {
		t.Helper()
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		return tx
	}
	txB1 := begin()
	writeLikeIngester(t, txB1, "b1", "2026-10-05 09:30", "2026-10-05 10:15", 2)
	txA := begin()
	writeLikeIngester(t, txA, "a", "2026-10-05 09:10", "2026-10-05 10:10", 4)
	txB2 := begin()
	writeLikeIngester(t, txB2, "b2", "2026-10-05 09:40", "2026-10-05 10:16", 8)
	for _, tx := range []pgx.Tx{txB1, txB2} {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}

	b.clock.Set(at("2026-10-05 10:20"))
	b.runOnce(r, "daily_sales")
	daily := "SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1"
	// The rebuild that B1 triggered reads every committed row, B2's too.
	pgtest.Equal(t, "while A is open", b.rows(daily), []string{"2026-10-05 | 11.00 | 3"})

	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(at("2026-10-05 10:40"))
	rep := b.runOnce(r, "daily_sales")
	pgtest.Equal(t, "rebuilt after A commits", rep.Rebuilt, []string{"2026-10-05"})
	pgtest.Equal(t, "after A commits", b.rows(daily), []string{"2026-10-05 | 15.00 | 4"})
}

// TestLatenessHorizon is acceptance item 3: a late event inside the
// horizon rebuilds only its own partition; beyond the horizon each policy
// does what it documents.
func TestLatenessHorizon(t *testing.T) {
	withPolicy := func(policy string) aggregateYAML {
		a := dailySales(policy)
		a.name, a.table = "sales_"+policy, "sales_"+policy
		return a
	}
	b := setup(t, 1, withPolicy("correction"), withPolicy("arrival"), withPolicy("rebuild"))
	b.startIngest()
	r, reg := b.reconciler()
	runAll := func() map[string][]string {
		t.Helper()
		out := map[string][]string{}
		for _, name := range r.Aggregates() {
			out[name] = b.runOnce(r, name).Rebuilt
		}
		return out
	}
	// One sale a day, each ingested a minute after it happened.
	for d, day := range []string{"01", "02", "03", "04", "05"} {
		b.ingestAt("2026-10-"+day+" 12:01", event(0, "on-time-"+day, "2026-10-"+day+"T12:00:00Z", fmt.Sprint(d+1)))
		runAll()
	}
	rebuiltAt := func(name string) []string {
		return b.rows("SELECT partition_key || ' ' || to_char(rebuilt_at, 'MM-DD HH24:MI') FROM tidemark.partitions WHERE aggregate = $1 ORDER BY 1", name)
	}
	before := map[string][]string{}
	for _, name := range r.Aggregates() {
		before[name] = rebuiltAt(name)
	}

	// Inside the horizon: 3 October ended 34 hours before this arrives.
	b.ingestAt("2026-10-05 10:00", event(0, "late-inside", "2026-10-03T18:00:00Z", "100"))
	for name, rebuilt := range runAll() {
		pgtest.Equal(t, name+" rebuilt for a late event inside the horizon", rebuilt, []string{"2026-10-03"})
		after := rebuiltAt(name)
		for i := range after {
			if after[i] != before[name][i] && !strings.HasPrefix(after[i], "2026-10-03 ") {
				t.Errorf("%s: partition %s was rebuilt too", name, after[i])
			}
		}
	}

	// Beyond the horizon: 1 October ended 84 hours before these arrive,
	// in two loads of different ingestion times that one run reads.
	b.ingestAt("2026-10-05 12:00", event(0, "late-beyond", "2026-10-01T20:00:00Z", "1000"))
	b.ingestAt("2026-10-05 12:30", event(0, "late-beyond-2", "2026-10-01T21:00:00Z", "2000"))
	rebuilt := runAll()
	pgtest.Equal(t, "correction rebuilt", rebuilt["sales_correction"], nil)
	pgtest.Equal(t, "arrival rebuilt", rebuilt["sales_arrival"], []string{"2026-10-05"})
	pgtest.Equal(t, "rebuild rebuilt", rebuilt["sales_rebuild"], []string{"2026-10-01"})

	sales := func(name string) []string {
		return b.rows(fmt.Sprintf("SELECT sale_date::text, total::text, event_count FROM %s ORDER BY 1", name))
	}
	base := []string{"2026-10-01 | 1.00 | 1", "2026-10-02 | 2.00 | 1", "2026-10-03 | 103.00 | 2", "2026-10-04 | 4.00 | 1", "2026-10-05 | 5.00 | 1"}
	pgtest.Equal(t, "correction", sales("sales_correction"), base)
	arrival := append([]string(nil), base...)
	arrival[4] = "2026-10-05 | 3005.00 | 3"
	pgtest.Equal(t, "arrival", sales("sales_arrival"), arrival)
	rebuildAll := append([]string(nil), base...)
	rebuildAll[0] = "2026-10-01 | 3001.00 | 3"
	pgtest.Equal(t, "rebuild", sales("sales_rebuild"), rebuildAll)

	// The correction and arrival policies record the events with their rows.
	pgtest.Equal(t, "corrections", b.rows(`SELECT aggregate, policy, event_key, to_char(event_partition_start, 'MM-DD'),
		to_char(arrival_partition_start, 'MM-DD'), event->>'event_id' FROM tidemark.corrections ORDER BY 1, 3`),
		[]string{"sales_arrival | arrival | late-beyond-2|2026-10-01 21:00:00+00 | 10-01 | 10-05 | late-beyond-2",
			"sales_arrival | arrival | late-beyond|2026-10-01 20:00:00+00 | 10-01 | 10-05 | late-beyond",
			"sales_correction | correction | late-beyond-2|2026-10-01 21:00:00+00 | 10-01 | 10-05 | late-beyond-2",
			"sales_correction | correction | late-beyond|2026-10-01 20:00:00+00 | 10-01 | 10-05 | late-beyond"})
	for _, policy := range []string{"correction", "arrival", "rebuild"} {
		want := 2.0
		if policy == "rebuild" {
			want = 0
		}
		if got := gauge(t, reg, "tidemark_reconcile_beyond_horizon_events_total", "sales_"+policy); got != want {
			t.Errorf("beyond-horizon events of sales_%s = %v, want %v", policy, got, want)
		}
	}

	// A rebuild of the final partition gives the same answer as the
	// incremental runs: the horizon uses stored columns only.
	b.clock.Set(at("2026-10-20 00:00"))
	for _, name := range r.Aggregates() {
		if _, err := b.pool.Exec(context.Background(), `INSERT INTO tidemark.pending_partitions (aggregate, partition_start, partition_end, reason, queued_at)
			SELECT aggregate, partition_start, partition_end, 'test', now() FROM tidemark.partitions WHERE aggregate = $1`, name); err != nil {
			t.Fatal(err)
		}
		b.runOnce(r, name)
	}
	pgtest.Equal(t, "correction after a full rebuild", sales("sales_correction"), base)
	pgtest.Equal(t, "arrival after a full rebuild", sales("sales_arrival"), arrival)
	pgtest.Equal(t, "rebuild after a full rebuild", sales("sales_rebuild"), rebuildAll)
	pgtest.Equal(t, "states once every horizon has passed", b.rows("SELECT DISTINCT state FROM tidemark.partitions"), []string{"final"})
}

// gauge reads one series of a counter or gauge whose first label is the
// aggregate.
func gauge(t *testing.T, reg *prometheus.Registry, name, aggregate string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "aggregate" && l.GetValue() == aggregate {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

// TestTimeZones is acceptance item 5: an aggregate partitioned by day in
// America/New_York puts events on both sides of each daylight-saving
// change into the right days.
func TestTimeZones(t *testing.T) {
	a := dailySales("correction")
	a.zone = "America/New_York"
	a.horizon = "720h"
	b := setup(t, 1, a)
	b.startIngest()
	r, _ := b.reconciler()
	events := []struct{ id, at string }{
		{"spring-1", "2026-03-08T04:59:00Z"}, // 7 March 23:59 EST
		{"spring-2", "2026-03-08T05:00:00Z"}, // 8 March 00:00 EST
		{"spring-3", "2026-03-08T07:30:00Z"}, // 8 March 03:30 EDT, after the gap
		{"spring-4", "2026-03-09T03:59:00Z"}, // 8 March 23:59 EDT
		{"spring-5", "2026-03-09T04:00:00Z"}, // 9 March 00:00 EDT
		{"fall-1", "2026-11-01T03:59:00Z"},   // 31 October 23:59 EDT
		{"fall-2", "2026-11-01T04:00:00Z"},   // 1 November 00:00 EDT
		{"fall-3", "2026-11-01T05:30:00Z"},   // 1 November 01:30 EDT
		{"fall-4", "2026-11-01T06:30:00Z"},   // 1 November 01:30 EST, the hour again
		{"fall-5", "2026-11-02T04:59:00Z"},   // 1 November 23:59 EST
		{"fall-6", "2026-11-02T05:00:00Z"},   // 2 November 00:00 EST
	}
	var spring, fall []*kgo.Record
	for _, e := range events {
		if strings.HasPrefix(e.id, "spring") {
			spring = append(spring, event(0, e.id, e.at, "1"))
		} else {
			fall = append(fall, event(0, e.id, e.at, "1"))
		}
	}
	b.ingestAt("2026-03-10 00:00", spring...)
	b.runOnce(r, "daily_sales")
	b.ingestAt("2026-11-03 00:00", fall...)
	b.runOnce(r, "daily_sales")
	pgtest.Equal(t, "daily_sales in New York days", b.rows("SELECT sale_date::text, event_count FROM daily_sales ORDER BY 1"),
		[]string{"2026-03-07 | 1", "2026-03-08 | 3", "2026-03-09 | 1", "2026-10-31 | 1", "2026-11-01 | 4", "2026-11-02 | 1"})
	pgtest.Equal(t, "partition lengths", b.rows(`SELECT partition_key, (partition_end - partition_start)::text
		FROM tidemark.partitions WHERE partition_key IN ('2026-03-08', '2026-11-01') ORDER BY 1`),
		[]string{"2026-03-08 | 23:00:00", "2026-11-01 | 1 day 01:00:00"})
}

// TestTwoReconcilers is acceptance item 6: two reconcilers started at once
// on one aggregate; one works while the other waits (or, on a periodic
// tick, stands by), and the result is exact.
func TestTwoReconcilers(t *testing.T) {
	b := setup(t, 2, dailySales("correction"))
	b.startIngest()
	release := make(chan struct{})
	var once sync.Once
	releaseAll := func() { once.Do(func() { close(release) }) }
	defer releaseAll() // a failure must not leave a run holding a connection
	claimed := make(chan struct{}, 2)
	hold := func(o *reconcile.Options) {
		o.AfterClaim = func(string) error {
			claimed <- struct{}{}
			<-release
			return nil
		}
	}
	first, _ := b.reconciler(hold)
	second, _ := b.reconciler(hold)
	standby, _ := b.reconciler()
	var recs []*kgo.Record
	for i := 0; i < 40; i++ {
		recs = append(recs, event(int32(i%2), fmt.Sprintf("e%d", i), fmt.Sprintf("2026-10-0%dT%02d:00:00Z", 2+i%4, i%24), "1"))
	}
	b.ingestAt("2026-10-05 23:59", recs...)

	type outcome struct {
		rep reconcile.Report
		err error
	}
	results := make(chan outcome, 2)
	for _, r := range []*reconcile.Reconciler{first, second} {
		go func() {
			rep, err := r.RunOnce(context.Background(), "daily_sales", true)
			results <- outcome{rep, err}
		}()
	}
	<-claimed // one of them holds the aggregate
	select {
	case <-claimed:
		t.Fatal("both reconcilers claimed the aggregate at once")
	case o := <-results:
		t.Fatalf("a reconciler finished while the other held the aggregate: %+v %v", o.rep, o.err)
	case <-time.After(500 * time.Millisecond):
	}
	// A periodic run stands by instead of waiting.
	rep, err := standby.RunOnce(context.Background(), "daily_sales", false)
	if err != nil || !rep.Busy {
		t.Errorf("periodic run while the aggregate is held: %+v %v", rep, err)
	}
	releaseAll()
	var total int
	for i := 0; i < 2; i++ {
		o := <-results
		if o.err != nil {
			t.Fatal(o.err)
		}
		total += len(o.rep.Rebuilt)
	}
	if total != 4 {
		t.Errorf("%d partitions rebuilt in all, want 4 (each once)", total)
	}
	pgtest.Equal(t, "daily_sales", b.rows("SELECT sale_date::text, event_count FROM daily_sales ORDER BY 1"),
		[]string{"2026-10-02 | 10", "2026-10-03 | 10", "2026-10-04 | 10", "2026-10-05 | 10"})
}
