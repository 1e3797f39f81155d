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

	"github.com/tidemark-dev/tidemark/ingest/decode"
)

// window is the dedupe window of these tests.
const window = 7 * 24 * time.Hour

// dedupeNow is the service clock of the first write in these tests.
var dedupeNow = time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)

// idAt is an event of a dedupe test: its id and its time, in minutes
// after 10:00 on the day of dedupeNow.
type idAt struct {
	id  string
	min int
}

// batchAt builds a batch of good events of src on events/part from offset
// first.
func batchAt(src *source, part int32, first int64, evs ...idAt) *batch {
	b := newBatch()
	for i, e := range evs {
		at := time.Date(2026, 10, 5, 10, e.min, 0, 0, time.UTC)
		r := &kgo.Record{Topic: "events", Partition: part, Offset: first + int64(i),
			Value: []byte(fmt.Sprintf(`{"event_id":%q,"n":%d}`, e.id, first+int64(i)))}
		b.add(src, r, decode.Event{ID: e.id, Time: at, Payload: r.Value}, nil, time.Now())
	}
	return b
}

// writeAt writes one batch at a service time as the ingester would,
// keeping the stored positions between calls, and retrying at once after
// a COPY failed on a stored event.
func (h *writerHarness) writeAt(t *testing.T) func(b *batch, now time.Time, checkRows bool) writeResult {
	t.Helper()
	stored := map[topicPartition]position{}
	return func(b *batch, now time.Time, checkRows bool) writeResult {
		t.Helper()
		res, err := h.w.write(context.Background(), b, stored, now, checkAll(h.src, checkRows))
		if errors.Is(err, errStoredBefore) {
			res, err = h.w.write(context.Background(), b, stored, now, checkAll(h.src, checkRows))
		}
		if err != nil {
			t.Fatalf("write: %v", err)
		}
		for tp, pb := range b.parts {
			stored[tp] = pb.next
		}
		return res
	}
}

// rawEvents lists raw.app_events as "id@minute/offset" in id, time order.
func (h *writerHarness) rawEvents(t *testing.T) string {
	t.Helper()
	return strings.Join(h.strings(t, `SELECT format('%s@%s/%s', event_id, extract(minute FROM event_time), kafka_offset)
		FROM raw.app_events ORDER BY event_id, event_time`), ",")
}

// TestWriterDedupeByID: with dedupe.by: event_id an event whose id was
// loaded within the window is dropped whatever its time, and counted; the
// first of a batch wins; an id loaded longer ago loads again. Without it,
// only (event_id, event_time) repeats are dropped.
func TestWriterDedupeByID(t *testing.T) {
	later := dedupeNow.Add(time.Hour)
	beyond := dedupeNow.Add(window + time.Minute)
	type step struct {
		evs    []idAt
		now    time.Time
		idDups int // rows the id step dropped
	}
	tests := []struct {
		name   string
		window time.Duration
		steps  []step
		want   string // rawEvents after the steps
	}{
		{"retry with a new time", window, []step{
			{[]idAt{{"a", 0}, {"b", 0}}, dedupeNow, 0},
			{[]idAt{{"a", 5}, {"c", 0}}, later, 1},
		}, "a@0/0,b@0/1,c@0/3"},
		{"retry with a new time, without dedupe", 0, []step{
			{[]idAt{{"a", 0}, {"b", 0}}, dedupeNow, 0},
			{[]idAt{{"a", 5}, {"c", 0}}, later, 0},
		}, "a@0/0,a@5/2,b@0/1,c@0/3"},
		{"repeats within a batch: the first wins", window, []step{
			{[]idAt{{"a", 3}, {"b", 0}, {"a", 1}, {"a", 3}, {"b", 0}}, dedupeNow, 3},
		}, "a@3/0,b@0/1"},
		{"an id loaded longer ago than the window loads again", window, []step{
			{[]idAt{{"a", 0}}, dedupeNow, 0},
			{[]idAt{{"a", 5}}, dedupeNow.Add(window - time.Minute), 1},
			{[]idAt{{"a", 7}}, beyond, 0},
			{[]idAt{{"a", 9}}, beyond.Add(time.Hour), 1},
		}, "a@0/0,a@7/2"},
		{"the same event again beyond the window is stored once", window, []step{
			{[]idAt{{"a", 0}}, dedupeNow, 0},
			{[]idAt{{"a", 0}, {"b", 0}}, beyond, 0},
		}, "a@0/0,b@0/2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newWriterHarness(t)
			h.src.dedupeWindow = tt.window
			write := h.writeAt(t)
			offset := int64(0)
			for i, s := range tt.steps {
				res := write(batchAt(h.src, 0, offset, s.evs...), s.now, false)
				if got := res.idDuplicates[h.src]; got != s.idDups {
					t.Errorf("step %d: id duplicates %d, want %d", i, got, s.idDups)
				}
				offset += int64(len(s.evs))
			}
			if got := h.rawEvents(t); got != tt.want {
				t.Errorf("raw events %s, want %s", got, tt.want)
			}
			// Every record not stored is counted as a duplicate.
			if got, want := h.count(t, "SELECT duplicates FROM tidemark.kafka_offsets"), int(offset)-strings.Count(tt.want, "@"); got != want {
				t.Errorf("duplicates %d, want %d", got, want)
			}
			if tt.window == 0 {
				if n := h.count(t, "SELECT count(*) FROM tidemark.event_ids"); n != 0 {
					t.Errorf("%d event ids recorded without dedupe", n)
				}
			}
		})
	}
}

// TestWriterDedupeRetries: ids claimed by an attempt that failed are
// rolled back with it, so the retry loads its rows; ids of rows the
// warehouse refused are released, so a good copy loads later.
func TestWriterDedupeRetries(t *testing.T) {
	ctx := context.Background()
	t.Run("a COPY that fails on a stored event", func(t *testing.T) {
		h := newWriterHarness(t)
		h.src.dedupeWindow = window
		// "a" stored before dedupe: its id is not recorded.
		if err := h.src.raw.EnsurePartitions(ctx, h.w.conn, []time.Time{time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.w.conn.Exec(ctx, `INSERT INTO raw.app_events (event_id, event_time, ingested_at, payload)
			VALUES ('a', '2026-10-05 10:00+00', now(), '{}')`); err != nil {
			t.Fatal(err)
		}
		b := batchAt(h.src, 0, 0, idAt{"b", 0}, idAt{"a", 0}, idAt{"c", 0})
		if _, err := h.w.write(ctx, b, map[topicPartition]position{}, dedupeNow, nil); !errors.Is(err, errStoredBefore) {
			t.Fatalf("first attempt = %v, want errStoredBefore", err)
		}
		if n := h.count(t, "SELECT count(*) FROM tidemark.event_ids"); n != 0 {
			t.Fatalf("%d ids recorded by the failed attempt", n)
		}
		res, err := h.w.write(ctx, b, map[topicPartition]position{}, dedupeNow, nil)
		if err != nil || res.inserted[tp0] != 2 {
			t.Fatalf("retry: %v %+v", err, res)
		}
		h.wantStored(t, "a,b,c", 1)
		pgEqual(t, "ids", h.strings(t, "SELECT event_id FROM tidemark.event_ids ORDER BY 1"), "b,c")
	})
	t.Run("a refused row", func(t *testing.T) {
		h := newWriterHarness(t)
		h.src.dedupeWindow = window
		if _, err := h.w.conn.Exec(ctx, `ALTER TABLE raw.app_events ADD CONSTRAINT early CHECK (event_time < '2026-10-05 10:30+00')`); err != nil {
			t.Fatal(err)
		}
		write := h.writeAt(t)
		res := write(batchAt(h.src, 0, 0, idAt{"a", 0}, idAt{"b", 40}), dedupeNow, true)
		if len(res.rejected) != 1 || res.inserted[tp0] != 1 {
			t.Fatalf("checked write: %+v", res)
		}
		pgEqual(t, "ids", h.strings(t, "SELECT event_id FROM tidemark.event_ids ORDER BY 1"), "a")
		write(batchAt(h.src, 0, 2, idAt{"b", 10}), dedupeNow, false)
		if got := h.rawEvents(t); got != "a@0/0,b@10/2" {
			t.Errorf("raw events %s, want a@0/0,b@10/2", got)
		}
	})
}

// TestWriterDedupeCopyThenClaim: a batch's ids are copied while none was
// recorded before; an id recorded before fails the copy, which is rolled
// back, and the ids are claimed one by one, in that batch and the next
// probeAfterDuplicate batches, with the same outcome.
func TestWriterDedupeCopyThenClaim(t *testing.T) {
	h := newWriterHarness(t)
	h.src.dedupeWindow = window
	write := h.writeAt(t)
	steps := []struct {
		evs       []idAt
		idDups    int
		claimLeft int // after the step
		ids       string
	}{
		{[]idAt{{"b", 0}, {"a", 0}, {"b", 1}}, 1, 0, "a,b"},
		{[]idAt{{"c", 0}, {"a", 5}}, 1, probeAfterDuplicate, "a,b,c"},
		{[]idAt{{"d", 0}, {"c", 7}}, 1, probeAfterDuplicate - 1, "a,b,c,d"},
	}
	offset := int64(0)
	for i, s := range steps {
		res := write(batchAt(h.src, 0, offset, s.evs...), dedupeNow.Add(time.Duration(i)*time.Minute), false)
		offset += int64(len(s.evs))
		if got := res.idDuplicates[h.src]; got != s.idDups {
			t.Errorf("step %d: id duplicates %d, want %d", i, got, s.idDups)
		}
		if h.w.claimLeft != s.claimLeft {
			t.Errorf("step %d: claimLeft %d, want %d", i, h.w.claimLeft, s.claimLeft)
		}
		pgEqual(t, fmt.Sprintf("step %d: ids", i), h.strings(t, "SELECT event_id FROM tidemark.event_ids ORDER BY 1"), s.ids)
	}
	if got := h.rawEvents(t); got != "a@0/1,b@0/0,c@0/3,d@0/5" {
		t.Errorf("raw events %s", got)
	}
	// Each id keeps the time of the batch that loaded it.
	pgEqual(t, "loaded at", h.strings(t, "SELECT event_id || ' ' || extract(minute FROM loaded_at) FROM tidemark.event_ids ORDER BY 1"),
		"a 0,b 0,c 1,d 2")
}

// pgEqual compares a list of strings with a comma separated want.
func pgEqual(t *testing.T, what string, got []string, want string) {
	t.Helper()
	if g := strings.Join(got, ","); g != want {
		t.Errorf("%s: %s, want %s", what, g, want)
	}
}

// TestWriterDedupeConcurrent: two writers loading the same id from
// different partitions at once store it once. The second waits for the
// first's transaction on the id; when that commits, the second drops its
// copy as a duplicate; when it rolls back, the second loads it.
func TestWriterDedupeConcurrent(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("first commits %v", commit), func(t *testing.T) {
			h := newWriterHarness(t)
			h.src.dedupeWindow = window
			ctx := context.Background()
			if err := h.src.raw.EnsurePartitions(ctx, h.w.conn, []time.Time{time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC)}); err != nil {
				t.Fatal(err)
			}
			other, err := pgx.Connect(ctx, h.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(ctx)
			first := &writer{group: "g", conn: other}
			tx, err := other.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The first writer's steps on partition 1, up to its commit.
			a := batchAt(h.src, 1, 0, idAt{"x", 0}, idAt{"y", 0})
			rows, _, err := first.dedupeIDs(ctx, tx, []*row{&a.rows[0], &a.rows[1]}, dedupeNow)
			if err != nil || len(rows) != 2 {
				t.Fatalf("first writer's claim: %v, %d rows", err, len(rows))
			}
			if err := first.copyRows(ctx, tx, rows, dedupeNow); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				waited := waitLockWaiter(ctx, h.dsn)
				end := tx.Rollback
				if commit {
					end = tx.Commit
				}
				done <- errors.Join(waited, end(ctx))
			}()
			// The second, on partition 0, with "x" at another time.
			res, err := h.w.write(ctx, batchAt(h.src, 0, 0, idAt{"w", 0}, idAt{"x", 9}), map[topicPartition]position{}, dedupeNow, nil)
			if err := <-done; err != nil {
				t.Fatalf("end the first transaction: %v", err)
			}
			if err != nil {
				t.Fatalf("second writer: %v", err)
			}
			want, dups := "w@0/0,x@0/0,y@0/1", 1
			if !commit {
				want, dups = "w@0/0,x@9/1", 0
			}
			if got := h.rawEvents(t); got != want {
				t.Errorf("raw events %s, want %s", got, want)
			}
			if res.idDuplicates[h.src] != dups {
				t.Errorf("id duplicates %d, want %d", res.idDuplicates[h.src], dups)
			}
		})
	}
}
