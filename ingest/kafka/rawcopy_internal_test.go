package kafka

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/copybinary"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// rawRowsSQL renders a raw table's rows; %s is the table.
const rawRowsSQL = `SELECT concat_ws('|', event_id, event_time, ingested_at, payload::text, kafka_topic, kafka_partition, kafka_offset)
FROM %s ORDER BY kafka_offset`

// TestRawCopyMatchesPgx: the binary COPY that the writer encodes itself
// stores exactly what pgx's CopyFrom stores for the same rows, at the
// edges of each column type and across the encoder's chunks.
func TestRawCopyMatchesPgx(t *testing.T) {
	h := newWriterHarness(t)
	ctx := context.Background()
	viaPgx := h.source(t, "app_events_pgx")
	h.w.rawBinary = map[*source]bool{viaPgx: false}

	times := []time.Time{
		time.Date(2026, 10, 5, 10, 0, 0, 123456789, time.UTC),            // nanoseconds: truncated
		time.Date(1969, 12, 31, 23, 59, 59, 999999500, time.UTC),         // before the Unix epoch
		time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.UTC),         // before PostgreSQL's
		time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC),                      // the first year
		time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),         // the last
		time.Date(2026, 10, 5, 12, 30, 0, 0, time.FixedZone("x", 19800)), // not UTC
	}
	ids := []string{"a", "é漢字😀", strings.Repeat("x", decode.MaxIDBytes), "-12", `quote"back\slash`}
	b := newBatch()
	offset := int64(math.MaxInt64 - 10_000)
	for i := range 3000 {
		payload := fmt.Sprintf(`{"i": %d, "s": "é\u0001\\n", "n": [1.50, 1e400]}`, i)
		if i%500 == 7 {
			// Larger than a chunk: split across reads.
			payload = fmt.Sprintf(`{"i": %d, "big": %q}`, i, strings.Repeat("ab", copybinary.Chunk))
		}
		ev := decode.Event{ID: fmt.Sprintf("%s-%d", ids[i%len(ids)], i), Time: times[i%len(times)], Payload: []byte(payload)}
		for _, src := range []*source{h.src, viaPgx} {
			r := &kgo.Record{Topic: "t-" + src.name + "-é", Partition: math.MaxInt32, Offset: offset + int64(i), Value: ev.Payload}
			b.add(src, r, ev, nil, time.Now())
		}
	}
	res, err := h.w.write(ctx, b, map[topicPartition]position{}, time.Date(2026, 10, 5, 12, 0, 0, 999, time.UTC), nil)
	if err != nil || !res.committed {
		t.Fatalf("write: %v (committed %v)", err, res.committed)
	}
	if !h.w.rawBinary[h.src] {
		t.Fatal("the writer did not encode raw.app_events itself")
	}
	got := h.strings(t, fmt.Sprintf(rawRowsSQL, "raw.app_events"))
	want := h.strings(t, fmt.Sprintf(rawRowsSQL, "raw.app_events_pgx"))
	if len(got) != 3000 || len(want) != 3000 {
		t.Fatalf("stored %d rows encoded here and %d through pgx, want 3000 each", len(got), len(want))
	}
	for i := range got {
		g := strings.Replace(got[i], "t-app_events-é", "t-app_events_pgx-é", 1)
		if g != want[i] {
			t.Fatalf("row %d differs:\nencoded here: %.300s\nthrough pgx:  %.300s", i, g, want[i])
		}
	}
}

// TestRawCopyOtherColumnTypes: a raw table created beforehand with other
// column types is written through pgx, which encodes for them.
func TestRawCopyOtherColumnTypes(t *testing.T) {
	h := newWriterHarness(t)
	ctx := context.Background()
	if pgtest.OnCitus() {
		// Citus cannot change the type of a distribution column; a table
		// of other types is one created before, on the coordinator.
		if _, err := h.w.conn.Exec(ctx, `SELECT undistribute_table('raw.app_events')`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.w.conn.Exec(ctx, `ALTER TABLE raw.app_events ALTER COLUMN payload TYPE json, ALTER COLUMN event_id TYPE varchar(300)`); err != nil {
		t.Fatal(err)
	}
	res, err := h.writeBatches(t)(h.batchOf(0, "e1", "e2"))
	if err != nil || !res.committed {
		t.Fatalf("write: %v (committed %v)", err, res.committed)
	}
	if fast, known := h.w.rawBinary[h.src]; !known || fast {
		t.Errorf("rawBinary = %v (known %v), want false", fast, known)
	}
	pgtest.Equal(t, "rows", h.strings(t, `SELECT event_id || ' ' || payload::text FROM raw.app_events ORDER BY 1`),
		[]string{`e1 {"event_id":"e1"}`, `e2 {"event_id":"e2"}`})
}
