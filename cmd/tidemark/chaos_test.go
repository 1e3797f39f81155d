package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// envChaos selects the size of TestChaos: unset, the bounded run of `make
// test`; "full", the run of `make chaos`. envChaosSeed replays a run's
// random choices (its faults and its traffic; their timing still varies).
const (
	envChaos     = "TIDEMARK_CHAOS"
	envChaosSeed = "TIDEMARK_CHAOS_SEED"
	// envChaosSummary names a file the run appends its summary line to.
	envChaosSummary = "TIDEMARK_CHAOS_SUMMARY"
)

// chaosScale is the size of a chaos run.
type chaosScale struct {
	duration  time.Duration // the phase with faults
	perTick   int           // Kafka records produced every tick
	minFaults int           // the phase lasts until this many were injected
	gap       time.Duration // longest pause between two faults
}

// chaosAggregates are the aggregates of TestChaos, over each source of
// events and the CDC source's changes.
var chaosAggregates = []testAggregate{dailySales, dailyUsers, shopChanges}

// pgBlackHoleRelease is how long a PostgreSQL connection that a stall or
// a half-open fault turned into a black hole is left so before the test
// resets the proxy's connections, as a middlebox that drops its state
// would. 0 never does: tidemark's own deadlines (warehouse.write_timeout,
// the replication stream's bound of silence) must free it, and the test
// checks that they do.
const pgBlackHoleRelease = 0

// TestChaos runs `tidemark run` (one instance, and at times a second one
// with the same configuration) with a Kafka source, a poll source and a
// CDC source and three aggregates over them, under generated traffic:
// events on time and late (inside and beyond the lateness horizon and
// beyond max_age), the same event sent again (also after restarts), bad
// messages, and inserts, updates and hard deletes at the source tables.
// Meanwhile it injects faults at random (seeded: the seed is printed and
// TIDEMARK_CHAOS_SEED replays it): SIGKILL and restart of tidemark,
// PostgreSQL restarts (fast and crash-like), and network faults between
// tidemark and the warehouse, the source database and the Kafka broker
// (latency, stalls, half-open connections, resets, refused connections).
// Then it stops the faults and the traffic, lets everything drain, and
// requires that the raw tables hold exactly the distinct events in the
// topic that max_age admits, the dead letters exactly the bad records with
// their bytes, the CDC raw table exactly one row per source change, the
// mirrors their sources, and that every aggregate partition equals a
// rebuild with none left queued.
func TestChaos(t *testing.T) {
	sc := chaosScale{duration: 90 * time.Second, perTick: 25, minFaults: 24, gap: 3 * time.Second}
	switch {
	case os.Getenv(envChaos) == "full":
		sc = chaosScale{duration: 15 * time.Minute, perTick: 60, minFaults: 200, gap: 5 * time.Second}
	case testing.Short():
		sc = chaosScale{duration: 25 * time.Second, perTick: 4, minFaults: 20, gap: 1500 * time.Millisecond}
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envChaosSeed); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", envChaosSeed, err)
		}
		seed = v
	}
	t.Logf("chaos: seed=%d (%s=%d replays it)", seed, envChaosSeed, seed)
	c := newChaos(t, sc, seed)
	c.run()
	c.check()
}

// chaos is one run of TestChaos.
type chaos struct {
	t    *testing.T
	sc   chaosScale
	seed uint64
	ctx  context.Context
	cfg  string

	srv                *pgserver.Server
	wh, src            *pgxpool.Pool // direct connections, for the test itself
	whProxy, srcProxy  *faultproxy.Proxy
	kafkaProxy         *faultproxy.Proxy
	kc                 *kfake.Cluster
	primary, secondary *process

	stopTraffic chan struct{}
	trafficDone sync.WaitGroup
	trafficErr  atomic.Value // error

	// Counted by the fault loop.
	kills, pgRestarts, stalls, resets, halfOpen, latency, refused, joined, left int
	// exits are the unexpected exits of tidemark.
	exits []string
	// Counted by the source writer: committed changes and transactions.
	updates, deletes, txns atomic.Int64
	// When the run began, when its faults ended, when it had drained.
	began, faultsEnded, end time.Time
}

func newChaos(t *testing.T, sc chaosScale, seed uint64) *chaos {
	ctx := context.Background()
	// A server of its own: the test restarts it. A replication stream is
	// given up after wal_sender_timeout of silence: keep it short, as
	// write_timeout below, so that black holes cost seconds.
	srv := pgtest.NewServer(t, pgserver.Options{Settings: map[string]string{"wal_sender_timeout": "10s"}})
	whDSN, srcDSN := pgtest.NewDatabaseOn(t, srv), pgtest.NewDatabaseOn(t, srv)
	c := &chaos{t: t, sc: sc, seed: seed, ctx: ctx, srv: srv, stopTraffic: make(chan struct{})}
	c.wh, c.src = pgtest.Pool(t, whDSN), pgtest.Pool(t, srcDSN)
	target := fmt.Sprintf("%s:%d", srv.Host, srv.Port)
	var err error
	if c.whProxy, err = faultproxy.New(target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.whProxy.Close() })
	if c.srcProxy, err = faultproxy.New(target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.srcProxy.Close() })
	c.kc = kafkatest.NewClusterWith(t, 4, []string{"events"}, kfake.ListenFn(faultproxy.Listen(&c.kafkaProxy)))
	kafkatest.ExpireSilentMembers(t, c.kc)

	if _, err := c.src.Exec(ctx, `
CREATE TABLE customers (customer_id int PRIMARY KEY, email text NOT NULL, tier text NOT NULL, updated_at timestamptz NOT NULL);
INSERT INTO customers SELECT i, 'c' || i || '@example.com', 'free', clock_timestamp() FROM generate_series(1, 100) AS i;
CREATE TABLE orders (order_id int PRIMARY KEY, customer_id int NOT NULL, amount numeric(12,2) NOT NULL, status text NOT NULL);
INSERT INTO orders SELECT i, i % 100 + 1, i, 'new' FROM generate_series(1, 200) AS i;
-- The row changes to orders each committed transaction made, written in
-- that transaction: exact even when a commit's outcome is not known.
CREATE TABLE writer_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, changes int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c.cfg = writeFile(t, "chaos.yaml", fmt.Sprintf(`
warehouse: {dsn: %[1]q, max_conns: 6, write_timeout: 10s}
http: {listen: "off"}
log: {level: info}
kafka: {brokers: [%[2]q], group: chaos, session_timeout: 3s, rebalance_timeout: 6s}
ingest: {batch_max_age: 50ms}
reconcile: {every: 1s, run_timeout: 1m}
sources:
  events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
    max_age: 25d
  customers:
    poll: {dsn: %[3]q, table: customers, key: [customer_id], updated_at: updated_at, lookback: 30s, every: 1s}
    mirror: {table: dw_customers, deletes: soft, key_reconcile_every: 1m, key_reconcile_max_delete: 100%%}
  shop:
    cdc: {dsn: %[3]q, tables: [orders], status_every: 500ms, heartbeat_every: 5s}
    mirror: {table: dw_orders, deletes: hard}
    raw_partition: day
%[4]s`, proxied(t, whDSN, c.whProxy), c.kc.ListenAddrs()[0], proxied(t, srcDSN, c.srcProxy), aggregatesYAML(chaosAggregates...)))
	return c
}

// proxied returns dsn with its host and port replaced by the proxy's.
func proxied(t *testing.T, dsn string, p *faultproxy.Proxy) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	return u.String()
}

func (c *chaos) start() *process {
	return startWith(c.t, nil, "run", "-c", c.cfg)
}

// run starts the service and the traffic, injects faults for the
// configured time, then stops faults and traffic.
func (c *chaos) run() {
	t := c.t
	c.began = time.Now()
	c.primary = c.start()
	c.trafficDone.Add(1)
	go c.produce(rand.New(rand.NewPCG(c.seed, 1)))
	// Changes made before the slot exists are in the snapshot, not in the
	// stream: the writer starts once the snapshot is done.
	c.waitQuiet(2*time.Minute, "the CDC snapshot", func() (bool, error) {
		var state string
		err := c.wh.QueryRow(c.ctx, "SELECT snapshot FROM tidemark.cdc_positions WHERE source = 'shop'").Scan(&state)
		return err == nil && state == "done", nil
	})
	c.trafficDone.Add(1)
	go c.writeSources(rand.New(rand.NewPCG(c.seed, 2)))

	rng := rand.New(rand.NewPCG(c.seed, 3))
	phaseEnd := time.Now().Add(c.sc.duration)
	hardEnd := time.Now().Add(3 * c.sc.duration)
	for (time.Now().Before(phaseEnd) || c.faults() < c.sc.minFaults) && time.Now().Before(hardEnd) {
		time.Sleep(time.Duration(rng.Int64N(int64(c.sc.gap)))) // the pause between two faults, not a wait
		c.supervise()
		c.inject(rng)
		if err, _ := c.trafficErr.Load().(error); err != nil {
			t.Fatalf("traffic: %v", err)
		}
	}
	c.faultsEnded = time.Now()
	// Stop the faults: every proxy passes everything again, and no
	// connection stays a black hole.
	for _, p := range []*faultproxy.Proxy{c.whProxy, c.srcProxy} {
		p.SetLatency(0)
		p.Resume()
		if pgBlackHoleRelease > 0 {
			p.Reset()
		}
	}
	c.kafkaProxy.SetLatency(0)
	c.kafkaProxy.Resume()
	c.supervise()
	close(c.stopTraffic)
	c.trafficDone.Wait()
	if err, _ := c.trafficErr.Load().(error); err != nil {
		t.Fatalf("traffic: %v", err)
	}
}

// faults is the number of faults injected so far.
func (c *chaos) faults() int {
	return c.kills + c.pgRestarts + c.stalls + c.resets + c.halfOpen + c.latency + c.refused + c.joined + c.left
}

// supervise restarts an instance that stopped by itself, as a service
// manager would, and records that it did: `tidemark run` is meant to ride
// out every fault the test injects.
func (c *chaos) supervise() {
	for _, p := range []**process{&c.primary, &c.secondary} {
		if *p == nil {
			continue
		}
		select {
		case <-(*p).exited:
			out := (*p).output.String()
			c.exits = append(c.exits, fmt.Sprintf("%v: %s", (*p).err, tail(out, 15)))
			c.t.Logf("tidemark run exited by itself (%v):\n%s", (*p).err, tail(out, 30))
			if p == &c.primary {
				*p = c.start()
			} else {
				*p = nil
			}
		default:
		}
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// inject applies one fault chosen at random.
func (c *chaos) inject(rng *rand.Rand) {
	t := c.t
	proxies := []struct {
		name string
		p    *faultproxy.Proxy
		pg   bool
	}{{"warehouse", c.whProxy, true}, {"source", c.srcProxy, true}, {"kafka", c.kafkaProxy, false}}
	px := proxies[rng.IntN(len(proxies))]
	// Black holes on a PostgreSQL connection are released after a while
	// (see pgBlackHoleRelease).
	release := func() {
		if px.pg && pgBlackHoleRelease > 0 {
			time.Sleep(pgBlackHoleRelease) // how long the black hole lasts, not a wait
			px.p.Reset()
		}
	}
	switch x := rng.IntN(100); {
	case x < 16: // SIGKILL an instance and start it again
		p := &c.primary
		if c.secondary != nil && rng.IntN(3) == 0 {
			p = &c.secondary
		}
		if err := (*p).cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-(*p).exited
		c.kills++
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond) // how long the instance stays down, not a wait
		*p = c.start()
		t.Logf("chaos %s: SIGKILL and restart", c.since())
	case x < 24: // PostgreSQL restart, fast or crash-like
		crash := rng.IntN(2) == 0
		if err := c.srv.Restart(c.ctx, crash); err != nil {
			t.Fatalf("restart PostgreSQL: %v", err)
		}
		c.pgRestarts++
		t.Logf("chaos %s: PostgreSQL restart (crash %v)", c.since(), crash)
	case x < 36:
		d := time.Duration(5+rng.IntN(150)) * time.Millisecond
		px.p.SetLatency(d)
		time.Sleep(time.Duration(1000+rng.IntN(3000)) * time.Millisecond) // the fault's duration, not a wait
		px.p.SetLatency(0)
		c.latency++
		t.Logf("chaos %s: %s latency %s", c.since(), px.name, d)
	case x < 50:
		px.p.Stall()
		time.Sleep(time.Duration(500+rng.IntN(2500)) * time.Millisecond) // the fault's duration, not a wait
		px.p.Resume()
		release()
		c.stalls++
		t.Logf("chaos %s: %s stall", c.since(), px.name)
	case x < 62:
		px.p.HalfOpen()
		release()
		c.halfOpen++
		t.Logf("chaos %s: %s half-open", c.since(), px.name)
	case x < 80:
		px.p.Reset()
		c.resets++
		t.Logf("chaos %s: %s reset", c.since(), px.name)
	case x < 88:
		px.p.Refuse()
		time.Sleep(time.Duration(300+rng.IntN(2000)) * time.Millisecond) // the fault's duration, not a wait
		px.p.Resume()
		c.refused++
		t.Logf("chaos %s: %s refuse", c.since(), px.name)
	default: // a second instance joins, or leaves (SIGTERM or SIGKILL)
		if c.secondary == nil {
			c.secondary = c.start()
			c.joined++
			t.Logf("chaos %s: second instance joins", c.since())
			return
		}
		sig := syscall.SIGTERM
		if rng.IntN(2) == 0 {
			sig = syscall.SIGKILL
		}
		if err := c.secondary.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.secondary.exited:
		case <-time.After(90 * time.Second):
			// SIGQUIT: the Go runtime prints every goroutine's stack.
			_ = c.secondary.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-c.secondary.exited:
			case <-time.After(10 * time.Second):
			}
			t.Fatalf("second instance did not stop within 90s of %v:\n%s", sig, tail(c.secondary.output.String(), 2000))
		}
		if sig == syscall.SIGTERM && c.secondary.err != nil {
			c.exits = append(c.exits, fmt.Sprintf("after SIGTERM: %v: %s", c.secondary.err, tail(c.secondary.output.String(), 15)))
		}
		c.secondary = nil
		c.left++
		t.Logf("chaos %s: second instance leaves (%v)", c.since(), sig)
	}
}

func (c *chaos) since() string { return time.Since(c.began).Round(100 * time.Millisecond).String() }

// produce sends events every tick until the traffic stops: most on time,
// some hours late, some beyond the lateness horizons, some beyond max_age;
// now and then an event sent before, again; and bad messages. A send whose
// outcome is unknown is sent again: what counts is what the topic holds
// in the end, read back by check.
func (c *chaos) produce(rng *rand.Rand) {
	defer c.trafficDone.Done()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.kc.ListenAddrs()...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.RecordDeliveryTimeout(20*time.Second))
	if err != nil {
		c.trafficErr.Store(err)
		return
	}
	defer cl.Close()
	var sentValues [][]byte
	seq := 0
	for {
		select {
		case <-c.stopTraffic:
			return
		case <-time.After(200 * time.Millisecond):
		}
		now := time.Now().UTC()
		var values [][]byte
		for range c.sc.perTick {
			seq++
			if len(sentValues) > 0 && rng.IntN(40) == 0 {
				values = append(values, sentValues[rng.IntN(len(sentValues))])
				continue
			}
			if rng.IntN(80) == 0 {
				values = append(values, badValue(rng, seq, now))
				continue
			}
			var late time.Duration
			switch x := rng.IntN(100); {
			case x < 70:
				late = time.Duration(rng.Int64N(int64(time.Hour)))
			case x < 88:
				late = time.Hour + time.Duration(rng.Int64N(int64(40*time.Hour)))
			case x < 97: // beyond the horizons, inside max_age
				late = 3*24*time.Hour + time.Duration(rng.Int64N(int64(17*24*time.Hour)))
			default: // beyond max_age: a dead letter
				late = 35*24*time.Hour + time.Duration(rng.Int64N(int64(20*24*time.Hour)))
			}
			v := []byte(fmt.Sprintf(`{"event_id":"e%d-%d","event_time":%q,"amount":%d.%02d,"user":"u%d"}`, c.seed%1000, seq,
				now.Add(-late).Truncate(time.Millisecond).Format(time.RFC3339Nano), rng.IntN(100), rng.IntN(100), rng.IntN(300)))
			values = append(values, v)
			sentValues = append(sentValues, v)
		}
		for len(values) > 0 {
			recs := make([]*kgo.Record, len(values))
			for i, v := range values {
				recs[i] = &kgo.Record{Topic: "events", Value: v}
			}
			ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
			res := cl.ProduceSync(ctx, recs...)
			cancel()
			values = values[:0]
			for _, r := range res {
				if r.Err != nil {
					values = append(values, r.Record.Value)
				}
			}
			// Failed records are sent again even once the traffic stops:
			// the topic may hold them already.
			if len(values) > 0 {
				time.Sleep(100 * time.Millisecond) // the producer's pause before it sends again, not a wait
			}
		}
	}
}

// badValue returns a record value that must become a dead letter.
func badValue(rng *rand.Rand, seq int, now time.Time) []byte {
	switch rng.IntN(3) {
	case 0:
		return []byte(fmt.Sprintf(`{"event_id":"bad%d", broken`, seq))
	case 1:
		return []byte(fmt.Sprintf(`{"event_time":%q,"n":%d}`, now.Format(time.RFC3339), seq))
	default:
		return []byte(fmt.Sprintf(`{"event_id":"bad%d","event_time":"yesterday"}`, seq))
	}
}

// writeSources changes the source tables until the traffic stops: new,
// updated and hard-deleted customers (the poll source) and orders (the CDC
// source), in small transactions. It writes directly, not through the
// faulty network, but PostgreSQL restarts break its transactions too.
func (c *chaos) writeSources(rng *rand.Rand) {
	defer c.trafficDone.Done()
	nextCustomer, nextOrder := 100, 200
	for {
		select {
		case <-c.stopTraffic:
			return
		case <-time.After(time.Duration(50+rng.IntN(150)) * time.Millisecond):
		}
		var b strings.Builder
		var updates, deletes int
		switch rng.IntN(4) {
		case 0:
			nextCustomer++
			fmt.Fprintf(&b, "INSERT INTO customers VALUES (%d, 'c%d@example.com', 'free', clock_timestamp());\n", nextCustomer, nextCustomer)
		case 1, 2:
			fmt.Fprintf(&b, "UPDATE customers SET tier = 'pro%d', updated_at = clock_timestamp() WHERE customer_id = %d;\n", rng.IntN(100), 1+rng.IntN(nextCustomer))
			updates++
		default:
			fmt.Fprintf(&b, "DELETE FROM customers WHERE customer_id = %d;\n", 1+rng.IntN(nextCustomer))
			deletes++
		}
		var stmts []string
		for range 1 + rng.IntN(4) {
			switch rng.IntN(3) {
			case 0:
				nextOrder++
				stmts = append(stmts, fmt.Sprintf("INSERT INTO orders VALUES (%d, %d, %d, 'new')", nextOrder, 1+rng.IntN(100), 1+rng.IntN(1000)))
			case 1:
				stmts = append(stmts, fmt.Sprintf("UPDATE orders SET status = 'paid', amount = amount + 1 WHERE order_id = %d", 1+rng.IntN(nextOrder)))
				updates++
			default:
				stmts = append(stmts, fmt.Sprintf("DELETE FROM orders WHERE order_id = %d", 1+rng.IntN(nextOrder)))
				deletes++
			}
		}
		err := pgx.BeginFunc(c.ctx, c.src, func(tx pgx.Tx) error {
			if _, err := tx.Exec(c.ctx, b.String()); err != nil {
				return err
			}
			changes := int64(0)
			for _, s := range stmts {
				tag, err := tx.Exec(c.ctx, s)
				if err != nil {
					return err
				}
				changes += tag.RowsAffected()
			}
			_, err := tx.Exec(c.ctx, "INSERT INTO writer_log (changes) VALUES ($1)", changes)
			return err
		})
		if err == nil {
			c.updates.Add(int64(updates))
			c.deletes.Add(int64(deletes))
			c.txns.Add(1)
		}
		// An error is a PostgreSQL restart; the transaction may or may not
		// have committed, which writer_log tells.
	}
}

// waitQuiet waits until cond holds, treating its errors (PostgreSQL
// restarting) as "not yet".
func (c *chaos) waitQuiet(limit time.Duration, what string, cond func() (bool, error)) {
	c.t.Helper()
	began := time.Now()
	var err error
	if waitfor.Poll(limit, func() bool {
		var ok bool
		ok, err = cond()
		return ok && err == nil
	}) != nil {
		c.dumpStacks()
		c.t.Fatalf("timed out after %s waiting for %s (last error %v):\n%s", limit, what, err, tail(c.primary.output.String(), 60))
	}
	c.t.Logf("chaos %s: %s took %s", c.since(), what, time.Since(began).Round(100*time.Millisecond))
}

// dumpStacks makes the running instances print their goroutines (Go does
// so on SIGQUIT), to show where a hang is.
func (c *chaos) dumpStacks() {
	for _, p := range []*process{c.primary, c.secondary} {
		if p == nil {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
		}
	}
}

// logRecord is one record of the topic, as read back.
type logRecord struct {
	partition int32
	offset    int64
	value     []byte
}

// readTopic reads every record of the topic and returns them with the
// end offset of each partition.
func (c *chaos) readTopic() ([]logRecord, map[int32]int64) {
	t := c.t
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.kc.ListenAddrs()...), kgo.ConsumeTopics("events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "events")
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	end := map[int32]int64{}
	total := int64(0)
	ends.Each(func(o kadm.ListedOffset) {
		end[o.Partition] = o.Offset
		total += o.Offset
	})
	var out []logRecord
	for int64(len(out)) < total {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read the topic back: %d of %d records: %v", len(out), total, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, logRecord{r.Partition, r.Offset, r.Value})
		})
	}
	return out, end
}

// expected is what the topic's records must become.
type expected struct {
	good       map[string]time.Time // event id -> event time
	duplicates int
	dead       map[[2]int64]deadLetter // (partition, offset) -> dead letter
}

type deadLetter struct {
	reason string
	value  []byte
}

// classify decides, as the ingester must, what each record becomes. The
// events beyond max_age were produced at least 35 days old, those inside
// it at most 20 days, so the time of the check does not matter.
func classify(recs []logRecord, now time.Time) expected {
	e := expected{good: map[string]time.Time{}, dead: map[[2]int64]deadLetter{}}
	for _, r := range recs {
		var v struct {
			EventID   *string `json:"event_id"`
			EventTime *string `json:"event_time"`
		}
		reason := ""
		var at time.Time
		if err := json.Unmarshal(r.value, &v); err != nil {
			reason = "invalid_json"
		} else if v.EventID == nil {
			reason = "missing_id"
		} else if v.EventTime == nil {
			reason = "missing_time"
		} else if at, err = time.Parse(time.RFC3339Nano, *v.EventTime); err != nil {
			reason = "invalid_time"
		} else if at.Before(now.Add(-30 * 24 * time.Hour)) {
			reason = "time_out_of_range"
		}
		if reason != "" {
			e.dead[[2]int64{int64(r.partition), r.offset}] = deadLetter{reason, r.value}
			continue
		}
		if _, ok := e.good[*v.EventID]; ok {
			e.duplicates++
		}
		e.good[*v.EventID] = at
	}
	return e
}

// check drains everything and compares the warehouse with the traffic.
func (c *chaos) check() {
	t := c.t
	recs, end := c.readTopic()
	want := classify(recs, time.Now())

	// Drain: the Kafka records stored, the sources caught up, the
	// reconciler settled.
	c.waitQuiet(3*time.Minute, "the ingester to store every record", func() (bool, error) {
		rows, err := c.wh.Query(c.ctx, "SELECT partition, next_offset FROM tidemark.kafka_offsets WHERE consumer_group = 'chaos' AND topic = 'events'")
		if err != nil {
			return false, err
		}
		stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
			var p int32
			var o int64
			err := r.Scan(&p, &o)
			return [2]int64{int64(p), o}, err
		})
		if err != nil {
			return false, err
		}
		done := 0
		for _, s := range stored {
			if s[1] >= end[int32(s[0])] {
				done++
			}
		}
		return done == len(end), nil
	})
	c.waitQuiet(3*time.Minute, "the poll and CDC sources to catch up", func() (bool, error) {
		var newest time.Time
		if err := c.src.QueryRow(c.ctx, "SELECT max(updated_at) FROM customers").Scan(&newest); err != nil {
			return false, err
		}
		var polled bool
		if err := c.wh.QueryRow(c.ctx, "SELECT high_watermark >= $1 FROM tidemark.poll_watermarks WHERE source = 'customers'", newest).Scan(&polled); err != nil {
			return false, err
		}
		var changes, raw int64
		if err := c.src.QueryRow(c.ctx, "SELECT coalesce(sum(changes), 0) FROM writer_log").Scan(&changes); err != nil {
			return false, err
		}
		if err := c.wh.QueryRow(c.ctx, "SELECT count(*) FROM raw.shop").Scan(&raw); err != nil {
			return false, err
		}
		return polled && raw >= changes, nil
	})
	c.waitQuiet(3*time.Minute, "the reconciler to settle", func() (bool, error) {
		var behind, aggs int64
		err := c.wh.QueryRow(c.ctx, `SELECT count(*) FILTER (WHERE EXISTS (SELECT FROM tidemark.ingest_ledger l WHERE l.source = w.source AND l.load_xid >= w.load_xid)
			   OR EXISTS (SELECT FROM tidemark.pending_partitions p WHERE p.aggregate = w.aggregate)), count(*) FROM tidemark.load_watermarks w`).Scan(&behind, &aggs)
		return err == nil && behind == 0 && aggs == 3, err
	})
	c.end = time.Now()
	t.Logf("chaos: drained in %s after the faults ended", c.end.Sub(c.faultsEnded).Round(100*time.Millisecond))
	// Stop the instances as an operator would: SIGTERM, status 0.
	for _, p := range []*process{c.secondary, c.primary} {
		if p == nil {
			continue
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.exited:
			if p.err != nil {
				c.exits = append(c.exits, fmt.Sprintf("after the final SIGTERM: %v: %s", p.err, tail(p.output.String(), 15)))
			}
		case <-time.After(90 * time.Second):
			c.dumpStacks()
			t.Fatalf("tidemark run did not stop within 90s of SIGTERM:\n%s", tail(p.output.String(), 80))
		}
	}

	mismatches := 0
	mismatches += c.checkRaw(want)
	mismatches += c.checkDeadLetters(want)
	mismatches += c.checkCDC()
	mismatches += c.checkMirrors()
	mismatches += c.checkAggregates()
	mismatches += c.checkCorrections()
	mismatches += len(c.exits)
	for _, e := range c.exits {
		t.Errorf("tidemark run stopped by itself: %s", e)
	}
	bad := len(want.dead)
	summary := fmt.Sprintf("chaos: seed=%d duration=%s kills=%d pg_restarts=%d faults=%d (stalls=%d resets=%d halfopen=%d latency=%d refused=%d) "+
		"instances_joined=%d instances_left=%d events=%d duplicates=%d bad=%d updates=%d deletes=%d source_txns=%d mismatches=%d",
		c.seed, c.end.Sub(c.began).Round(time.Second), c.kills, c.pgRestarts, c.faults(), c.stalls, c.resets, c.halfOpen, c.latency, c.refused,
		c.joined, c.left, len(want.good), want.duplicates, bad, c.updates.Load(), c.deletes.Load(), c.txns.Load(), mismatches)
	t.Log(summary)
	if path := os.Getenv(envChaosSummary); path != "" {
		// go test shows a passing test's log only with -v; CI prints
		// this file after the run instead.
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = fmt.Fprintln(f, summary)
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Errorf("%s: %v", envChaosSummary, err)
		}
	}
	if mismatches != 0 {
		t.Errorf("%d mismatches (seed %d)", mismatches, c.seed)
	}
	if c.faults() < 20 {
		t.Errorf("only %d faults were injected, want at least 20", c.faults())
	}
}

// checkRaw compares raw.events with the distinct events in the topic.
func (c *chaos) checkRaw(want expected) int {
	t := c.t
	rows, err := c.wh.Query(c.ctx, "SELECT event_id, event_time FROM raw.events")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	var wrongTime []string
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		got[id]++
		if w, ok := want.good[id]; ok && !w.Equal(at) {
			wrongTime = append(wrongTime, id)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	d := ingesttest.Compare(want.good, got)
	n := d.Len() + len(wrongTime)
	if n > 0 {
		t.Errorf("raw.events differs from the topic's %d distinct events: %s, %d with another event time %v",
			len(want.good), d, len(wrongTime), ingesttest.Head(wrongTime))
	}
	return n
}

// checkDeadLetters compares the dead letters with the bad records of the
// topic: one each, with its reason and its bytes.
func (c *chaos) checkDeadLetters(want expected) int {
	t := c.t
	rows, err := c.wh.Query(c.ctx, `SELECT partition, "offset", reason, record_value FROM tidemark.dead_letters WHERE source = 'events'`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int64]bool{}
	n := 0
	for rows.Next() {
		var part int32
		var off int64
		var reason string
		var value []byte
		if err := rows.Scan(&part, &off, &reason, &value); err != nil {
			t.Fatal(err)
		}
		k := [2]int64{int64(part), off}
		w, ok := want.dead[k]
		switch {
		case !ok:
			t.Errorf("dead letter %d/%d (%s) is not a bad record: %q", part, off, reason, value)
		case seen[k]:
			t.Errorf("dead letter %d/%d stored twice", part, off)
		case reason != w.reason || !bytes.Equal(value, w.value):
			t.Errorf("dead letter %d/%d: %s %q, want %s %q", part, off, reason, value, w.reason, w.value)
		default:
			seen[k] = true
			continue
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if missing := len(want.dead) - len(seen); missing > 0 {
		t.Errorf("%d of %d bad records have no dead letter", missing, len(want.dead))
		n += missing
	}
	return n
}

// checkCDC requires one raw change row per committed source change.
func (c *chaos) checkCDC() int {
	t := c.t
	var changes, raw, distinct int64
	if err := c.src.QueryRow(c.ctx, "SELECT coalesce(sum(changes), 0) FROM writer_log").Scan(&changes); err != nil {
		t.Fatal(err)
	}
	if err := c.wh.QueryRow(c.ctx, "SELECT count(*), count(DISTINCT (commit_lsn, event_id)) FROM raw.shop").Scan(&raw, &distinct); err != nil {
		t.Fatal(err)
	}
	if raw != changes || distinct != changes {
		t.Errorf("raw.shop: %d change rows (%d distinct), want exactly %d", raw, distinct, changes)
		return 1
	}
	return 0
}

// checkMirrors applies the hard deletes key reconciliation finds and
// compares both mirrors with their sources, row by row; and requires the
// current version of every source customer among the poll source's raw
// change rows.
func (c *chaos) checkMirrors() int {
	t := c.t
	if code, out, errOut := invoke(t, "keys", "--source", "customers", "-c", c.cfg); code != exitOK {
		t.Fatalf("keys: exit %d\n%s%s", code, out, errOut)
	}
	n := 0
	pairs := []struct{ src, mirror string }{
		{"SELECT customer_id, email, tier, updated_at FROM customers ORDER BY 1",
			"SELECT customer_id, email, tier, updated_at FROM dw_customers WHERE deleted_at IS NULL ORDER BY 1"},
		{"SELECT order_id, customer_id, amount::text, status FROM orders ORDER BY 1",
			"SELECT order_id, customer_id, amount::text, status FROM dw_orders ORDER BY 1"},
	}
	for _, p := range pairs {
		want, got := pgtest.Rows(t, c.src, p.src), pgtest.Rows(t, c.wh, p.mirror)
		if d := diffLines(got, want); d > 0 {
			t.Errorf("%d rows differ between the mirror and its source (%d rows, %d at the source): %s", d, len(got), len(want), p.mirror)
			n += d
		}
	}
	versions := pgtest.Rows(t, c.src, "SELECT customer_id::text, updated_at FROM customers ORDER BY 1")
	recorded := map[string]bool{}
	for _, r := range pgtest.Rows(t, c.wh, "SELECT event_id, event_time FROM raw.customers") {
		recorded[r] = true
	}
	for _, v := range versions {
		if !recorded[v] {
			t.Errorf("raw.customers lacks the current version of customer %s", v)
			n++
		}
	}
	return n
}

// diffLines counts the lines in one of got and want but not the other.
func diffLines(got, want []string) int {
	count := map[string]int{}
	for _, g := range got {
		count[g]++
	}
	for _, w := range want {
		count[w]--
	}
	n := 0
	for _, v := range count {
		n += max(v, -v)
	}
	return n
}

// checkAggregates requires every aggregate partition to equal a rebuild
// and none to be queued or failing.
func (c *chaos) checkAggregates() int {
	t := c.t
	n := 0
	for _, a := range chaosAggregates {
		code, out, errOut := invoke(t, "verify", "--aggregate", a.name, "-c", c.cfg)
		if code != exitOK {
			t.Errorf("verify %s: exit %d\n%s%s", a.name, code, out, errOut)
			n++
		} else {
			t.Log(strings.TrimSpace(out))
		}
	}
	var queued, failing int64
	if err := c.wh.QueryRow(c.ctx, "SELECT count(*), count(*) FILTER (WHERE attempts > 0 OR last_error IS NOT NULL) FROM tidemark.pending_partitions").Scan(&queued, &failing); err != nil {
		t.Fatal(err)
	}
	if queued > 0 {
		t.Errorf("%d partitions still queued, %d of them failing: %v", queued, failing,
			pgtest.Rows(t, c.wh, "SELECT aggregate, partition_start, attempts, last_error FROM tidemark.pending_partitions LIMIT 5"))
		n += int(queued)
	}
	var parts int64
	if err := c.wh.QueryRow(c.ctx, "SELECT count(*) FROM tidemark.partitions").Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if parts == 0 {
		t.Error("no aggregate partition was built")
		n++
	}
	return n
}

// checkCorrections computes, from the raw rows' own times, which events
// arrived beyond their partition's lateness horizon, and requires exactly
// those in tidemark.corrections, once per aggregate.
func (c *chaos) checkCorrections() int {
	t := c.t
	n := 0
	for _, a := range chaosAggregates {
		if a.source != "events" {
			continue // what is checked is the Kafka events' lateness (raw.events)
		}
		var want, got, differ int64
		err := c.wh.QueryRow(c.ctx, `
WITH want AS (
    SELECT event_id FROM raw.events
    WHERE ingested_at > (date_trunc('day', event_time AT TIME ZONE $2) + interval '1 day') AT TIME ZONE $2 + $3::interval
), got AS (
    SELECT split_part(event_key, '|', 1) AS event_id FROM tidemark.corrections WHERE aggregate = $1
)
SELECT (SELECT count(*) FROM want), (SELECT count(*) FROM got),
       (SELECT count(*) FROM (SELECT event_id FROM want EXCEPT ALL SELECT event_id FROM got) AS x)
     + (SELECT count(*) FROM (SELECT event_id FROM got EXCEPT ALL SELECT event_id FROM want) AS y)`,
			a.name, cmp.Or(a.zone, "UTC"), fmt.Sprintf("%d hours", a.horizon/time.Hour)).Scan(&want, &got, &differ)
		if err != nil {
			t.Fatal(err)
		}
		if differ > 0 {
			t.Errorf("%s: %d corrections, want the %d events beyond the horizon; %d differ", a.name, got, want, differ)
			n += int(differ)
		}
		if want == 0 {
			t.Errorf("%s: no event arrived beyond the horizon: the traffic does not cover it", a.name)
			n++
		}
	}
	return n
}
