package kafka_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestShutdownWaitsForCommit: a stop that comes while a batch's COMMIT is
// on its way waits for the answer. Given up on, the commit still succeeds
// on the server: the ingester must then ask what became of it, and
// before it asked, the shutdown's last write found the batch stored, took
// it for another member's (a conflict) and never counted its rows.
func TestShutdownWaitsForCommit(t *testing.T) {
	b, px, r, _, logs := heldAtCommit(t, func(px *faultproxy.Proxy) { px.Hold([]byte("commit\x00")) })
	r.cancel()
	px.Release()
	stopWithin(t, r, time.Minute, func() {})
	assertCountedOnce(t, b, r)
	if strings.Contains(logs.String(), answerLost) {
		t.Errorf("the stop gave up on the commit's answer:\n%s", logs)
	}
}

// TestCommitAnswerLost: when the connection breaks after the server
// committed a batch and before its answer arrived, the ingester asks the
// warehouse what became of the transaction and counts the batch as
// written. Without asking, the retry found the batch stored, took it for
// another member's (a conflict) and never counted its rows.
func TestCommitAnswerLost(t *testing.T) {
	b, px, r, p, logs := heldAtCommit(t, func(px *faultproxy.Proxy) { px.HoldReply([]byte("COMMIT\x00")) })
	px.Reset()
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	assertCountedOnce(t, b, r)
	if !strings.Contains(logs.String(), answerLost+"; the warehouse says it committed") {
		t.Errorf("the lost answer was not logged as resolved:\n%s", logs)
	}
}

// answerLost begins the ingester's log lines about a batch whose commit
// was sent and its answer lost.
const answerLost = "the answer to a batch's commit was lost"

// TestCommitNeverArrived: when the connection breaks before the COMMIT
// reached the server, the warehouse says the transaction aborted, and the
// batch is written again, once.
func TestCommitNeverArrived(t *testing.T) {
	b, px, r, p, _ := heldAtCommit(t, func(px *faultproxy.Proxy) { px.Hold([]byte("commit\x00")) })
	px.Reset()
	px.Release()
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	assertCountedOnce(t, b, r)
}

// heldAtCommit runs an ingester on one partition with the warehouse
// behind a fault proxy, and holds the commit of a batch with hold: after
// a first record is stored and the raw partitions around now are created,
// so that the batch's transaction is the only one left to commit. It
// returns once the proxy holds something, with what was produced and the
// ingester's log (info and above).
func heldAtCommit(t *testing.T, hold func(*faultproxy.Proxy)) (*bundle, *faultproxy.Proxy, *running, *produced, *syncbuf.Buffer) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	b := setupOn(t, 1, dsn)
	var px *faultproxy.Proxy
	b.dsn, px = faulttest.Front(t, dsn)
	t.Cleanup(px.Release)
	// One event time: the first record creates the raw partition that
	// the held batch writes to.
	var recs []*kgo.Record
	for i := range 500 {
		recs = append(recs, &kgo.Record{Topic: b.topic, Partition: 0,
			Value: []byte(fmt.Sprintf(`{"event_id":"e%d","event_time":"2026-10-05T10:00:00Z"}`, i))})
	}
	p := &produced{end: map[int32]int64{}}
	logs := &syncbuf.Buffer{}
	r := b.startWith(t, kafka.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	b.produce(t, p, recs[:1])
	b.waitStored(t, p.end, time.Minute)
	// Creating the partitions around now commits too.
	waitfor.Until(t, "the raw partitions around now", func() bool {
		return ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'raw.app_events'::regclass") >= 4
	})
	// The partitions are visible once the server committed them, but the
	// answer to that COMMIT may still be on its way through the proxy,
	// where the hold below would take it for the batch's: wait until the
	// connection that created them has closed, after its answer, leaving
	// the writer's alone.
	waitfor.Until(t, "the partitions' connection to close", func() bool {
		return ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'tidemark-ingest'`) <= 1
	})
	hold(px)
	b.produce(t, p, recs[1:])
	select {
	case <-px.Held():
	case err := <-r.done:
		t.Fatalf("Run returned before committing a batch: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no batch reached its commit within a minute")
	}
	return b, px, r, p, logs
}

// assertCountedOnce checks, after r stopped, that the held batch was
// stored, that its rows were counted as written and that the ingester
// saw no other member's writes.
func assertCountedOnce(t *testing.T, b *bundle, r *running) {
	t.Helper()
	raw := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events")
	if raw <= 1 {
		t.Fatalf("%d raw rows; the held batch was not stored", raw)
	}
	if got := counterSum(t, r, "tidemark_ingest_offset_conflicts_total"); got != 0 {
		t.Errorf("%v offset conflicts; the ingester took its own batch for another member's", got)
	}
	if got := int64(counterSum(t, r, "tidemark_ingest_rows_written_total")); got != raw {
		t.Errorf("rows written metric %d, raw rows %d", got, raw)
	}
	ingesttest.AssertLedger(t, b.pool, "app_events")
}
