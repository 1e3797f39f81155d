package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
)

// writerHarness is a writer on a fresh warehouse with raw.app_events.
type writerHarness struct {
	w   *writer
	src *source
	dsn string
}

// checkAll is the set of sources whose rows a write checks one by one:
// src when on, none otherwise.
func checkAll(src *source, on bool) map[*source]bool {
	if !on {
		return nil
	}
	return map[*source]bool{src: true}
}

func newWriterHarness(t *testing.T) *writerHarness {
	t.Helper()
	return newWriterHarnessOn(t, pgtest.NewDatabase(t))
}

// newWriterHarnessOn is newWriterHarness on the warehouse at dsn.
func newWriterHarnessOn(t testing.TB, dsn string) *writerHarness {
	t.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	src := &source{name: "app_events", raw: raw.NewTable("app_events", config.PartitionDay), prepared: true}
	if err := src.raw.Ensure(ctx, conn); err != nil {
		t.Fatal(err)
	}
	return &writerHarness{w: &writer{group: "g", conn: conn}, src: src, dsn: dsn}
}

// source adds another source, with its raw table, to the warehouse.
func (h *writerHarness) source(t *testing.T, name string) *source {
	t.Helper()
	src := &source{name: name, raw: raw.NewTable(name, config.PartitionDay), prepared: true}
	if err := src.raw.Ensure(context.Background(), h.w.conn); err != nil {
		t.Fatal(err)
	}
	return src
}

// wantStored checks the event ids raw.app_events holds (ids, comma
// separated, in order) and the duplicates counted.
func (h *writerHarness) wantStored(t *testing.T, ids string, duplicates int) {
	t.Helper()
	if got := h.strings(t, "SELECT event_id FROM raw.app_events ORDER BY 1"); strings.Join(got, ",") != ids {
		t.Errorf("raw events %v, want %s", got, ids)
	}
	if n := h.count(t, "SELECT duplicates FROM tidemark.kafka_offsets"); n != duplicates {
		t.Errorf("duplicates %d, want %d", n, duplicates)
	}
}

// batchOf builds a batch of good events ids on events/0 from offset first.
func (h *writerHarness) batchOf(first int64, ids ...string) *batch {
	b := newBatch()
	at := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	for i, id := range ids {
		r := &kgo.Record{Topic: "events", Partition: 0, Offset: first + int64(i), LeaderEpoch: 0,
			Value: []byte(fmt.Sprintf(`{"event_id":%q}`, id))}
		b.add(h.src, r, decode.Event{ID: id, Time: at, Payload: r.Value}, nil, time.Now())
	}
	return b
}

func (h *writerHarness) count(t *testing.T, sql string) int {
	t.Helper()
	var n int
	if err := h.w.conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (h *writerHarness) strings(t *testing.T, sql string) []string {
	t.Helper()
	rows, err := h.w.conn.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var tp0 = topicPartition{"events", 0}

// writeBatches returns a function that writes one batch as the ingester
// would, keeping the stored positions between calls.
func (h *writerHarness) writeBatches(t *testing.T) func(*batch) (writeResult, error) {
	t.Helper()
	stored := map[topicPartition]position{}
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	return func(b *batch) (writeResult, error) {
		t.Helper()
		res, err := h.w.write(context.Background(), b, stored, now, nil)
		if err == nil && res.committed {
			for tp, pb := range b.parts {
				stored[tp] = pb.next
			}
		}
		return res, err
	}
}

// TestWriterFencesStalePartitions: a batch whose partition another member
// has advanced since this one last stored it is dropped, and the stored
// position is reported so the consumer can seek there.
func TestWriterFencesStalePartitions(t *testing.T) {
	h := newWriterHarness(t)
	ctx := context.Background()
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)

	// This member stores offsets 0..2.
	res, err := h.w.write(ctx, h.batchOf(0, "a", "b", "c"), map[topicPartition]position{}, now, nil)
	if err != nil || !res.committed {
		t.Fatalf("first write: %v %+v", err, res)
	}
	// Another member then stores 3..5.
	res, err = h.w.write(ctx, h.batchOf(3, "d", "e", "f"), map[topicPartition]position{tp0: {3, 0}}, now, nil)
	if err != nil || !res.committed {
		t.Fatalf("second member's write: %v %+v", err, res)
	}
	// The first member, unaware, writes 3..5 again expecting 3 stored.
	b := h.batchOf(3, "d", "e", "f")
	res, err = h.w.write(ctx, b, map[topicPartition]position{tp0: {3, 0}}, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.committed || res.conflicts[tp0].Offset != 6 || !b.empty() {
		t.Fatalf("stale write: committed=%v conflicts=%v batch empty=%v", res.committed, res.conflicts, b.empty())
	}
	// A member that never stored this partition is fenced as well.
	res, err = h.w.write(ctx, h.batchOf(0, "a"), map[topicPartition]position{}, now, nil)
	if err != nil || res.committed || res.conflicts[tp0].Offset != 6 {
		t.Fatalf("write without a stored position: %v %+v", err, res)
	}
	if n := h.count(t, "SELECT count(*) FROM raw.app_events"); n != 6 {
		t.Errorf("raw rows %d, want 6", n)
	}
	if n := h.count(t, "SELECT next_offset FROM tidemark.kafka_offsets"); n != 6 {
		t.Errorf("stored offset %d, want 6", n)
	}
}

// waitLockWaiter waits until a session of the database at dsn waits for
// a lock: the writer's COPY waiting for another transaction's row. It
// returns an error rather than failing the test, for the goroutine that
// must end the other transaction either way.
func waitLockWaiter(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var qerr error
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		var n int64
		q := lockWaitsSQL
		if pgtest.OnCitus() {
			// The rows, and so the lock waits, are on the workers.
			q = `SELECT coalesce(sum(result::bigint), 0) FROM run_command_on_all_nodes($$` + lockWaitsSQL + `$$) WHERE success`
		}
		qerr = conn.QueryRow(ctx, q).Scan(&n)
		return qerr != nil || n > 0
	}); err != nil {
		return fmt.Errorf("no session waited for a lock: %w", err)
	}
	return qerr
}

// lockWaitsSQL counts the sessions of this database waiting for a lock.
const lockWaitsSQL = `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`

// TestWriterConcurrentInsert: an event stored by another transaction after
// the batch probed for it makes the COPY fail on the primary key; the
// write reports it as retryable, and the retry counts it as a duplicate.
func TestWriterConcurrentInsert(t *testing.T) {
	h := newWriterHarness(t)
	ctx := context.Background()
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)

	other, err := pgx.Connect(ctx, h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.src.raw.EnsurePartitions(ctx, h.w.conn, []time.Time{time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
		VALUES ('b', '2026-10-05 10:00+00', now(), '{}')`); err != nil {
		t.Fatal(err)
	}
	// Commit the other insert while the writer's COPY waits on it.
	committed := make(chan error, 1)
	go func() {
		waited := waitLockWaiter(ctx, h.dsn)
		committed <- errors.Join(waited, tx.Commit(ctx))
	}()
	b := h.batchOf(0, "a", "b", "c")
	_, err = h.w.write(ctx, b, map[topicPartition]position{}, now, nil)
	if err := <-committed; err != nil {
		t.Fatalf("commit the concurrent insert: %v", err)
	}
	if !errors.Is(err, errRetryNow) {
		t.Fatalf("write = %v, want errRetryNow", err)
	}
	res, err := h.w.write(ctx, b, map[topicPartition]position{}, now, nil)
	if err != nil || !res.committed || res.inserted[tp0] != 2 {
		t.Fatalf("retry: %v %+v", err, res)
	}
	if n := h.count(t, "SELECT duplicates FROM tidemark.kafka_offsets"); n != 1 {
		t.Errorf("duplicates %d, want 1", n)
	}
	if n := h.count(t, "SELECT count(*) FROM raw.app_events"); n != 3 {
		t.Errorf("raw rows %d, want 3", n)
	}
}

// TestWriterProbesAfterStoredEvent: a batch does not look for stored
// events until a COPY fails on one; that write is retried at once (not a
// write error), the retry finds the event and counts it as a duplicate,
// and the next probeAfterDuplicate batches probe before their COPY.
func TestWriterProbesAfterStoredEvent(t *testing.T) {
	h := newWriterHarness(t)
	write := h.writeBatches(t)

	if res, err := write(h.batchOf(0, "a", "b", "c")); err != nil || res.inserted[tp0] != 3 || h.w.probeLeft != 0 {
		t.Fatalf("first batch: %v %+v probeLeft=%d", err, res, h.w.probeLeft)
	}
	// "b" again, with a new event: the COPY fails on the primary key.
	b := h.batchOf(3, "b", "d")
	_, err := write(b)
	if !errors.Is(err, errStoredBefore) || !errors.Is(err, errRetryNow) {
		t.Fatalf("batch with a stored event = %v, want errStoredBefore", err)
	}
	if h.w.probeLeft != probeAfterDuplicate {
		t.Fatalf("probeLeft = %d after a failed COPY, want %d", h.w.probeLeft, probeAfterDuplicate)
	}
	if n := h.count(t, "SELECT count(*) FROM raw.app_events"); n != 3 {
		t.Fatalf("raw rows %d after the failed attempt, want 3", n)
	}
	// The retry probes, drops "b" and stores "d".
	if res, err := write(b); err != nil || !res.committed || res.inserted[tp0] != 1 {
		t.Fatalf("retry: %v %+v", err, res)
	}
	if h.w.probeLeft != probeAfterDuplicate-1 {
		t.Fatalf("probeLeft = %d after the retry, want %d", h.w.probeLeft, probeAfterDuplicate-1)
	}
	// While probing, a stored event is dropped without a failed COPY.
	if res, err := write(h.batchOf(5, "a", "e")); err != nil || res.inserted[tp0] != 1 {
		t.Fatalf("probing batch: %v %+v", err, res)
	}
	// Once the probing batches are spent, the next stored event fails the
	// COPY again.
	h.w.probeLeft = 1
	if res, err := write(h.batchOf(7, "f")); err != nil || res.inserted[tp0] != 1 || h.w.probeLeft != 0 {
		t.Fatalf("last probing batch: %v %+v probeLeft=%d", err, res, h.w.probeLeft)
	}
	if _, err := write(h.batchOf(8, "c")); !errors.Is(err, errStoredBefore) {
		t.Fatalf("stored event after probing stopped = %v, want errStoredBefore", err)
	}
	h.wantStored(t, "a,b,c,d,e,f", 2)
}

// TestRefusedRowThenConflict: an attempt that checks rows one by one,
// refuses one and then fails on a concurrent insert must leave nothing
// behind, so that the retry stores the refused row once as a dead letter
// and counts the concurrently stored event as a duplicate.
func TestRefusedRowThenConflict(t *testing.T) {
	h := newWriterHarness(t)
	ctx := context.Background()
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	if _, err := h.w.conn.Exec(ctx, `ALTER TABLE raw.app_events ADD CONSTRAINT no_bad CHECK (event_id <> 'bad')`); err != nil {
		t.Fatal(err)
	}
	if err := h.src.raw.EnsurePartitions(ctx, h.w.conn, []time.Time{time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
	other, err := pgx.Connect(ctx, h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
		VALUES ('b', '2026-10-05 10:00+00', now(), '{}')`); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		waited := waitLockWaiter(ctx, h.dsn)
		committed <- errors.Join(waited, tx.Commit(ctx))
	}()
	b := h.batchOf(0, "bad", "b", "c")
	_, err = h.w.write(ctx, b, map[topicPartition]position{}, now, checkAll(h.src, true))
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, errRetryNow) {
		t.Fatalf("first attempt = %v, want errRetryNow", err)
	}
	res, err := h.w.write(ctx, b, map[topicPartition]position{}, now, checkAll(h.src, true))
	if err != nil || !res.committed || len(res.rejected) != 1 || res.inserted[tp0] != 1 {
		t.Fatalf("retry: %v %+v", err, res)
	}
	if n := h.count(t, "SELECT count(*) FROM tidemark.dead_letters"); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}
	var dead, dups, written int
	if err := h.w.conn.QueryRow(ctx, "SELECT dead_letters, duplicates, rows_written FROM tidemark.kafka_offsets").Scan(&dead, &dups, &written); err != nil {
		t.Fatal(err)
	}
	if dead != 1 || dups != 1 || written != 1 {
		t.Errorf("kafka_offsets: dead letters %d, duplicates %d, rows written %d; want 1, 1, 1", dead, dups, written)
	}
}

// TestWriterDropsRepeatsAfterOne: a batch is copied without looking for
// events it holds twice until a COPY fails on one; that write is retried at
// once, dropping the repeat (counted as a duplicate), and the next
// probeAfterDuplicate batches drop repeats without probing. A batch with
// both a repeat and a stored event takes one more retry, which probes.
func TestWriterDropsRepeatsAfterOne(t *testing.T) {
	h := newWriterHarness(t)
	write := h.writeBatches(t)
	left := func(step string, dedupe, probe int) {
		t.Helper()
		if h.w.dedupeLeft != dedupe || h.w.probeLeft != probe {
			t.Fatalf("%s: dedupeLeft=%d probeLeft=%d, want %d and %d", step, h.w.dedupeLeft, h.w.probeLeft, dedupe, probe)
		}
	}

	b := h.batchOf(0, "a", "b", "a")
	if _, err := write(b); !errors.Is(err, errStoredBefore) {
		t.Fatalf("batch holding an event twice = %v, want errStoredBefore", err)
	}
	left("after the failed COPY", probeAfterDuplicate, 0)
	if n := h.count(t, "SELECT count(*) FROM raw.app_events"); n != 0 {
		t.Fatalf("raw rows %d after the failed attempt, want 0", n)
	}
	if res, err := write(b); err != nil || !res.committed || res.inserted[tp0] != 2 {
		t.Fatalf("retry: %v %+v", err, res)
	}
	left("after the retry", probeAfterDuplicate-1, 0)
	// While dropping repeats, a repeat costs no failed COPY.
	if res, err := write(h.batchOf(3, "c", "c")); err != nil || res.inserted[tp0] != 1 {
		t.Fatalf("batch while dropping repeats: %v %+v", err, res)
	}
	left("after a batch dropping repeats", probeAfterDuplicate-2, 0)

	// Without dropping repeats: a repeat and a stored event ("b").
	h.w.dedupeLeft = 0
	b = h.batchOf(5, "d", "d", "b")
	if _, err := write(b); !errors.Is(err, errStoredBefore) {
		t.Fatalf("first attempt = %v, want errStoredBefore", err)
	}
	left("after the first failed COPY", probeAfterDuplicate, 0)
	if _, err := write(b); !errors.Is(err, errStoredBefore) {
		t.Fatalf("second attempt = %v, want errStoredBefore", err)
	}
	left("after the second failed COPY", probeAfterDuplicate-1, probeAfterDuplicate)
	if res, err := write(b); err != nil || res.inserted[tp0] != 1 {
		t.Fatalf("third attempt: %v %+v", err, res)
	}
	left("after the probing attempt", probeAfterDuplicate-1, probeAfterDuplicate-1)

	h.wantStored(t, "a,b,c,d", 4)
}

// TestWriterLedger: a batch's ledger rows count, per source and UTC hour
// of event time, exactly the rows it wrote, with their least and greatest
// event time: from the tally kept as rows are added when every row is
// written, from the rows written when some were dropped (repeats here)
// or a partition was fenced off.
func TestWriterLedger(t *testing.T) {
	h := newWriterHarness(t)
	other := h.source(t, "app_events_b")
	ledger := func() []string {
		t.Helper()
		return h.strings(t, `SELECT concat_ws(' ', source, bucket, sum(rows), min(min_event_time), max(max_event_time))
			FROM tidemark.ingest_ledger GROUP BY source, bucket ORDER BY source, bucket`)
	}
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	type ev struct {
		src   *source
		topic string
		id    string
		time  string
	}
	add := func(b *batch, offsets map[string]int64, evs ...ev) {
		for _, e := range evs {
			r := &kgo.Record{Topic: e.topic, Offset: offsets[e.topic], Value: []byte(`{}`)}
			offsets[e.topic]++
			b.add(e.src, r, decode.Event{ID: e.id, Time: at(e.time), Payload: r.Value}, nil, time.Now())
		}
	}
	write := h.writeBatches(t)
	offsets := map[string]int64{}

	// Every row written: hours out of order, one before 1970.
	b := newBatch()
	add(b, offsets,
		ev{h.src, "events", "a1", "2026-10-05T10:59:59.999999Z"},
		ev{h.src, "events", "a2", "2026-10-05T10:00:00Z"},
		ev{other, "other", "b1", "2026-10-05T10:30:00Z"},
		ev{h.src, "events", "a3", "2026-10-05T11:00:00Z"},
		ev{h.src, "events", "a4", "2026-10-05T10:15:00Z"},
		ev{other, "other", "b2", "1969-12-31T23:30:00Z"},
	)
	if res, err := write(b); err != nil || !res.committed {
		t.Fatalf("write: %v %+v", err, res)
	}
	want := []string{
		"app_events 2026-10-05 10:00:00+00 3 2026-10-05 10:00:00+00 2026-10-05 10:59:59.999999+00",
		"app_events 2026-10-05 11:00:00+00 1 2026-10-05 11:00:00+00 2026-10-05 11:00:00+00",
		"app_events_b 1969-12-31 23:00:00+00 1 1969-12-31 23:30:00+00 1969-12-31 23:30:00+00",
		"app_events_b 2026-10-05 10:00:00+00 1 2026-10-05 10:30:00+00 2026-10-05 10:30:00+00",
	}
	pgtest.Equal(t, "ledger after every row written", ledger(), want)

	// A repeat: the retry writes the rest, and only they are counted.
	b = newBatch()
	add(b, offsets,
		ev{h.src, "events", "a5", "2026-10-05T12:00:00Z"},
		ev{h.src, "events", "a5", "2026-10-05T12:00:00Z"},
		ev{h.src, "events", "a6", "2026-10-05T12:10:00Z"},
	)
	if _, err := write(b); !errors.Is(err, errStoredBefore) {
		t.Fatalf("batch with a repeat = %v, want errStoredBefore", err)
	}
	if res, err := write(b); err != nil || res.inserted[tp0] != 2 {
		t.Fatalf("retry: %v %+v", err, res)
	}
	want = append(want[:2:2], append([]string{"app_events 2026-10-05 12:00:00+00 2 2026-10-05 12:00:00+00 2026-10-05 12:10:00+00"}, want[2:]...)...)
	pgtest.Equal(t, "ledger after a repeat", ledger(), want)

	// A fenced partition: its rows leave the batch, and the tally.
	b = newBatch()
	add(b, offsets,
		ev{h.src, "events", "a7", "2026-10-05T13:00:00Z"},
		ev{other, "other", "b3", "2026-10-05T13:30:00Z"},
	)
	b.drop(map[topicPartition]bool{{"other", 0}: true})
	if res, err := write(b); err != nil || !res.committed {
		t.Fatalf("write: %v %+v", err, res)
	}
	want = append(want[:3:3], append([]string{"app_events 2026-10-05 13:00:00+00 1 2026-10-05 13:00:00+00 2026-10-05 13:00:00+00"}, want[3:]...)...)
	pgtest.Equal(t, "ledger after a fenced partition", ledger(), want)
}

// TestWriterEventsOfTwoSources: two sources' events with the same id and
// time are two events. A batch that probes the raw tables (as the batches
// after a duplicate do), or drops repeats, or checks its rows one by one,
// stores each source's, whatever the other source holds or sends.
func TestWriterEventsOfTwoSources(t *testing.T) {
	for _, mode := range []string{"probe", "repeats", "check rows"} {
		t.Run(mode, func(t *testing.T) {
			h := newWriterHarness(t)
			other := h.source(t, "other")
			ctx := context.Background()
			now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
			stored := map[topicPartition]position{}
			if _, err := h.w.write(ctx, batchAt(h.src, 0, 0, idAt{"a", 0}), stored, now, nil); err != nil {
				t.Fatal(err)
			}
			stored[tp0] = position{1, 0}
			b := batchAt(h.src, 0, 1, idAt{"b", 0})
			ob := batchAt(other, 1, 0, idAt{"a", 0}, idAt{"b", 0})
			for _, r := range ob.rows {
				r.rec.Topic = "other"
				b.add(other, r.rec, r.ev, nil, now)
			}
			var check map[*source]bool
			switch mode {
			case "probe":
				h.w.probeLeft = 1
			case "repeats":
				h.w.dedupeLeft = 1
			case "check rows":
				check = map[*source]bool{h.src: true, other: true}
			}
			if _, err := h.w.write(ctx, b, stored, now, check); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(h.strings(t, "SELECT event_id FROM raw.other ORDER BY 1"), ","); got != "a,b" {
				t.Errorf("raw.other holds %s, want a,b", got)
			}
			if got := strings.Join(h.strings(t, "SELECT event_id FROM raw.app_events ORDER BY 1"), ","); got != "a,b" {
				t.Errorf("raw.app_events holds %s, want a,b", got)
			}
		})
	}
}
