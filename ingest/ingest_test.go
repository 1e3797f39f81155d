package ingest_test

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestExactlyTheGoodEvents is acceptance item 1: 200k records over four
// partitions with 1% duplicates and 0.5% bad records of four kinds.
func TestExactlyTheGoodEvents(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	b := setup(t, 4)
	w := makeWorkload(n, 4, 1, 0.005, 0.01)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, w.recs)
	r := b.start(t)
	b.waitStored(t, p.end, 5*time.Minute)
	r.stop(t)

	// The raw table holds exactly the distinct good events.
	b.assertRawEquals(t, w.good)

	// dead_letters holds exactly the bad records, bytes intact, with the
	// right reasons.
	rows, err := b.pool.Query(context.Background(),
		"SELECT record_key, record_value, reason, header_keys[1], header_values[1], topic, partition, \"offset\" FROM tidemark.dead_letters")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for rows.Next() {
		var key, value, hk, hv []byte
		var reason, topic string
		var part int32
		var off int64
		if err := rows.Scan(&key, &value, &reason, &hk, &hv, &topic, &part, &off); err != nil {
			t.Fatal(err)
		}
		want, ok := w.bad[string(key)]
		switch {
		case !ok:
			t.Errorf("unexpected dead letter key=%q reason=%s", key, reason)
		case seen[string(key)]:
			t.Errorf("dead letter %q stored twice", key)
		case reason != want.reason:
			t.Errorf("dead letter %q: reason %s, want %s", key, reason, want.reason)
		case !bytes.Equal(value, want.value):
			t.Errorf("dead letter %q: value changed: %q", key, value)
		case string(hk) != "trace" || string(hv) != "t-"+string(key):
			t.Errorf("dead letter %q: header %q=%q", key, hk, hv)
		case topic != "events" || off < 0 || part < 0 || part > 3:
			t.Errorf("dead letter %q: coordinates %s/%d/%d", key, topic, part, off)
		}
		seen[string(key)] = true
	}
	rows.Close()
	if len(seen) != len(w.bad) {
		t.Errorf("dead letters: %d, want %d", len(seen), len(w.bad))
	}

	// Stored offsets equal the end offsets.
	stored := b.storedOffsets(t)
	for part, end := range p.end {
		if stored[part] != end {
			t.Errorf("partition %d: stored offset %d, end offset %d", part, stored[part], end)
		}
	}

	// Ledger row counts sum to the raw row count.
	raw := b.scalar(t, "SELECT count(*) FROM raw.app_events")
	ledger := b.scalar(t, "SELECT coalesce(sum(rows), 0)::bigint FROM tidemark.ingest_ledger WHERE source = 'app_events'")
	t.Logf("raw=%d ledger=%d dead=%d dups=%d", raw, ledger, len(seen), w.dups)
	if ledger != raw {
		t.Errorf("ledger rows %d, raw rows %d", ledger, raw)
	}
	// Ledger rows describe their bucket correctly.
	bad := b.scalar(t, `SELECT count(*) FROM tidemark.ingest_ledger
		WHERE min_event_time < bucket OR max_event_time >= bucket + interval '1 hour' OR min_event_time > max_event_time`)
	if bad != 0 {
		t.Errorf("%d ledger rows with event times outside their bucket", bad)
	}
	// Duplicates and dead letters are counted, in the table and in metrics.
	dups := b.scalar(t, "SELECT sum(duplicates)::bigint FROM tidemark.kafka_offsets")
	if dups != int64(w.dups) {
		t.Errorf("duplicates counted %d, produced %d", dups, w.dups)
	}
	if got := counterSum(t, r, "tidemark_ingest_duplicates_total"); int(got) != w.dups {
		t.Errorf("duplicates metric %v, produced %d", got, w.dups)
	}
	if got := int(counterSum(t, r, "tidemark_ingest_dead_letters_total")); got != len(w.bad) {
		t.Errorf("dead letter metric %d, want %d", got, len(w.bad))
	}
	if got := int(counterSum(t, r, "tidemark_ingest_rows_written_total")); int64(got) != raw {
		t.Errorf("rows written metric %d, raw rows %d", got, raw)
	}
	// ingested_at is the service clock's time.
	if n := b.scalar(t, "SELECT count(*) FROM raw.app_events WHERE ingested_at <> $1", testNow); n != 0 {
		t.Errorf("%d raw rows not stamped with the service clock", n)
	}
}
