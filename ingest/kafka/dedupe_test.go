package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
)

// event is a record of the dedupe tests: id and event time at minute min
// past 10:00 on testNow's day, sent to partition part.
func (b *bundle) event(part int32, id string, min int) *kgo.Record {
	at := time.Date(2026, 10, 5, 10, min, 0, 0, time.UTC)
	return &kgo.Record{Topic: b.topic, Partition: part,
		Value: fmt.Appendf(nil, `{"event_id":%q,"event_time":%q}`, id, at.Format(time.RFC3339))}
}

// rawEvents lists raw.app_events as "id@minute" in id, time order.
func (b *bundle) rawEvents(t *testing.T) string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT format('%s@%s', event_id, extract(minute FROM event_time))
		FROM raw.app_events ORDER BY event_id, event_time`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(got, ",")
}

// TestDedupeByEventID: with dedupe.by: event_id, an event sent again with
// another time, from another partition and after the ingester restarted,
// is dropped and counted; without it, each copy is stored.
func TestDedupeByEventID(t *testing.T) {
	tests := []struct {
		name   string
		yaml   string
		want   string // raw events at the end
		idDups [2]float64
	}{
		{"by event_id", "    dedupe: {by: event_id, window: 7d}\n", "a@0,b@0,c@0", [2]float64{1, 1}},
		{"none", "", "a@0,a@5,a@10,b@0,c@0", [2]float64{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t, 2)
			b.yaml = tt.yaml
			p := &produced{end: map[int32]int64{}}
			b.produce(t, p, []*kgo.Record{b.event(0, "a", 0), b.event(1, "b", 0)})
			r := b.start(t)
			b.waitStored(t, p.end, time.Minute)
			// A retry of "a" with a new time, on the other partition.
			b.produce(t, p, []*kgo.Record{b.event(1, "a", 5)})
			b.waitStored(t, p.end, time.Minute)
			r.stop(t)
			if got := counterSum(t, r, "tidemark_ingest_duplicate_ids_total"); got != tt.idDups[0] {
				t.Errorf("before the restart: duplicate ids metric %v, want %v", got, tt.idDups[0])
			}

			// Another retry after a restart: the id was committed.
			r = b.start(t)
			b.produce(t, p, []*kgo.Record{b.event(0, "a", 10), b.event(0, "c", 0)})
			b.waitStored(t, p.end, time.Minute)
			r.stop(t)
			if got := counterSum(t, r, "tidemark_ingest_duplicate_ids_total"); got != tt.idDups[1] {
				t.Errorf("after the restart: duplicate ids metric %v, want %v", got, tt.idDups[1])
			}
			if got := b.rawEvents(t); got != tt.want {
				t.Errorf("raw events %s, want %s", got, tt.want)
			}
			want := 5 - int64(strings.Count(tt.want, "@"))
			if n := ingesttest.Scalar(t, b.pool, "SELECT sum(duplicates)::bigint FROM tidemark.kafka_offsets"); n != want {
				t.Errorf("duplicates counted %d, want %d", n, want)
			}
		})
	}
}
