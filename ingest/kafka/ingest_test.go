package kafka_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
)

// TestExactlyTheGoodEvents is acceptance item 1: 200k records over four
// partitions with 1% duplicates and 0.5% bad records of four kinds.
func TestExactlyTheGoodEvents(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	b := setup(t, 4)
	w := ingesttest.Make(b.topic, n, 4, 1, 0.005, 0.01, testNow)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, w.Records)
	r := b.start(t)
	b.waitStored(t, p.end, 5*time.Minute)
	r.stop(t)

	// The raw table holds exactly the distinct good events; dead_letters
	// exactly the bad ones, bytes intact, with the right reasons; stored
	// offsets equal the end offsets; ledger row counts sum to raw rows.
	ingesttest.AssertRaw(t, b.pool, "app_events", w.Good)
	ingesttest.AssertDeadLetters(t, b.pool, w)
	ingesttest.AssertStoredEqual(t, b.pool, group, b.topic, p.end)
	ingesttest.AssertLedger(t, b.pool, "app_events")

	// Duplicates and dead letters are counted, in the table and in metrics.
	raw := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events")
	t.Logf("raw=%d dead=%d dups=%d", raw, len(w.Bad), w.Dups)
	if dups := ingesttest.Scalar(t, b.pool, "SELECT sum(duplicates)::bigint FROM tidemark.kafka_offsets"); dups != int64(w.Dups) {
		t.Errorf("duplicates counted %d, produced %d", dups, w.Dups)
	}
	if got := counterSum(t, r, "tidemark_ingest_duplicates_total"); int(got) != w.Dups {
		t.Errorf("duplicates metric %v, produced %d", got, w.Dups)
	}
	if got := int(counterSum(t, r, "tidemark_ingest_dead_letters_total")); got != len(w.Bad) {
		t.Errorf("dead letter metric %d, want %d", got, len(w.Bad))
	}
	if got := int64(counterSum(t, r, "tidemark_ingest_rows_written_total")); got != raw {
		t.Errorf("rows written metric %d, raw rows %d", got, raw)
	}
	// ingested_at is the service clock's time.
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE ingested_at <> $1", testNow); n != 0 {
		t.Errorf("%d raw rows not stamped with the service clock", n)
	}
}

// TestResentEventsAreDuplicates: events sent again after they were stored
// (a producer's retry, a replayed topic) are counted as duplicates and
// stored once, without a write error: the batch that meets them first
// fails its COPY, is retried at once and probes from then on.
func TestResentEventsAreDuplicates(t *testing.T) {
	b := setup(t, 1)
	w := ingesttest.Make(b.topic, 2_000, 1, 7, 0, 0, testNow)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, w.Records)
	r := b.start(t)
	b.waitStored(t, p.end, time.Minute)
	again := make([]*kgo.Record, len(w.Records))
	for i, rec := range w.Records {
		again[i] = &kgo.Record{Topic: rec.Topic, Partition: rec.Partition, Key: rec.Key, Value: rec.Value}
	}
	b.produce(t, p, again)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)

	ingesttest.AssertRaw(t, b.pool, "app_events", w.Good)
	ingesttest.AssertLedger(t, b.pool, "app_events")
	if got := int(counterSum(t, r, "tidemark_ingest_duplicates_total")); got != len(w.Records) {
		t.Errorf("duplicates metric %d, want %d", got, len(w.Records))
	}
	if got := counterSum(t, r, "tidemark_ingest_write_errors_total"); got != 0 {
		t.Errorf("write errors %v, want none", got)
	}
}
