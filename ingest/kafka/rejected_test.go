package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// poisonTriggerSQL makes the warehouse refuse rows whose payload has a
// "poison" key, with a data exception, as a domain check or a stricter
// type in the warehouse would.
const poisonTriggerSQL = `
CREATE FUNCTION raw.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.payload ? 'poison' THEN
        RAISE EXCEPTION 'poisoned event %', NEW.event_id USING ERRCODE = 'data_exception';
    END IF;
    IF NEW.payload ? 'venom' THEN
        RAISE EXCEPTION 'poisoned event %', NEW.event_id; -- P0001, a trigger's default
    END IF;
    RETURN NEW;
END $$;
-- statement
CREATE TRIGGER refuse_poison BEFORE INSERT ON raw.app_events
    FOR EACH ROW EXECUTE FUNCTION raw.refuse_poison();`

// TestRowsTheWarehouseRefuses checks the slow path: when PostgreSQL
// refuses a row that decoded fine, the batch is retried row by row and the
// refused rows become dead letters with the reason "rejected"; nothing
// else is lost or blocked.
func TestRowsTheWarehouseRefuses(t *testing.T) {
	b := setup(t, 2)
	// Create the raw table first, then arm the trigger.
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, []*kgo.Record{{Topic: b.topic, Partition: 0,
		Value: []byte(`{"event_id":"warmup","event_time":"2026-10-05T10:00:00Z"}`)}})
	r := b.start(t)
	b.waitStored(t, p.end, time.Minute)
	conn, err := b.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if pgtest.OnCitus() {
		// Citus runs the trigger on the shards, which it allows on request.
		if _, err := conn.Exec(context.Background(), "SET citus.enable_unsafe_triggers = on"); err != nil {
			t.Fatal(err)
		}
	}
	// One statement at a time: Citus propagates each to the workers.
	for _, stmt := range strings.Split(poisonTriggerSQL, "-- statement\n") {
		if _, err := conn.Exec(context.Background(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	conn.Release()

	want := map[string]bool{"warmup": true}
	var recs []*kgo.Record
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("ev-%d", i)
		extra := ""
		switch {
		case i%100 == 7:
			extra = `,"poison":true`
		case i == 150:
			extra = `,"venom":true`
		default:
			want[id] = true
		}
		recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i % 2), Key: []byte(id),
			Value: []byte(fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:%02d:00Z"%s}`, id, i%60, extra))})
	}
	b.produce(t, p, recs)
	b.waitStored(t, p.end, time.Minute)
	// Later batches take the fast path again.
	b.produce(t, p, []*kgo.Record{{Topic: b.topic, Partition: 1, Value: []byte(`{"event_id":"after","event_time":"2026-10-05T11:00:00Z"}`)}})
	want["after"] = true
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)

	ingesttest.AssertRaw(t, b.pool, "app_events", want)
	ingesttest.AssertLedger(t, b.pool, "app_events")
	rows, err := b.pool.Query(context.Background(), "SELECT convert_from(record_key, 'UTF8'), reason, detail FROM tidemark.dead_letters ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var key, reason, detail string
		if err := rows.Scan(&key, &reason, &detail); err != nil {
			t.Fatal(err)
		}
		if reason != "rejected" || !strings.Contains(detail, "poisoned event "+key) {
			t.Errorf("dead letter %s: %s %q", key, reason, detail)
		}
		got = append(got, key)
	}
	if strings.Join(got, ",") != "ev-107,ev-150,ev-207,ev-7" {
		t.Errorf("dead letters %v, want ev-107, ev-150, ev-207, ev-7", got)
	}
	if n := counterSum(t, r, "tidemark_ingest_dead_letters_total"); n != 4 {
		t.Errorf("dead letter metric %v, want 4", n)
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT sum(dead_letters)::bigint FROM tidemark.kafka_offsets"); n != 4 {
		t.Errorf("kafka_offsets.dead_letters sums to %d, want 4", n)
	}
}
