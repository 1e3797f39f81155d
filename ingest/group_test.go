package ingest_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark-dev/tidemark/internal/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/pgtest"
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
	p := &produced{end: map[int32]int64{}}
	streamed := b.produceStream(p, w.Records, n/50, 40*time.Millisecond)

	first := b.start(t)
	b.waitProgress(t, int64(n/5), 2*time.Minute)
	second := b.start(t)
	b.waitProgress(t, int64(n/2), 2*time.Minute)
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
