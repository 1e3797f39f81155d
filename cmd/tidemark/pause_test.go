package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/status"
)

// pauseEnv is a warehouse, a source database, a Kafka cluster and a
// configuration with two sources of each kind but CDC: events and clicks
// (Kafka), shop (CDC), customers and products (poll).
type pauseEnv struct {
	t        *testing.T
	ctx      context.Context
	wh, src  *pgxpool.Pool
	producer *kgo.Client
	cfg      string
	produced map[string]int // records sent per topic
}

const pauseGroup = "pause-test"

func newPauseEnv(t *testing.T) *pauseEnv {
	t.Helper()
	e := &pauseEnv{t: t, ctx: context.Background(), produced: map[string]int{}}
	var whDSN, srcDSN string
	e.wh, whDSN = pgtest.NewPool(t)
	e.src, srcDSN = pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 2, "events", "clicks")
	kafkatest.ExpireSilentMembers(t, kc)
	e.producer = kafkatest.Producer(t, kc)
	e.exec(e.src, `CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL);
		CREATE TABLE customers (id bigint PRIMARY KEY, tier text NOT NULL, updated_at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, updated_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	e.cfg = writeFile(t, "pause.yaml", fmt.Sprintf(`warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: [%q], group: %s, session_timeout: 2s}
ingest: {batch_max_age: 20ms}
sources:
  events:
    kafka: {topics: [events]}
    event_id: /id
    event_time: /at
  clicks:
    kafka: {topics: [clicks]}
    event_id: /id
    event_time: /at
  shop:
    cdc: {dsn: %q, tables: [orders], snapshot: initial, status_every: 200ms}
    mirror: {table: dw_orders, deletes: hard}
  customers:
    poll: {dsn: %[4]q, table: customers, key: [id], updated_at: updated_at, every: 1s}
    mirror: {table: dw_customers}
  products:
    poll: {dsn: %[4]q, table: products, key: [id], updated_at: updated_at, every: 1s}
    mirror: {table: dw_products}
`, whDSN, kc.ListenAddrs()[0], pauseGroup, srcDSN))
	return e
}

func (e *pauseEnv) exec(pool *pgxpool.Pool, sql string, args ...any) {
	e.t.Helper()
	if _, err := pool.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *pauseEnv) count(pool *pgxpool.Pool, sql string) int64 {
	e.t.Helper()
	return ingesttest.Scalar(e.t, pool, sql)
}

// produce sends n events to topic, with ids that go on from those sent.
func (e *pauseEnv) produce(topic string, n int) {
	e.t.Helper()
	recs := make([]*kgo.Record, n)
	at := time.Now().UTC().Format(time.RFC3339)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, `{"id":"%s-%d","at":%q}`, topic, e.produced[topic]+i, at)}
	}
	kafkatest.Produce(e.t, e.producer, recs...)
	e.produced[topic] += n
}

// change makes round's changes at the source, each statement a
// transaction: ten orders inserted, the ten of the round before updated,
// and, from round 3, five of those deleted; five customers and five
// products inserted, and the first of each updated.
func (e *pauseEnv) change(round int) {
	e.t.Helper()
	b := int64(round * 10)
	e.exec(e.src, `INSERT INTO orders SELECT i, i FROM generate_series($1::int8 + 1, $1 + 10) AS i`, b)
	e.exec(e.src, `UPDATE orders SET amount = amount + 1 WHERE id BETWEEN $1::int8 - 9 AND $1`, b)
	e.exec(e.src, `DELETE FROM orders WHERE id BETWEEN $1::int8 - 19 AND $1 - 15`, b)
	for _, table := range []string{"customers", "products"} {
		col := map[string]string{"customers": "tier", "products": "name"}[table]
		e.exec(e.src, fmt.Sprintf(`INSERT INTO %s (id, %s) SELECT i, 'r' || $2::int FROM generate_series($1::int8 - 4, $1) AS i`, table, col), int64(round*5), round)
		e.exec(e.src, fmt.Sprintf(`UPDATE %s SET %s = 'u' || $1::int, updated_at = clock_timestamp() WHERE id = 1`, table, col), round)
	}
}

// caughtUp reports whether the warehouse holds everything sent to the
// sources named.
func (e *pauseEnv) caughtUp(sources ...string) bool { return len(e.behind(sources...)) == 0 }

// behind returns those of sources whose changes the warehouse does not
// hold yet.
func (e *pauseEnv) behind(sources ...string) []string {
	e.t.Helper()
	var out []string
	same := func(table, mirror string) bool {
		sql := fmt.Sprintf(`SELECT coalesce(string_agg(t::text, ',' ORDER BY id), '') FROM (SELECT * FROM %s) t`, table)
		var want, got string
		if e.src.QueryRow(e.ctx, sql).Scan(&want) != nil {
			return false
		}
		cols := map[string]string{"dw_orders": "id, amount", "dw_customers": "id, tier, updated_at", "dw_products": "id, name, updated_at"}[mirror]
		if e.wh.QueryRow(e.ctx, fmt.Sprintf(`SELECT coalesce(string_agg(t::text, ',' ORDER BY id), '') FROM (SELECT %s FROM %s) t`, cols, mirror)).Scan(&got) != nil {
			return false
		}
		return want == got
	}
	for _, s := range sources {
		var ok bool
		switch s {
		case "events", "clicks":
			ok = e.count(e.wh, fmt.Sprintf(`SELECT count(*) FROM raw.%s`, s)) == int64(e.produced[s])
		case "shop":
			ok = same("orders", "dw_orders")
		case "customers", "products":
			ok = same(s, "dw_"+s)
		}
		if !ok {
			out = append(out, s)
		}
	}
	return out
}

// positions are the stored positions of the paused sources.
type positions struct {
	offsets         map[int32]int64
	applied, slot   string
	watermark       string
	rawEvents, shop int64
}

func (e *pauseEnv) positions() positions {
	e.t.Helper()
	var p positions
	p.offsets = ingesttest.StoredOffsets(e.t, e.wh, pauseGroup, "events")
	p.applied = scalar(e.t, e.wh, `SELECT applied_lsn::text FROM tidemark.cdc_positions WHERE source = 'shop'`)
	p.slot = scalar(e.t, e.src, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'`)
	p.watermark = scalar(e.t, e.wh, `SELECT high_watermark::text FROM tidemark.poll_watermarks WHERE source = 'customers'`)
	p.rawEvents = e.count(e.wh, `SELECT count(*) FROM raw.events`)
	p.shop = e.count(e.wh, `SELECT count(*) FROM raw.shop`)
	return p
}

// logged reports whether a line of log holds every one of parts.
func logged(log *syncbuf.Buffer, parts ...string) bool {
	for line := range strings.SplitSeq(log.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// TestPauseResume is issue acceptance 3: two instances run Kafka, CDC and
// poll sources; one source of each kind is paused with tidemark pause.
// Every instance obeys: while paused, the stored Kafka offsets, the CDC
// position and slot, and the poll watermark do not move although their
// sources change, and the sources not paused go on loading. After tidemark
// resume everything loads, nothing lost and nothing doubled.
func TestPauseResume(t *testing.T) {
	e := newPauseEnv(t)
	logs := []*syncbuf.Buffer{{}, {}}
	for i, log := range logs {
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"run", "--only", "ingest,poll,cdc", "-c", e.cfg}, &strings.Builder{}, log)
		}()
		t.Cleanup(func() {
			cancel()
			if code := <-done; code != exitOK {
				t.Errorf("instance %d exited %d:\n%s", i, code, log.String())
			}
		})
	}
	all := []string{"events", "clicks", "shop", "customers", "products"}
	paused := []string{"events", "shop", "customers"}

	waitfor.Until(t, "the initial snapshot of shop", func() bool {
		var n int64
		return e.wh.QueryRow(e.ctx, `SELECT count(*) FROM tidemark.cdc_positions WHERE source = 'shop' AND snapshot = 'done'`).Scan(&n) == nil && n == 1
	})
	e.produce("events", 100)
	e.produce("clicks", 100)
	e.change(1)
	waitfor.Until(t, "the first round to load", func() bool { return e.caughtUp(all...) })

	for _, s := range paused {
		code, out, errOut := invoke(t, "pause", s, "-c", e.cfg, "--reason", "maintenance")
		if code != exitOK || !strings.Contains(out, "source "+s+" paused (since ") || !strings.Contains(out, ": maintenance)") {
			t.Fatalf("pause %s: exit %d\n%s%s", s, code, out, errOut)
		}
	}
	if code, out, _ := invoke(t, "pause", "-c", e.cfg, "events"); code != exitOK || !strings.Contains(out, "source events is already paused (since ") {
		t.Errorf("pausing a paused source: exit %d\n%s", code, out)
	}
	// Every instance obeys: its ingester pauses the topic, its poller
	// skips the runs, its reader leaves the slot.
	for i, log := range logs {
		waitfor.Until(t, fmt.Sprintf("instance %d to obey the pauses", i), func() bool {
			return logged(log, "source paused: its topics are not fetched", "source=events") &&
				logged(log, "source paused: its poll runs are skipped", "source=customers") &&
				logged(log, "source paused: the reader does not read the slot", "source=shop")
		})
	}
	waitfor.Until(t, "the slot to be left unread", func() bool {
		return e.count(e.src, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'tidemark_shop' AND NOT active`) == 1
	})
	before := e.positions()

	// Changes to every source; those not paused load them, and twice over
	// so that the paused components have had their turns meanwhile.
	for round := 2; round <= 3; round++ {
		e.produce("events", 50)
		e.produce("clicks", 50)
		e.change(round)
		waitfor.Until(t, fmt.Sprintf("round %d of the sources not paused to load", round), func() bool { return e.caughtUp("clicks", "products") })
	}
	if after := e.positions(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("paused sources moved:\nbefore %+v\nafter  %+v", before, after)
	}

	code, out, errOut := invoke(t, "status", "-c", e.cfg, "--json")
	var rep status.Report
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("status --json: exit %d\n%s%s", code, out, errOut)
	}
	for _, s := range rep.Sources {
		isPaused := strings.Contains(strings.Join(paused, ","), s.Name)
		if (s.Paused != nil) != isPaused || (isPaused && s.Paused.Reason != "maintenance") {
			t.Errorf("status: source %s paused %+v, want paused %v", s.Name, s.Paused, isPaused)
		}
	}
	if code, out, _ := invoke(t, "status", "-c", e.cfg); code != exitOK || !strings.Contains(out, "PAUSED") || !strings.Contains(out, "tidemark resume shop starts it again") {
		t.Errorf("status: exit %d, no PAUSED line:\n%s", code, out)
	}

	for _, s := range paused {
		if code, out, errOut := invoke(t, "resume", s, "-c", e.cfg); code != exitOK || !strings.Contains(out, "source "+s+" resumed after ") {
			t.Fatalf("resume %s: exit %d\n%s%s", s, code, out, errOut)
		}
	}
	if code, out, _ := invoke(t, "resume", "shop", "-c", e.cfg); code != exitOK || !strings.Contains(out, "source shop is not paused") {
		t.Errorf("resuming a source not paused: exit %d\n%s", code, out)
	}
	if err := waitfor.Poll(waitfor.Timeout, func() bool { return e.caughtUp(all...) }); err != nil {
		t.Fatalf("after the resume, %v did not load:\n%s", e.behind(all...), logs[0].String()+logs[1].String())
	}
	ingesttest.AssertStoredEqual(t, e.wh, pauseGroup, "events", map[int32]int64{
		0: e.count(e.wh, `SELECT count(*) FROM raw.events WHERE kafka_partition = 0`),
		1: e.count(e.wh, `SELECT count(*) FROM raw.events WHERE kafka_partition = 1`)})
	if n := e.count(e.wh, `SELECT count(DISTINCT event_id) FROM raw.events`); n != int64(e.produced["events"]) {
		t.Errorf("raw.events holds %d distinct events, want %d", n, e.produced["events"])
	}
	// One raw change row per change of the three rounds: 30 inserts, 20
	// updates, 5 deletes.
	if n := e.count(e.wh, `SELECT count(*) FROM raw.shop`); n != 55 {
		t.Errorf("raw.shop holds %d change rows, want 55", n)
	}
}
