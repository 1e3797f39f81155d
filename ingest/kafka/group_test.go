package kafka_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestRebalance is acceptance item 3: a second ingester joins mid-stream,
// then the first leaves; the raw table is exactly the produced set.
func TestRebalance(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 20_000
	}
	b := setup(t, 8)
	w := ingesttest.Make(b.topic, n, 8, 3, 0.005, 0.01, testNow)
	// The second half is produced only once the second member holds
	// partitions, so that both members have records to write however
	// fast the first drains the first half.
	half := len(w.Records) / 2
	p := &produced{end: map[int32]int64{}}
	streamed := b.produceStream(p, w.Records[:half], n/50, 40*time.Millisecond)

	first := b.start(t)
	b.waitProgress(t, int64(n/5), 2*time.Minute)
	second := b.start(t)
	if err := waitfor.Poll(2*time.Minute, func() bool {
		return counterSum(t, second, "tidemark_ingest_assigned_partitions") > 0 &&
			counterSum(t, first, "tidemark_ingest_assigned_partitions") > 0 &&
			counterSum(t, first, "tidemark_ingest_assigned_partitions")+counterSum(t, second, "tidemark_ingest_assigned_partitions") == 8
	}); err != nil {
		t.Fatalf("the partitions were not shared between the two members: %v", err)
	}
	if err := <-streamed; err != nil {
		t.Fatal(err)
	}
	streamed = b.produceStream(p, w.Records[half:], n/50, 40*time.Millisecond)
	if err := waitfor.Poll(2*time.Minute, func() bool {
		return counterSum(t, second, "tidemark_ingest_rows_written_total") > 0
	}); err != nil {
		t.Fatalf("the second member wrote nothing: %v", err)
	}
	first.stop(t)
	if err := <-streamed; err != nil {
		t.Fatal(err)
	}
	b.waitStored(t, p.end, 5*time.Minute)
	second.stop(t)

	ingesttest.AssertRaw(t, b.pool, "app_events", w.Good)
	ingesttest.AssertDeadLetters(t, b.pool, w)
	ingesttest.AssertStoredEqual(t, b.pool, group, b.topic, p.end)
	ingesttest.AssertLedger(t, b.pool, "app_events")
	// Both members wrote: the partitions really moved.
	for name, r := range map[string]*running{"first": first, "second": second} {
		if rows := counterSum(t, r, "tidemark_ingest_rows_written_total"); rows == 0 {
			t.Errorf("the %s ingester wrote no rows: no rebalance happened", name)
		}
	}
}

// TestFaults is acceptance item 4: failing Fetch and OffsetCommit requests
// and a PostgreSQL crash-restart mid-stream; the ingester recovers by
// itself and the raw table is exactly the produced set.
func TestFaults(t *testing.T) {
	n := 60_000
	if testing.Short() {
		n = 15_000
	}
	srv := pgtest.NewServer(t, pgserver.Options{})
	b := setupOn(t, 4, pgtest.NewDatabaseOn(t, srv))
	w := ingesttest.Make(b.topic, n, 4, 4, 0.005, 0.01, testNow)

	fetchFaults := b.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Err: kerr.UnknownServerError, Count: 25})
	commitFaults := b.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.CoordinatorNotAvailable, Count: -1})

	p := &produced{end: map[int32]int64{}}
	streamed := b.produceStream(p, w.Records, n/40, 50*time.Millisecond)
	r := b.start(t)

	b.waitProgress(t, int64(n/4), 3*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.Restart(ctx, true); err != nil {
		t.Fatalf("restart PostgreSQL: %v", err)
	}
	b.pool.Reset() // the test's own connections died with the server
	b.waitProgress(t, int64(n/2), 3*time.Minute)
	commitFaults.Remove()
	if err := <-streamed; err != nil {
		t.Fatal(err)
	}
	b.waitStored(t, p.end, 5*time.Minute)
	r.stop(t)

	ingesttest.AssertRaw(t, b.pool, "app_events", w.Good)
	ingesttest.AssertDeadLetters(t, b.pool, w)
	ingesttest.AssertStoredEqual(t, b.pool, group, b.topic, p.end)
	ingesttest.AssertLedger(t, b.pool, "app_events")

	// The faults really happened.
	if fetchFaults.Hits() == 0 {
		t.Error("no Fetch request was failed")
	}
	if commitFaults.Hits() == 0 {
		t.Error("no OffsetCommit request was failed")
	}
	if counterSum(t, r, "tidemark_ingest_write_errors_total") == 0 {
		t.Error("the PostgreSQL restart caused no failed write: it happened while idle")
	}
	t.Logf("fetch faults %d, commit faults %d, failed writes %v", fetchFaults.Hits(), commitFaults.Hits(),
		counterSum(t, r, "tidemark_ingest_write_errors_total"))
}

// TestFencedWhileDecodingAhead: while a batch waits for its partition's
// offsets row, the next batch's records are decoded ahead; another member
// then stores a later position, so the batch is fenced and the consumer
// moved there. The records decoded ahead were fetched from the old
// position and must not join the next batch: the partition is read again
// from the stored position, once, with no record counted twice.
func TestFencedWhileDecodingAhead(t *testing.T) {
	const n = 5000 // the harness's batch_max_rows
	runFenced(t, 3*n, 3*n/2, kafka.Options{}, nil)
}

// TestFencedWhilePollingAhead: as TestFencedWhileDecodingAhead, but the
// records beyond the waiting batch are fewer than a batch, so the ingester
// is still polling ahead when the batch is fenced: it holds them and
// waits for more. Polling ahead must stop before the consumer is moved: a
// poll after the move would return records from the new position, and
// they would be dropped with the stale ones and never read again. The
// consumer waits after the move (a test hook) until no poll ahead is
// under way or one has returned, which lets such a poll happen.
func TestFencedWhilePollingAhead(t *testing.T) {
	const n, extra = 5000, 1000 // the harness's batch_max_rows, and the records beyond the batch
	var (
		opts     kafka.Options
		waiting  atomic.Bool  // a poll ahead waits for records
		held     atomic.Int64 // the records held ahead when it began
		returned atomic.Int64 // the polls ahead that have returned
	)
	kafka.SetPollingAhead(&opts, func(h int) {
		held.Store(int64(h))
		waiting.Store(true)
	}, func() {
		waiting.Store(false)
		returned.Add(1)
	})
	kafka.SetAfterSeek(&opts, func() {
		// A poll ahead still waiting now returns records from the new
		// position: let it, so that losing them shows.
		from := returned.Load()
		if err := waitfor.Poll(waitfor.Timeout, func() bool { return !waiting.Load() || returned.Load() > from }); err != nil {
			t.Errorf("a poll ahead still waited %s after the consumer was moved", waitfor.Timeout)
		}
	})
	runFenced(t, n+extra, n+extra/2, opts, func() {
		waitfor.Until(t, "the ingester to poll ahead the records beyond the batch and wait for more", func() bool {
			return waiting.Load() && held.Load() >= extra
		})
	})
}

// runFenced produces records events on one partition and starts an
// ingester whose first batch waits for the partition's offsets row, which
// the test holds locked. Once the write waits, and ready (when set) has
// returned, another member stores position fenced and the lock is
// released. Exactly the events from fenced on must then be stored, each
// record counted once.
func runFenced(t *testing.T, records, fenced int, opts kafka.Options, ready func()) {
	t.Helper()
	b := setup(t, 1)
	w := ingesttest.Make(b.topic, records, 1, 9, 0, 0, testNow)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, w.Records)
	ctx := context.Background()

	// The partition's row exists with no position, and the test holds its
	// lock, so the first batch's write waits on it.
	if _, err := b.pool.Exec(ctx, `INSERT INTO tidemark.kafka_offsets (consumer_group, topic, partition, source, next_offset)
		VALUES ($1, $2, 0, 'app_events', -1)`, group, b.topic); err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
	if _, err := tx.Exec(ctx, `SELECT 1 FROM tidemark.kafka_offsets WHERE consumer_group = $1 FOR UPDATE`, group); err != nil {
		t.Fatal(err)
	}
	r := b.startWith(t, opts)
	waitfor.Until(t, "the ingester's write to wait for the offsets row", func() bool {
		return ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'tidemark-ingest' AND wait_event_type = 'Lock'`) > 0
	})
	if ready != nil {
		ready()
	}
	// Another member stores fenced: the waiting batch is stale.
	if _, err := tx.Exec(ctx, `UPDATE tidemark.kafka_offsets SET next_offset = $2 WHERE consumer_group = $1`, group, fenced); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)

	want := map[string]bool{}
	for _, rec := range w.Records[fenced:] {
		var ev struct {
			ID string `json:"event_id"`
		}
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			t.Fatal(err)
		}
		want[ev.ID] = true
	}
	ingesttest.AssertRaw(t, b.pool, "app_events", want)
	ingesttest.AssertLedger(t, b.pool, "app_events")
	if got := counterSum(t, r, "tidemark_ingest_offset_conflicts_total"); got < 1 {
		t.Errorf("fencing conflicts %v: the batch was not fenced", got)
	}
	if got := ingesttest.Scalar(t, b.pool, `SELECT records FROM tidemark.kafka_offsets`); got != int64(records-fenced) {
		t.Errorf("records counted %d, want %d (every record after the fenced position once)", got, records-fenced)
	}
	if got := counterSum(t, r, "tidemark_ingest_duplicates_total"); got != 0 {
		t.Errorf("duplicates %v, want none", got)
	}
}
