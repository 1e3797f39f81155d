package kafka

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// storedOnceRecord is one record of FuzzStoredOnce: an event id, its
// minute past 10:00, its amount (the warehouse refuses amounts below the
// floor the test sets) and its position.
type storedOnceRecord struct {
	id     string
	minute int
	amount int
	part   int32
	offset int64
}

// key is what makes two records copies of one event: the id with
// dedupe.by: event_id, the id and time without.
func (r storedOnceRecord) key(dedupe bool) string {
	if dedupe {
		return r.id
	}
	return fmt.Sprintf("%s@%d", r.id, r.minute)
}

// storedOnceModel is what must be stored: the copies of each event are
// tried in record order until one the warehouse takes is stored; the
// copies before it are dead letters, those after it duplicates. A replay
// tries the dead letters of each event not stored in the same way.
type storedOnceModel struct {
	stored map[string]storedOnceRecord // by key, the copy stored
	dead   []storedOnceRecord          // refused, in order, not replayed
}

func (m *storedOnceModel) run(recs []storedOnceRecord, dedupe bool, floor int) {
	var next []storedOnceRecord
	for _, r := range recs {
		k := r.key(dedupe)
		if _, ok := m.stored[k]; ok {
			continue // a copy of an event stored: replayed as a duplicate
		}
		if r.amount >= floor {
			m.stored[k] = r
			continue
		}
		next = append(next, r)
	}
	m.dead = next
}

// FuzzStoredOnce: batches of events with random copies (the same id, or
// the same id and time) of which the warehouse refuses random ones (a
// CHECK constraint), written as the ingester does (row by row once a
// COPY failed) and then replayed after the constraint is relaxed, with and
// without dedupe.by: event_id: every event that has a copy the warehouse
// takes is stored exactly once, as its first such copy, and the copies
// refused before it are the dead letters left. make test runs the seeds;
// make fuzz explores.
func FuzzStoredOnce(f *testing.F) {
	h := newWriterHarnessOn(f, pgtest.NewDatabase(f))
	ctx := context.Background()
	for seed := range uint64(6) {
		f.Add(seed, true, uint8(30), uint8(2))
		f.Add(seed, false, uint8(30), uint8(1))
	}
	f.Fuzz(func(t *testing.T, seed uint64, dedupe bool, n, batches uint8) {
		recs := storedOnceCase(seed, 1+int(n%40))
		cfg := h.storedOnceReset(t, dedupe)
		now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
		model := &storedOnceModel{stored: map[string]storedOnceRecord{}}

		// The run: the records in 1 to 3 consecutive batches.
		stored := map[topicPartition]position{}
		cuts := 1 + int(batches%3)
		for i := range cuts {
			part := recs[i*len(recs)/cuts : (i+1)*len(recs)/cuts]
			if len(part) > 0 {
				h.writeLikeIngester(t, storedOnceBatch(h.src, part), stored, now)
			}
		}
		model.run(recs, dedupe, 0)
		h.checkStoredOnce(t, "after the run", model, dedupe)

		// The replay, with amounts of -2 and more taken.
		h.exec(t, `ALTER TABLE raw.app_events DROP CONSTRAINT amount_floor`)
		h.exec(t, `ALTER TABLE raw.app_events ADD CONSTRAINT amount_floor CHECK ((payload->>'amount')::int >= -2)`)
		if _, err := Replay(ctx, h.w.conn, ConfigFrom(cfg), ReplayOptions{Source: "app_events", Now: func() time.Time { return now }}); err != nil {
			t.Fatalf("replay: %v", err)
		}
		model.run(model.dead, dedupe, -2)
		h.checkStoredOnce(t, "after the replay", model, dedupe)
	})
}

// storedOnceReset empties the tables FuzzStoredOnce writes, sets the
// constraint that refuses negative amounts and the source's dedupe, and
// returns the configuration a replay reads.
func (h *writerHarness) storedOnceReset(t *testing.T, dedupe bool) *config.Config {
	t.Helper()
	h.exec(t, `TRUNCATE raw.app_events, tidemark.event_ids, tidemark.dead_letters, tidemark.kafka_offsets, tidemark.ingest_ledger`)
	h.exec(t, `ALTER TABLE raw.app_events DROP CONSTRAINT IF EXISTS amount_floor`)
	h.exec(t, `ALTER TABLE raw.app_events ADD CONSTRAINT amount_floor CHECK ((payload->>'amount')::int >= 0)`)
	h.w.probeLeft, h.w.dedupeLeft = 0, 0
	h.src.dedupeWindow = 0
	extra := ""
	if dedupe {
		h.src.dedupeWindow = 2 * time.Hour
		extra = "\n    dedupe: {by: event_id, window: 2h}"
	}
	cfg, err := config.Parse("test.yaml", fmt.Appendf(nil, `
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: ["127.0.0.1:1"], group: g}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time%s
`, h.dsn, extra), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// writeLikeIngester writes b as the ingester does: again at once after a
// COPY failed on an event stored before, and row by row after it failed
// on a row the warehouse refuses.
func (h *writerHarness) writeLikeIngester(t *testing.T, b *batch, stored map[topicPartition]position, now time.Time) {
	t.Helper()
	check := map[*source]bool{}
	for range 10 {
		_, err := h.w.write(context.Background(), b, stored, now, check)
		switch {
		case err == nil:
			for tp, pb := range b.parts {
				stored[tp] = pb.next
			}
			return
		case errors.Is(err, errBadRow) && !check[h.src]:
			check[h.src] = true
		case errors.Is(err, errStoredBefore) || errors.Is(err, errRetryNow):
		default:
			t.Fatalf("write: %v", err)
		}
	}
	t.Fatal("write: no attempt of ten succeeded")
}

// checkStoredOnce compares raw.app_events and the dead letters not
// replayed with the model.
func (h *writerHarness) checkStoredOnce(t *testing.T, when string, m *storedOnceModel, dedupe bool) {
	t.Helper()
	key := "event_id"
	if !dedupe {
		key = "event_id || '@' || extract(minute FROM event_time)"
	}
	got := h.strings(t, "SELECT "+key+" || '=' || (payload->>'offset') FROM raw.app_events ORDER BY 1")
	var want []string
	for k, r := range m.stored {
		want = append(want, fmt.Sprintf("%s=%d/%d", k, r.part, r.offset))
	}
	slices.Sort(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("%s: raw holds %v, want each event once as its first copy taken: %v", when, got, want)
	}
	dead := h.strings(t, `SELECT convert_from(record_value, 'UTF8')::jsonb->>'offset' FROM tidemark.dead_letters
		WHERE replayed_at IS NULL ORDER BY id`)
	var wantDead []string
	for _, r := range m.dead {
		wantDead = append(wantDead, fmt.Sprintf("%d/%d", r.part, r.offset))
	}
	if strings.Join(dead, " ") != strings.Join(wantDead, " ") {
		t.Errorf("%s: dead letters not replayed %v, want %v", when, dead, wantDead)
	}
}

func (h *writerHarness) exec(t *testing.T, sql string) {
	t.Helper()
	if _, err := h.w.conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// storedOnceCase generates the records of one input.
func storedOnceCase(seed uint64, n int) []storedOnceRecord {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ids := max(1, n/3)
	offsets := [2]int64{}
	recs := make([]storedOnceRecord, n)
	for i := range recs {
		part := int32(rng.IntN(2))
		amount := rng.IntN(10) + 1
		if rng.Float64() < 0.4 {
			amount = -rng.IntN(3) - 1 // -1 to -3
		}
		recs[i] = storedOnceRecord{id: fmt.Sprintf("x%d", rng.IntN(ids)), minute: rng.IntN(2), amount: amount,
			part: part, offset: offsets[part]}
		offsets[part]++
	}
	return recs
}

// storedOnceBatch builds the batch of recs for src.
func storedOnceBatch(src *source, recs []storedOnceRecord) *batch {
	b := newBatch()
	for _, r := range recs {
		at := time.Date(2026, 10, 5, 10, r.minute, 0, 0, time.UTC)
		rec := &kgo.Record{Topic: "events", Partition: r.part, Offset: r.offset,
			Value: fmt.Appendf(nil, `{"event_id":%q,"event_time":%q,"amount":%d,"offset":"%d/%d"}`,
				r.id, at.Format(time.RFC3339), r.amount, r.part, r.offset)}
		b.add(src, rec, decode.Event{ID: r.id, Time: at, Payload: rec.Value}, nil, time.Now())
	}
	return b
}
