package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestIdleServiceWritesLittle runs `tidemark run` with a Kafka, a poll and
// a CDC source and an aggregate, the sources on the warehouse's server, and
// requires that once everything is loaded the idle service writes almost
// no WAL and runs few transactions: it runs for months, mostly idle, and a
// loop that commits when nothing happens (as the CDC reader's idle
// confirmation once did, 740 kB of WAL a second) would fill disks and
// archives, and a loop of queries would keep the warehouse busy.
func TestIdleServiceWritesLittle(t *testing.T) {
	// idleTurns is how many turns of its loops the idle service is
	// measured over.
	const idleTurns = 3
	srv := pgtest.NewServer(t, pgserver.Options{})
	whDSN, srcDSN := pgtest.NewDatabaseOn(t, srv), pgtest.NewDatabaseOn(t, srv)
	wh, src := pgtest.Pool(t, whDSN), pgtest.Pool(t, srcDSN)
	// The test watches from a database of its own, which the transactions
	// counted leave out: its checks are not the service's.
	watch := pgtest.Pool(t, pgtest.NewDatabaseOn(t, srv))
	if _, err := src.Exec(t.Context(), `
CREATE TABLE customers (customer_id int PRIMARY KEY, email text NOT NULL, updated_at timestamptz NOT NULL);
INSERT INTO customers SELECT i, 'c' || i, clock_timestamp() FROM generate_series(1, 200) AS i;
CREATE TABLE orders (order_id int PRIMARY KEY, amount numeric(12,2) NOT NULL);
INSERT INTO orders SELECT i, i FROM generate_series(1, 200) AS i`); err != nil {
		t.Fatal(err)
	}
	kc := kafkatest.NewCluster(t, 2, "events")
	// Every loop of the service at its shortest interval, so that a few
	// seconds hold several turns of each; the debug log has a line per
	// poll run.
	cfg := writeFile(t, "idle.yaml", fmt.Sprintf(`
warehouse: {dsn: %[1]q}
http: {listen: "off"}
log: {level: debug}
kafka: {brokers: [%[2]q], group: idle}
reconcile: {every: 1s}
sources:
  events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
  customers:
    poll: {dsn: %[3]q, table: customers, key: [customer_id], updated_at: updated_at, every: 1s}
    mirror: {table: dw_customers}
  shop:
    cdc: {dsn: %[3]q, tables: [orders], status_every: 1s, heartbeat_every: 1s}
    mirror: {table: dw_orders}
aggregates:
  daily_sales:
    source: events
    table: daily_sales
    partition: {by: day, column: sale_date}
    sql: |
      SELECT {{partition}} AS sale_date, count(*)::int AS events FROM {{events}} GROUP BY 1
`, whDSN, kc.ListenAddrs()[0], srcDSN))
	p := startWith(t, nil, "run", "-c", cfg) // its output is logged if the test fails
	kafkatest.Produce(t, kafkatest.Producer(t, kc, kgo.RecordPartitioner(kgo.ManualPartitioner())),
		&kgo.Record{Topic: "events", Partition: 0, Value: []byte(`{"event_id":"a","event_time":"2026-12-01T10:00:00Z"}`)})
	ingesttest.WaitStored(t, wh, "idle", "events", map[int32]int64{0: 1}, time.Minute)
	waitfor.Until(t, "the mirrors' first loads", func() bool {
		return ingesttest.Scalar(t, wh, `SELECT count(*) FROM dw_orders`) == 200 &&
			ingesttest.Scalar(t, wh, `SELECT count(*) FROM dw_customers`) == 200
	})
	// The start-up work ends with the reconciler's first pass (it has
	// advanced the aggregate's load watermark and rebuilt what it queued)
	// and the CDC reader's first idle record (the WAL end, recorded past
	// the position it applied).
	waitfor.Until(t, "the reconciler's first pass and the CDC reader's first idle record", func() bool {
		return ingesttest.Scalar(t, wh, `SELECT count(*) FROM tidemark.load_watermarks w WHERE w.aggregate = 'daily_sales' AND w.runs > 0
			AND NOT EXISTS (SELECT FROM tidemark.pending_partitions p WHERE p.aggregate = w.aggregate)`) == 1 &&
			ingesttest.Scalar(t, wh, `SELECT count(*) FROM tidemark.cdc_positions WHERE source = 'shop' AND confirmed_lsn > applied_lsn`) == 1
	})
	var srcDB string
	if err := src.QueryRow(t.Context(), `SELECT current_database()`).Scan(&srcDB); err != nil {
		t.Fatal(err)
	}
	// WAL, up to where it is inserted (the write position lags behind by
	// what the WAL writer has not written yet, which can be the start-up's
	// last commits), and the transactions of the service's databases
	// (statistics that backends report at most once a second, an idle one
	// up to ten seconds late: the count can include some of the
	// start-up's).
	usage := func() (wal, xacts int64) {
		t.Helper()
		if err := watch.QueryRow(t.Context(), `SELECT pg_current_wal_insert_lsn() - '0/0',
			(SELECT sum(xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname <> current_database())`).Scan(&wal, &xacts); err != nil {
			t.Fatal(err)
		}
		return wal, xacts
	}
	// The measure is not a length of time but turns of the service's own
	// loops, which their timers pace: it ends once the poll source has run
	// idleTurns times and the CDC reader has confirmed a new position to
	// the slot idleTurns times (the reconciler's passes and the
	// heartbeats fall in between). Two loops end it, so that any one loop
	// that lost its pace is caught: a measure it ended alone would end at
	// once, holding only its own few turns; ended by the other as well, it
	// holds that loop's thousands.
	pollRuns := func() int { return strings.Count(p.output.String(), `level=DEBUG msg="poll run"`) }
	confirmed := func() (lsn string) {
		t.Helper()
		if err := watch.QueryRow(t.Context(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE database = $1`, srcDB).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	wal0, xacts0 := usage()
	began, runs0, lsn, confirmations := time.Now(), pollRuns(), confirmed(), 0
	waitfor.Until(t, fmt.Sprintf("%d poll runs and %d confirmations of the CDC reader", idleTurns, idleTurns), func() bool {
		if now := confirmed(); now != lsn {
			lsn, confirmations = now, confirmations+1
		}
		return pollRuns()-runs0 >= idleTurns && confirmations >= idleTurns
	})
	wal1, xacts1 := usage()
	written, xacts := wal1-wal0, xacts1-xacts0
	t.Logf("idle for %d turns of its loops (%s): %d bytes of WAL, %d transactions", idleTurns, time.Since(began).Round(time.Millisecond), written, xacts)
	// A few small commits a turn, and room for a checkpoint and its first
	// page images; the CDC reader's loop wrote 740 kB a second.
	if written > 100_000 {
		t.Errorf("the idle service wrote %d bytes of WAL in %d turns of its loops", written, idleTurns)
	}
	// The reconciler's passes and the sources' checks, a few dozen a
	// turn; a loop of queries would make thousands.
	if xacts > 1000 {
		t.Errorf("the idle service ran %d transactions in %d turns of its loops", xacts, idleTurns)
	}
}
