package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// envSoak selects the size of TestSoak: unset, the bounded run of `make
// test`; "full", the run of `make soak`.
const envSoak = "TIDEMARK_SOAK"

// soakScale is the size of a soak run.
type soakScale struct {
	days, stepsPerDay, eventsPerStep, kills int
}

// TestSoak runs `tidemark run` on a time-compressed service clock through
// at least 120 simulated days: a Kafka stream with realistic lateness (most
// events on time, a tail hours and days late, some beyond the horizon and
// some beyond the raw retention), producer duplicates and bad messages,
// plus a poll source and a CDC source with inserts, updates and hard
// deletes, under short retention, with SIGKILLs and restarts along the way.
// It prints, per simulated fortnight, the rows and size of every state
// table, and requires at the end that
//
//   - every state table is as large on day 120 as on day 60 (within 10%);
//   - every aggregate partition holds what the stream's events give it
//     under its policy, archived ones included (they kept their values),
//     and `tidemark verify` finds no drift;
//   - the raw rows retained are exactly the distinct events produced for
//     those days, and the dead letters retained exactly the bad messages
//     of the dead-letter retention;
//   - the mirrors equal their sources.
//
// The poll and CDC sources' raw rows carry the source's real clock as
// event time, which the compressed service clock overtakes at once: their
// partitions are dropped and made again as changes arrive.
func TestSoak(t *testing.T) {
	sc := soakScale{days: 120, stepsPerDay: 4, eventsPerStep: 150, kills: 5}
	switch {
	case os.Getenv(envSoak) == "full":
		sc = soakScale{days: 180, stepsPerDay: 6, eventsPerStep: 400, kills: 12}
	case testing.Short():
		sc.eventsPerStep = 50
	}
	s := newSoak(t, sc)
	s.run()
	s.check()
}

// soakEvent is one good event as produced.
type soakEvent struct {
	id         string
	eventTime  time.Time
	ingestedAt time.Time
	amount     int // cents
	user       int
}

type soak struct {
	t          *testing.T
	sc         soakScale
	ctx        context.Context
	wh, src    *pgxpool.Pool
	cfg        string
	clockFile  string
	start      time.Time
	now        time.Time
	producer   *kgo.Client
	end        map[int32]int64
	rng        *rand.Rand
	events     map[string]soakEvent
	bad        []time.Time // ingestion times of bad messages
	dups       int
	proc       *process
	kills      int
	sizes      map[int]map[string][2]int64 // day -> table -> rows, bytes
	nextOrder  int
	nextCustID int
}

func newSoak(t *testing.T, sc soakScale) *soak {
	ctx := context.Background()
	// A server of its own, whose autovacuum wakes every second: months of
	// the service pass in minutes, and the server's upkeep must keep pace
	// as it would over the months.
	srv := pgtest.NewServer(t, pgserver.Options{Settings: map[string]string{"autovacuum_naptime": "1s"}})
	whDSN, srcDSN := pgtest.NewDatabaseOn(t, srv), pgtest.NewDatabaseOn(t, srv)
	wh, src := pgtest.Pool(t, whDSN), pgtest.Pool(t, srcDSN)
	if _, err := src.Exec(ctx, `
CREATE TABLE customers (customer_id int PRIMARY KEY, email text NOT NULL, tier text NOT NULL, updated_at timestamptz NOT NULL);
INSERT INTO customers SELECT i, 'c' || i || '@example.com', 'free', clock_timestamp() FROM generate_series(1, 200) AS i;
CREATE TABLE orders (order_id int PRIMARY KEY, customer_id int NOT NULL, amount numeric(12,2) NOT NULL, status text NOT NULL);
INSERT INTO orders SELECT i, i % 200 + 1, i, 'new' FROM generate_series(1, 200) AS i`); err != nil {
		t.Fatal(err)
	}
	kc := kafkatest.NewCluster(t, 2, "events")
	kafkatest.ExpireSilentMembers(t, kc)
	s := &soak{t: t, sc: sc, ctx: ctx, wh: wh, src: src, end: map[int32]int64{}, events: map[string]soakEvent{},
		rng:       rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)),
		producer:  kafkatest.Producer(t, kc, kgo.RecordPartitioner(kgo.RoundRobinPartitioner())),
		clockFile: filepath.Join(t.TempDir(), "clock"), sizes: map[int]map[string][2]int64{},
		nextOrder: 200, nextCustID: 200}
	// The service clock starts the day after today: the sources' own
	// clocks are behind it from the start.
	s.start = time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, 1)
	s.cfg = writeFile(t, "soak.yaml", fmt.Sprintf(`
warehouse: {dsn: %[1]q}
http: {listen: "off"}
log: {level: warn}
kafka: {brokers: [%[2]q], group: soak, session_timeout: 1s}
ingest: {batch_max_age: 20ms}
reconcile: {every: 1s}
retention: {every: 1s, ledger: 7d, corrections: 14d, arrivals: 14d, runs: 14d}
sources:
  events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
    max_age: 60d
    retention: {raw: 21d, dead_letters: 7d}
  customers:
    poll: {dsn: %[3]q, table: customers, key: [customer_id], updated_at: updated_at, every: 1s}
    # The soak deletes a row a step on purpose.
    mirror: {table: dw_customers, deletes: soft, key_reconcile_every: 1d, key_reconcile_max_delete: 100%%}
    raw_partition: day
    retention: {raw: 21d}
  shop:
    cdc: {dsn: %[3]q, tables: [orders], status_every: 200ms}
    mirror: {table: dw_orders, deletes: hard}
    raw_partition: day
    retention: {raw: 21d}
%[4]s`, whDSN, kc.ListenAddrs()[0], srcDSN, aggregatesYAML(soakAggregates...)))
	return s
}

// setClock moves the service clock of the process (and of commands run
// in this test process) to at.
func (s *soak) setClock(at time.Time) {
	s.now = at
	tmp := s.clockFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(at.Format(time.RFC3339Nano)), 0o600); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, s.clockFile); err != nil {
		s.t.Fatal(err)
	}
	serviceClock = func() time.Time { return at }
}

func (s *soak) startService() {
	s.proc = startWith(s.t, []string{envClockFile + "=" + s.clockFile}, "run", "-c", s.cfg)
}

func (s *soak) run() {
	old := serviceClock
	s.t.Cleanup(func() { serviceClock = old })
	steps := s.sc.days * s.sc.stepsPerDay
	killAt := map[int]bool{}
	for len(killAt) < s.sc.kills {
		killAt[1+s.rng.IntN(steps-2)] = true
	}
	s.setClock(s.start)
	s.startService()
	stepLen := 24 * time.Hour / time.Duration(s.sc.stepsPerDay)
	began := time.Now()
	for step := 0; step < steps; step++ {
		s.setClock(s.start.Add(time.Duration(step) * stepLen))
		s.produce()
		s.changeSources()
		if killAt[step] {
			// Kill it while it loads, reconciles and prunes; the next one
			// resumes from what the warehouse holds.
			time.Sleep(time.Duration(s.rng.IntN(300)) * time.Millisecond) // the random moment of the kill, not a wait
			if err := s.proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				s.t.Fatal(err)
			}
			<-s.proc.exited
			s.kills++
			s.startService()
		}
		ingesttest.WaitStored(s.t, s.wh, "soak", "events", s.end, 2*time.Minute)
		// The service prunes every retention.every of real time, which
		// here spans days of its clock; prune at the pace of the clock too,
		// as every hour or so would at real speed.
		s.prune(false)
		if day := (step + 1) / s.sc.stepsPerDay; (step+1)%s.sc.stepsPerDay == 0 && (day%14 == 0 || day == 60 || day == 120 || day == s.sc.days) {
			s.settle()
			s.measure(day)
		}
	}
	s.t.Logf("%d simulated days in %s: %d events (%d duplicates sent again), %d bad messages, %d kills",
		s.sc.days, time.Since(began).Round(time.Second), len(s.events), s.dups, len(s.bad), s.kills)
	s.settle()
	s.waitSources()
	if err := s.proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-s.proc.exited:
	case <-time.After(time.Minute):
		s.t.Fatalf("tidemark run did not stop within a minute of SIGTERM:\n%s", s.proc.output.String())
	}
}

// produce sends one step's events: most on time, a tail hours and days
// late, a few beyond the horizon and the raw retention; some sent twice;
// and bad messages.
func (s *soak) produce() {
	var recs []*kgo.Record
	for i := 0; i < s.sc.eventsPerStep; i++ {
		// The shares are exact in every step, the delays within them
		// random, so that the tables retention keeps hold the same number
		// of rows from one day to the next.
		var late time.Duration
		switch x := (float64(i) + 0.5) / float64(s.sc.eventsPerStep); {
		case x < 0.70:
			late = time.Duration(s.rng.Int64N(int64(time.Hour)))
		case x < 0.90:
			late = time.Hour + time.Duration(s.rng.Int64N(int64(23*time.Hour)))
		case x < 0.97:
			late = 24*time.Hour + time.Duration(s.rng.Int64N(int64(48*time.Hour)))
		case x < 0.99:
			late = 3*24*time.Hour + time.Duration(s.rng.Int64N(int64(7*24*time.Hour)))
		default:
			late = 10*24*time.Hour + time.Duration(s.rng.Int64N(int64(15*24*time.Hour)))
		}
		// Random ids, as producers' UUIDs are.
		e := soakEvent{id: fmt.Sprintf("%016x", s.rng.Uint64()), eventTime: s.now.Add(-late).Truncate(time.Millisecond), ingestedAt: s.now,
			amount: 100 + s.rng.IntN(10000), user: s.rng.IntN(500)}
		s.events[e.id] = e
		value := []byte(fmt.Sprintf(`{"event_id":%q,"event_time":%q,"amount":%d.%02d,"user":"u%d"}`,
			e.id, e.eventTime.Format(time.RFC3339Nano), e.amount/100, e.amount%100, e.user))
		recs = append(recs, &kgo.Record{Topic: "events", Value: value})
		if s.rng.IntN(50) == 0 {
			recs = append(recs, &kgo.Record{Topic: "events", Value: value})
			s.dups++
		}
	}
	// One bad message a step.
	recs = append(recs, &kgo.Record{Topic: "events", Value: []byte(`{"event_id": broken`)})
	s.bad = append(s.bad, s.now)
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	res := s.producer.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		s.t.Fatal(err)
	}
	for _, r := range res {
		s.end[r.Record.Partition] = max(s.end[r.Record.Partition], r.Record.Offset+1)
	}
}

// changeSources inserts, updates and hard-deletes rows of both source
// tables.
func (s *soak) changeSources() {
	var b strings.Builder
	for range 2 {
		s.nextCustID++
		fmt.Fprintf(&b, "INSERT INTO customers VALUES (%d, 'c%d@example.com', 'free', clock_timestamp());\n", s.nextCustID, s.nextCustID)
	}
	for range 3 {
		fmt.Fprintf(&b, "UPDATE customers SET tier = 'pro', updated_at = clock_timestamp() WHERE customer_id = %d;\n", 1+s.rng.IntN(s.nextCustID))
	}
	fmt.Fprintf(&b, "DELETE FROM customers WHERE customer_id = %d;\n", 1+s.rng.IntN(s.nextCustID))
	for range 3 {
		s.nextOrder++
		fmt.Fprintf(&b, "INSERT INTO orders VALUES (%d, %d, %d, 'new');\n", s.nextOrder, 1+s.rng.IntN(200), 1+s.rng.IntN(1000))
	}
	for range 2 {
		fmt.Fprintf(&b, "UPDATE orders SET status = 'paid', amount = amount + 1 WHERE order_id = %d;\n", 1+s.rng.IntN(s.nextOrder))
	}
	for range 2 {
		fmt.Fprintf(&b, "DELETE FROM orders WHERE order_id = %d;\n", 1+s.rng.IntN(s.nextOrder))
	}
	if _, err := s.src.Exec(s.ctx, b.String()); err != nil {
		s.t.Fatal(err)
	}
}

// settle waits until both aggregates have read every load and rebuilt
// every queued partition, then prunes as of the service clock.
func (s *soak) settle() {
	s.t.Helper()
	var behind, aggs int64
	if waitfor.Poll(2*time.Minute, func() bool {
		behind = ingesttest.Scalar(s.t, s.wh, `SELECT count(*) FROM tidemark.load_watermarks w
			WHERE EXISTS (SELECT FROM tidemark.ingest_ledger l WHERE l.source = w.source AND l.load_xid >= w.load_xid)
			   OR EXISTS (SELECT FROM tidemark.pending_partitions p WHERE p.aggregate = w.aggregate)`)
		aggs = ingesttest.Scalar(s.t, s.wh, "SELECT count(*) FROM tidemark.load_watermarks")
		return behind == 0 && aggs == 2
	}) != nil {
		s.t.Fatalf("the reconciler did not catch up at %s (%d aggregates behind, %d of 2 known):\n%s", s.now, behind, aggs, s.proc.output.String())
	}
	s.prune(true)
}

// prune runs `tidemark prune` at the service clock. When the service is
// pruning at the time, wait for it and prune again, or with wait false
// leave it to the service.
func (s *soak) prune(wait bool) {
	s.t.Helper()
	var code int
	var errOut string
	busy := func() bool { return strings.Contains(errOut, "another tidemark process is pruning") }
	_ = waitfor.Poll(waitfor.Timeout, func() bool {
		code, _, errOut = invoke(s.t, "prune", "-c", s.cfg)
		return code == exitOK || !busy() || !wait
	})
	if code != exitOK && (wait || !busy()) {
		s.t.Fatalf("prune at %s: exit %d: %s", s.now, code, errOut)
	}
}

// stateSizesSQL measures every table of tidemark's schemas, a raw table
// with its partitions: the main fork of the table, its TOAST table and its
// indexes. The free space and visibility maps, which appear once a table
// is vacuumed and stay a few pages, are left out.
const stateSizesSQL = `
WITH rels AS (
    SELECT c.oid, n.nspname || '.' || c.relname AS name
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname IN ('tidemark', 'raw') AND c.relkind IN ('r', 'p') AND NOT c.relispartition
), parts AS (
    SELECT r.name, r.oid AS rel FROM rels r
    UNION ALL
    SELECT r.name, i.inhrelid FROM rels r JOIN pg_inherits i ON i.inhparent = r.oid
)
SELECT p.name, sum(pg_relation_size(p.rel) + coalesce(pg_relation_size(c.reltoastrelid), 0)
       + coalesce((SELECT sum(pg_relation_size(x.indexrelid)) FROM pg_index x WHERE x.indrelid = p.rel), 0))::int8
FROM parts p JOIN pg_class c ON c.oid = p.rel
GROUP BY p.name ORDER BY 1`

func (s *soak) measure(day int) {
	s.t.Helper()
	rows, err := s.wh.Query(s.ctx, stateSizesSQL)
	if err != nil {
		s.t.Fatal(err)
	}
	sizes := map[string][2]int64{}
	var name string
	var bytes int64
	var names []string
	for rows.Next() {
		if err := rows.Scan(&name, &bytes); err != nil {
			s.t.Fatal(err)
		}
		names = append(names, name)
		sizes[name] = [2]int64{0, bytes}
	}
	rows.Close()
	for _, n := range names {
		v := sizes[n]
		v[0] = ingesttest.Scalar(s.t, s.wh, "SELECT count(*) FROM "+n)
		sizes[n] = v
	}
	s.sizes[day] = sizes
}

// flatTable says whether a state table must not grow. Two kinds are
// left out: tidemark.partitions holds one status row per aggregate
// partition and grows with the aggregate tables themselves; and the raw
// tables of the poll and CDC sources, whose event times come from the
// sources' real clocks, are emptied at each prune and filled again by the
// next changes (see TestSoak).
func flatTable(name string) bool {
	return name != "tidemark.partitions" && name != "raw.customers" && name != "raw.shop"
}

func (s *soak) check() {
	t := s.t
	s.report()
	// Day 60 against day 120; a run long enough compares its second
	// half, well past the weeks the indexes of a churning table take to
	// settle (see within).
	mid, last := 60, 120
	if s.sc.days >= 2*last-mid {
		mid, last = last, s.sc.days
	}
	if s.sizes[mid] == nil || s.sizes[last] == nil {
		t.Fatalf("the soak must measure days %d and %d (it ran %d days)", mid, last, s.sc.days)
	}
	for name, a := range s.sizes[mid] {
		b := s.sizes[last][name]
		if !flatTable(name) {
			continue
		}
		for i, what := range []string{"rows", "bytes"} {
			if !within(a[i], b[i]) {
				t.Errorf("%s grew: %d %s on day %d, %d on day %d", name, a[i], what, mid, b[i], last)
			}
		}
	}
	s.checkAggregates()
	s.checkRaw()
	s.checkMirrors()
	for _, agg := range []string{"daily_sales", "daily_users"} {
		if code, out, errOut := invoke(t, "verify", "--aggregate", agg, "-c", s.cfg); code != exitOK {
			t.Errorf("verify %s: exit %d\n%s%s", agg, code, out, errOut)
		} else {
			t.Log(strings.TrimSpace(out))
		}
	}
}

// within says whether a and b are within 10% of each other, or differ by
// so little that 10% means nothing: a few rows, or up to 128 KiB of pages.
// The latter are the index pages a table's deletes free: PostgreSQL keeps
// them in the file until a later vacuum hands them out again, so a small
// table's indexes settle at some pages over their live size, not growing
// with time but only after weeks of churn.
func within(a, b int64) bool {
	lo, hi := min(a, b), max(a, b)
	return hi-lo <= hi/10 || hi-lo <= 16 || (hi >= 8192 && hi-lo <= 128<<10)
}

// report prints the size table and returns it.
func (s *soak) report() {
	var days []int
	var names []string
	for day := range s.sizes {
		days = append(days, day)
	}
	sort.Ints(days)
	for n := range s.sizes[days[len(days)-1]] {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "table\t")
	for _, d := range days {
		fmt.Fprintf(tw, "day %d\t", d)
	}
	fmt.Fprintln(tw)
	for _, n := range names {
		fmt.Fprintf(tw, "%s\t", n)
		for _, d := range days {
			v := s.sizes[d][n]
			fmt.Fprintf(tw, "%d / %s\t", v[0], kib(v[1]))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	s.t.Logf("rows / size of every state table per simulated fortnight:\n%s", b.String())
}

func kib(b int64) string { return fmt.Sprintf("%dK", b/1024) }

// checkAggregates compares both aggregates, every partition including the
// archived ones, with what the produced events give them.
func (s *soak) checkAggregates() {
	t := s.t
	utc := time.UTC
	bySale, byUser := soakAggregates[0], soakAggregates[1]
	berlin, err := time.LoadLocation(byUser.zone)
	if err != nil {
		t.Fatal(err)
	}
	dayOf := func(ts time.Time, loc *time.Location) time.Time {
		l := ts.In(loc)
		return time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, loc)
	}
	type sale struct{ total, n int }
	sales := map[string]sale{}
	users := map[string]map[int]bool{}
	for _, e := range s.events {
		d := dayOf(e.eventTime, utc)
		if !e.ingestedAt.After(d.AddDate(0, 0, 1).Add(bySale.horizon)) {
			k := d.Format(time.DateOnly)
			sales[k] = sale{sales[k].total + e.amount, sales[k].n + 1}
		}
		bd := dayOf(e.eventTime, berlin)
		into := bd
		if e.ingestedAt.After(bd.AddDate(0, 0, 1).Add(byUser.horizon)) {
			into = dayOf(e.ingestedAt, berlin)
		}
		k := into.Format(time.DateOnly)
		if users[k] == nil {
			users[k] = map[int]bool{}
		}
		users[k][e.user] = true
	}
	var want []string
	for k, v := range sales {
		want = append(want, fmt.Sprintf("%s | %d.%02d | %d", k, v.total/100, v.total%100, v.n))
	}
	sort.Strings(want)
	pgtest.Equal(t, "daily_sales against the produced events", pgtest.Lines(t, s.wh,
		"SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1"), want)
	want = want[:0]
	for k, v := range users {
		want = append(want, fmt.Sprintf("%s | %d", k, len(v)))
	}
	sort.Strings(want)
	pgtest.Equal(t, "daily_users against the produced events", pgtest.Lines(t, s.wh,
		"SELECT day::text, users FROM daily_users ORDER BY 1"), want)
	archived := ingesttest.Scalar(t, s.wh, "SELECT count(*) FROM tidemark.partitions WHERE state = 'archived'")
	corrections := ingesttest.Scalar(t, s.wh, "SELECT count(*) FROM tidemark.corrections")
	if archived == 0 {
		t.Error("no partition was archived: the soak did not exercise retention")
	}
	t.Logf("%d archived partitions, %d corrections retained", archived, corrections)
}

// checkRaw compares the raw events retained with the distinct events
// produced for those days, and the dead letters with the bad messages of
// the dead-letter retention.
func (s *soak) checkRaw() {
	t := s.t
	var from time.Time
	if err := s.wh.QueryRow(s.ctx, "SELECT retained_from FROM tidemark.raw_retention WHERE source = 'events'").Scan(&from); err != nil {
		t.Fatalf("events' retention bound: %v", err)
	}
	var want []string
	for _, e := range s.events {
		if !e.eventTime.Before(from) {
			want = append(want, e.id)
		}
	}
	sort.Strings(want)
	got := pgtest.Lines(t, s.wh, "SELECT event_id FROM raw.events WHERE event_time >= $1 ORDER BY 1", from)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("raw.events from %s: %d rows, want the %d distinct events produced", from, len(got), len(want))
	}
	// Partitions made again for events later than the raw retention hold
	// only produced events.
	for _, id := range pgtest.Lines(t, s.wh, "SELECT event_id FROM raw.events WHERE event_time < $1", from) {
		if _, ok := s.events[id]; !ok {
			t.Errorf("raw.events holds %s, which was never produced", id)
		}
	}
	cut := s.now.Add(-7 * 24 * time.Hour)
	bad := 0
	for _, at := range s.bad {
		if !at.Before(cut) {
			bad++
		}
	}
	if got := ingesttest.Scalar(t, s.wh, "SELECT count(*) FROM tidemark.dead_letters"); got != int64(bad) {
		t.Errorf("%d dead letters retained, want the %d bad messages of the last 7 days", got, bad)
	}
}

// waitSources waits until the poll source's watermark has reached the
// source table's newest change and the CDC mirror equals its table.
func (s *soak) waitSources() {
	s.t.Helper()
	var polled int64
	if waitfor.Poll(2*time.Minute, func() bool {
		var newest time.Time
		if err := s.src.QueryRow(s.ctx, "SELECT max(updated_at) FROM customers").Scan(&newest); err != nil {
			s.t.Fatal(err)
		}
		polled = ingesttest.Scalar(s.t, s.wh, "SELECT count(*) FROM tidemark.poll_watermarks WHERE source = 'customers' AND high_watermark >= $1", newest)
		orders := "SELECT order_id, customer_id, amount::text, status FROM %s ORDER BY 1"
		return polled == 1 && strings.Join(pgtest.Lines(s.t, s.src, fmt.Sprintf(orders, "orders")), "\n") ==
			strings.Join(pgtest.Lines(s.t, s.wh, fmt.Sprintf(orders, "dw_orders")), "\n")
	}) != nil {
		s.t.Fatalf("the poll and CDC sources did not catch up (poll caught up: %v):\n%s", polled == 1, s.proc.output.String())
	}
}

// checkMirrors applies the hard deletes key reconciliation finds and
// compares both mirrors with their sources.
func (s *soak) checkMirrors() {
	t := s.t
	if code, out, errOut := invoke(t, "keys", "--source", "customers", "-c", s.cfg); code != exitOK {
		t.Fatalf("keys: exit %d\n%s%s", code, out, errOut)
	}
	pairs := []struct{ src, mirror string }{
		{"SELECT customer_id, email, tier, updated_at FROM customers ORDER BY 1",
			"SELECT customer_id, email, tier, updated_at FROM dw_customers WHERE deleted_at IS NULL ORDER BY 1"},
		{"SELECT order_id, customer_id, amount::text, status FROM orders ORDER BY 1",
			"SELECT order_id, customer_id, amount::text, status FROM dw_orders ORDER BY 1"},
	}
	for _, p := range pairs {
		want, got := pgtest.Lines(t, s.src, p.src), pgtest.Lines(t, s.wh, p.mirror)
		if strings.Join(want, "\n") != strings.Join(got, "\n") {
			t.Errorf("mirror differs from its source (%d rows, %d at the source): %s", len(got), len(want), p.mirror)
		}
	}
}
