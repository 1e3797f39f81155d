package kafka_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// Hostile Avro schemas: an array of nulls, which take no bytes, and a
// decimal whose scale no jsonb number can hold.
const (
	hostileNullsSchema = `{"type":"record","name":"Z","fields":[{"name":"event_id","type":"string"},` +
		`{"name":"event_time","type":"string"},{"name":"xs","type":{"type":"array","items":"null"}}]}`
	hostileDecimalSchema = `{"type":"record","name":"D","fields":[{"name":"event_id","type":"string"},` +
		`{"name":"event_time","type":"string"},` +
		`{"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":300000000,"scale":300000000}}]}`
)

// avroText appends s as an Avro string.
func avroText(b []byte, s string) []byte {
	return append(binary.AppendVarint(b, int64(len(s))), s...)
}

// TestHostileAvroRecords runs an Avro source through records that once
// took the process down, between good ones, in one partition: a 430-byte
// record whose array has 100 blocks of 16,777,216 nulls, and one of a
// decimal of scale 300,000,000. The ingester stays up and within a
// modest amount of memory, each hostile record is a dead letter with its
// exact bytes and its reason, and the good records after them load.
func TestHostileAvroRecords(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := avroBundle(t, 1, g)
	nullsID := g.Register("events-value", sr.Schema{Schema: hostileNullsSchema})
	decimalID := g.Register("decimals-value", sr.Schema{Schema: hostileDecimalSchema})
	good := srtest.AvroEncoder(t, nullsID, hostileNullsSchema)
	const at = "2026-10-05T11:00:00Z"
	wire := func(id int, payload []byte) []byte {
		return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(id)), payload...)
	}
	nulls := avroText(avroText(nil, "e1"), at)
	for range 100 {
		nulls = binary.AppendVarint(nulls, 1<<24)
	}
	nulls = wire(nullsID, append(nulls, 0))
	if len(nulls) != 430 {
		t.Fatalf("the hostile record is %d bytes, want 430", len(nulls))
	}
	decimal := wire(decimalID, append(avroText(avroText(nil, "e2"), at), 2, 1))
	hostile := map[string]struct {
		value  []byte
		reason string
		detail string
	}{
		"nulls": {nulls, "decode_limit", "at /xs: 16777216 items: more than the 46528 its budget has left"},
		"decimal": {decimal, "invalid_schema",
			"decimal scale 300000000: PostgreSQL's numeric, which a jsonb number is, holds at most 16383 digits after the point"},
	}
	recs := []*kgo.Record{
		{Topic: b.topic, Key: []byte("g1"), Value: good(map[string]any{"event_id": "g1", "event_time": at, "xs": []any{nil}})},
		{Topic: b.topic, Key: []byte("nulls"), Value: hostile["nulls"].value},
		{Topic: b.topic, Key: []byte("g2"), Value: good(map[string]any{"event_id": "g2", "event_time": at, "xs": []any{}})},
		{Topic: b.topic, Key: []byte("decimal"), Value: hostile["decimal"].value},
		{Topic: b.topic, Key: []byte("g3"), Value: good(map[string]any{"event_id": "g3", "event_time": at, "xs": []any{nil, nil}})},
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	r := b.start(t)
	b.waitStored(t, p.end, time.Minute)
	select {
	case err := <-r.done:
		t.Fatalf("the ingester stopped: %v", err)
	default:
	}
	// Decoding 1.6 billion nulls would take gigabytes; the whole run,
	// broker, registry and ingester, allocates some 15 MB.
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 256<<20 {
		t.Errorf("the run allocated %d bytes", n)
	}
	r.stop(t)

	var stored []string
	rows, err := b.pool.Query(context.Background(), "SELECT event_id FROM raw.app_events ORDER BY event_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(stored, ","); got != "g1,g2,g3" {
		t.Errorf("stored %s, want g1,g2,g3", got)
	}
	for key, h := range hostile {
		var reason, detail string
		var value []byte
		err := b.pool.QueryRow(context.Background(), "SELECT reason, detail, record_value FROM tidemark.dead_letters WHERE record_key = $1",
			[]byte(key)).Scan(&reason, &detail, &value)
		if err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		if reason != h.reason || !strings.Contains(detail, h.detail) || !bytes.Equal(value, h.value) {
			t.Errorf("%s: dead letter %s %q with %d bytes; want %s ...%s... with its %d bytes", key, reason, detail, len(value),
				h.reason, h.detail, len(h.value))
		}
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != int64(len(hostile)) {
		t.Errorf("%d dead letters, want %d", n, len(hostile))
	}
}
