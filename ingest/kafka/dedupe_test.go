package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
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

// TestDuplicateOnlyOfStoredCopy: an event is a duplicate only of a copy
// that was stored. With the first copy of an event refused by the
// warehouse (a CHECK constraint) and the second taken, in one batch of one
// partition, the second is stored, with dedupe.by: event_id and without;
// and a replay of two dead letters of one event stores the one the
// warehouse now takes.
func TestDuplicateOnlyOfStoredCopy(t *testing.T) {
	for _, tt := range []struct{ name, yaml string }{
		{"by event_id", "    dedupe: {by: event_id, window: 2h}\n"},
		{"by event_id and time", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			b := setup(t, 1)
			b.yaml = tt.yaml
			exec := func(sql string) {
				t.Helper()
				if _, err := b.pool.Exec(ctx, sql); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			sale := func(id string, amount int) *kgo.Record {
				return &kgo.Record{Topic: b.topic, Value: fmt.Appendf(nil, `{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","amount":%d}`, id, amount)}
			}
			r := b.start(t)
			if err := waitfor.Poll(30*time.Second, func() bool {
				return ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM pg_class WHERE oid = to_regclass('raw.app_events')") == 1
			}); err != nil {
				t.Fatal("raw.app_events was not created")
			}
			exec(`ALTER TABLE raw.app_events ADD CONSTRAINT no_refunds CHECK ((payload->>'amount')::int >= 0)`)
			p := &produced{end: map[int32]int64{}}
			b.produce(t, p, []*kgo.Record{sale("X1", -5), sale("X1", 5), sale("X2", -5), sale("X2", -3)})
			b.waitStored(t, p.end, time.Minute)
			r.stop(t)
			amounts := func() string {
				t.Helper()
				rows, err := b.pool.Query(ctx, `SELECT event_id || '=' || (payload->>'amount') FROM raw.app_events ORDER BY 1`)
				if err != nil {
					t.Fatal(err)
				}
				got, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				return strings.Join(got, ",")
			}
			if got := amounts(); got != "X1=5" {
				t.Errorf("raw holds %s, want X1=5: the refused first copy made the second a duplicate", got)
			}
			if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters WHERE reason = 'rejected'"); n != 3 {
				t.Errorf("%d rejected dead letters, want 3", n)
			}

			// The warehouse now takes -3, not -5: the replay stores X2=-3.
			exec(`ALTER TABLE raw.app_events DROP CONSTRAINT no_refunds`)
			exec(`ALTER TABLE raw.app_events ADD CONSTRAINT no_big_refunds CHECK ((payload->>'amount')::int >= -4)`)
			rep, err := kafka.Replay(ctx, pgtest.Conn(t, b.dsn), kafka.ConfigFrom(b.config(t)), kafka.ReplayOptions{Source: "app_events", Now: b.clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Loaded != 1 || rep.Failing["rejected"] != 1 || rep.AlreadyStored != 1 {
				t.Errorf("replay: loaded %d, failing %v, already stored %d; want 1 loaded (X2=-3), 1 rejected (X2=-5), 1 already stored (X1=-5)",
					rep.Loaded, rep.Failing, rep.AlreadyStored)
			}
			if got := amounts(); got != "X1=5,X2=-3" {
				t.Errorf("raw holds %s after the replay, want X1=5,X2=-3", got)
			}
		})
	}
}
