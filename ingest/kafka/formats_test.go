package kafka_test

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// avroBundle is a bundle whose source app_events reads Avro through the
// in-test registry g.
func avroBundle(t *testing.T, parts int32, g *srtest.Registry) *bundle {
	t.Helper()
	b := setup(t, parts)
	b.yaml = "    format: avro\n"
	b.kafkaYAML = fmt.Sprintf("schema_registry: {url: %q, timeout: 300ms}\n", g.URL())
	return b
}

// eventSchema is an Avro record of an event id, an event time and a
// field v of the type given (a JSON schema fragment).
func eventSchema(name, v string) string {
	return fmt.Sprintf(`{"type":"record","name":%q,"namespace":"test","fields":[
		{"name":"event_id","type":"string"},
		{"name":"event_time","type":{"type":"long","logicalType":"timestamp-millis"}},
		{"name":"v","type":%s}]}`, name, v)
}

// TestAvroLogicalTypes loads one record per Avro type through the
// registry, with records produced by franz-go's serde, and checks that
// each value is stored as the same jsonb as its JSON equivalent, written
// exactly so (decimals keep their scale).
func TestAvroLogicalTypes(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := avroBundle(t, 1, g)
	ts := time.Date(2026, 10, 5, 9, 15, 0, 123_000_000, time.UTC)
	tests := []struct {
		name  string
		typ   string
		value any
		json  string
	}{
		{"int", `"int"`, int32(-42), `-42`},
		{"long", `"long"`, int64(math.MaxInt64), `9223372036854775807`},
		{"float", `"float"`, float32(0.1), `0.1`},
		{"double", `"double"`, 1234567.125, `1234567.125`},
		{"nan", `"double"`, math.NaN(), `"NaN"`},
		{"infinity", `"float"`, float32(math.Inf(1)), `"Infinity"`},
		{"boolean", `"boolean"`, false, `false`},
		{"string", `"string"`, "héllo \"wörld\"\n✓", `"héllo \"wörld\"\n✓"`},
		{"bytes", `"bytes"`, []byte("\x00\x01tidemark\xff"), `"AAF0aWRlbWFya/8="`},
		{"fixed", `{"type":"fixed","name":"F4","size":4}`, [4]byte{0xde, 0xad, 0xbe, 0xef}, `"3q2+7w=="`},
		{"enum", `{"type":"enum","name":"Color","symbols":["RED","GREEN"]}`, "GREEN", `"GREEN"`},
		{"array", `{"type":"array","items":"string"}`, []string{"a", "b"}, `["a","b"]`},
		{"map", `{"type":"map","values":"int"}`, map[string]int32{"x": 1, "y": 2}, `{"x":1,"y":2}`},
		{"nullable null", `["null","long"]`, nil, `null`},
		{"nullable value", `["long","null"]`, int64(7), `7`},
		{"union", `["null","string","long"]`, map[string]any{"long": int64(9)}, `{"long":9}`},
		{"nested record", `{"type":"record","name":"Addr","fields":[{"name":"city","type":"string"},{"name":"zip","type":["null","int"]}]}`,
			map[string]any{"city": "Oslo", "zip": nil}, `{"city":"Oslo","zip":null}`},
		{"timestamp-millis", `{"type":"long","logicalType":"timestamp-millis"}`, ts, `"2026-10-05T09:15:00.123Z"`},
		{"timestamp-micros", `{"type":"long","logicalType":"timestamp-micros"}`, ts.Add(4 * time.Microsecond), `"2026-10-05T09:15:00.123004Z"`},
		{"local-timestamp-micros", `{"type":"long","logicalType":"local-timestamp-micros"}`, ts, `"2026-10-05T09:15:00.123Z"`},
		{"date", `{"type":"int","logicalType":"date"}`, ts, `"2026-10-05"`},
		{"time-millis", `{"type":"int","logicalType":"time-millis"}`, 9*time.Hour + 15*time.Minute + 123*time.Millisecond, `"09:15:00.123"`},
		{"time-micros", `{"type":"long","logicalType":"time-micros"}`, 23*time.Hour + 59*time.Minute + 59*time.Second, `"23:59:59"`},
		{"decimal", `{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}`, big.NewRat(1230, 100), `12.30`},
		{"negative decimal", `{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}`, big.NewRat(-5, 100), `-0.05`},
		{"decimal scale 0", `{"type":"bytes","logicalType":"decimal","precision":10,"scale":0}`, big.NewRat(100, 1), `100`},
		{"large decimal", `{"type":"bytes","logicalType":"decimal","precision":38,"scale":10}`,
			new(big.Rat).SetFrac(new(big.Int).Exp(big.NewInt(10), big.NewInt(27), nil), big.NewInt(3)), `333333333333333333333333333.3333333333`},
		{"fixed decimal", `{"type":"fixed","name":"Money","size":8,"logicalType":"decimal","precision":18,"scale":4}`, big.NewRat(-98765, 10000), `-9.8765`},
		{"uuid", `{"type":"string","logicalType":"uuid"}`, "f81d4fae-7dec-11d0-a765-00a0c91e6bf6", `"f81d4fae-7dec-11d0-a765-00a0c91e6bf6"`},
		{"duration", `{"type":"fixed","name":"Dur","size":12,"logicalType":"duration"}`, avro.LogicalDuration{Months: 2, Days: 3, Milliseconds: 4500}, `{"months":2,"days":3,"milliseconds":4500}`},
	}
	var recs []*kgo.Record
	for i, tt := range tests {
		schema := eventSchema(fmt.Sprintf("E%d", i), tt.typ)
		id := g.Register(fmt.Sprintf("events-value-%d", i), sr.Schema{Schema: schema})
		value := srtest.AvroEncoder(t, id, schema)(map[string]any{"event_id": tt.name, "event_time": ts, "v": tt.value})
		recs = append(recs, &kgo.Record{Topic: b.topic, Value: value})
	}
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	r := b.start(t)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	for _, tt := range tests {
		var got, want string
		var eventTime time.Time
		err := b.pool.QueryRow(context.Background(), `SELECT (payload->'v')::text, $2::jsonb::text, event_time FROM raw.app_events WHERE event_id = $1`,
			tt.name, tt.json).Scan(&got, &want, &eventTime)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got != want || !eventTime.Equal(ts) {
			t.Errorf("%s: stored %s at %s, want %s (the jsonb of %s) at %s", tt.name, got, eventTime, want, tt.json, ts)
		}
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// TestAvroSchemaEvolution loads records of three versions of a schema, in
// one partition: a field added with a default, then one removed. Each
// record is stored with the fields of the schema it was written with.
func TestAvroSchemaEvolution(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := avroBundle(t, 1, g)
	const (
		v1 = `{"type":"record","name":"Order","fields":[{"name":"event_id","type":"string"},{"name":"event_time","type":"string"},{"name":"amount","type":"int"}]}`
		v2 = `{"type":"record","name":"Order","fields":[{"name":"event_id","type":"string"},{"name":"event_time","type":"string"},{"name":"amount","type":"int"},{"name":"currency","type":"string","default":"EUR"}]}`
		v3 = `{"type":"record","name":"Order","fields":[{"name":"event_id","type":"string"},{"name":"event_time","type":"string"},{"name":"currency","type":"string","default":"EUR"}]}`
	)
	enc := map[int]func(any) []byte{}
	for i, s := range []string{v1, v2, v3} {
		enc[i+1] = srtest.AvroEncoder(t, g.Register("orders-value", sr.Schema{Schema: s}), s)
	}
	want := map[string]string{}
	var recs []*kgo.Record
	for i := range 30 {
		v := i%3 + 1
		id := fmt.Sprintf("o-%d", i)
		fields := map[string]any{"event_id": id, "event_time": "2026-10-05T10:00:00Z", "amount": int32(i), "currency": "NOK"}
		switch v {
		case 1:
			want[id] = fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","amount":%d}`, id, i)
		case 2:
			want[id] = fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","amount":%d,"currency":"NOK"}`, id, i)
		case 3:
			delete(fields, "amount")
			want[id] = fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","currency":"NOK"}`, id)
		}
		recs = append(recs, &kgo.Record{Topic: b.topic, Value: enc[v](fields)})
	}
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	r := b.start(t)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	for id, w := range want {
		if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE event_id = $1 AND payload = $2::jsonb", id, w); n != 1 {
			t.Errorf("%s: not stored as %s", id, w)
		}
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events"); n != int64(len(want)) {
		t.Errorf("%d rows, want %d", n, len(want))
	}
}

// TestAvroDeadLetters checks that each bad record is a dead letter with
// its reason and its bytes, and that the records around it load.
func TestAvroDeadLetters(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := avroBundle(t, 1, g)
	schema := eventSchema("E", `"int"`)
	id := g.Register("events-value", sr.Schema{Schema: schema})
	protoID := g.Register("proto-value", sr.Schema{Schema: `syntax = "proto3"; message M { string id = 1; }`, Type: sr.TypeProtobuf})
	badID := g.Register("bad-value", sr.Schema{Schema: `{"type":"record","name":"B","fields":[{"name":"x","type":"Unknown"}]}`})
	enc := srtest.AvroEncoder(t, id, schema)
	ts := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	good := func(name string) []byte {
		return enc(map[string]any{"event_id": name, "event_time": ts, "v": int32(1)})
	}
	withID := func(v []byte, id int) []byte {
		v = append([]byte{}, v...)
		v[1], v[2], v[3], v[4] = byte(id>>24), byte(id>>16), byte(id>>8), byte(id)
		return v
	}
	bad := []struct {
		value  []byte
		reason string
	}{
		{[]byte(`{"event_id":"j","event_time":"2026-10-05T10:00:00Z"}`), decode.ReasonWrongFormat},
		{withID(good("u"), 4711), decode.ReasonUnknownSchema},
		{withID(good("p"), protoID), decode.ReasonWrongFormat},
		{withID(good("i"), badID), decode.ReasonInvalidSchema},
		{good("t")[:12], decode.ReasonSchemaMismatch},
		{append(good("x"), 0x02), decode.ReasonSchemaMismatch},
		{enc(map[string]any{"event_id": "old", "event_time": ts.AddDate(-1, 0, 0), "v": int32(1)}), decode.ReasonTimeOutOfRange},
	}
	var recs []*kgo.Record
	for i, c := range bad {
		recs = append(recs, &kgo.Record{Topic: b.topic, Key: []byte(fmt.Sprint(i)), Value: c.value},
			&kgo.Record{Topic: b.topic, Value: good(fmt.Sprintf("good-%d", i))})
	}
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	r := b.start(t)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	for i, c := range bad {
		var reason, detail string
		var value []byte
		err := b.pool.QueryRow(context.Background(), "SELECT reason, detail, record_value FROM tidemark.dead_letters WHERE record_key = $1",
			[]byte(fmt.Sprint(i))).Scan(&reason, &detail, &value)
		if err != nil {
			t.Errorf("bad record %d: %v", i, err)
			continue
		}
		if reason != c.reason || string(value) != string(c.value) {
			t.Errorf("bad record %d: %s (%s) with % x; want %s with % x", i, reason, detail, value, c.reason, c.value)
		}
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE event_id LIKE 'good-%'"); n != int64(len(bad)) {
		t.Errorf("%d good records stored, want %d", n, len(bad))
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != int64(len(bad)) {
		t.Errorf("%d dead letters, want %d", n, len(bad))
	}

	// Once the unknown schema is registered, a replay loads its record.
	g.RegisterAs("late-value", 4711, sr.Schema{Schema: schema})
	rep := b.replay(t, kafka.ReplayOptions{Reason: decode.ReasonUnknownSchema})
	checkReport(t, "replay of unknown_schema", rep, 1, 0, map[string]int{})
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE event_id = 'u'"); n != 1 {
		t.Errorf("the replayed record is stored %d times", n)
	}
}

// TestAvroRegistryOutage loads Avro records while the registry fails in
// three ways in turn (503 answers, 404 answers without Confluent's error
// code, requests that time out), each time when new schema ids appear. The
// partitions that wait stop exactly at the first record whose schema is
// missing, readiness says why, and once the registry answers everything
// loads once: no dead letter, no duplicate, every offset stored.
func TestAvroRegistryOutage(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := avroBundle(t, 2, g)
	opts := kafka.Options{}
	kafka.SetRegistryRetry(&opts, 20*time.Millisecond, 200*time.Millisecond)
	r := b.startWith(t, opts)
	ts := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	p := &produced{end: map[int32]int64{}}
	total := 0
	// batch produces n records on each partition with enc; newSchema
	// registers a new schema (an id unknown to the ingester's cache) and
	// makes enc its encoder.
	var enc func(any) []byte
	batch := func(phase string, n int) {
		var recs []*kgo.Record
		for i := range 2 * n {
			recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i % 2),
				Value: enc(map[string]any{"event_id": fmt.Sprintf("%s-%d", phase, i), "event_time": ts, "v": int32(i)})})
		}
		b.produce(t, p, recs)
		total += len(recs)
	}
	newSchema := func(name string) {
		schema := eventSchema("E"+strings.NewReplacer(" ", "", "0", "z", "4", "f", "5", "v").Replace(name), `"int"`)
		enc = srtest.AvroEncoder(t, g.Register("events-value", sr.Schema{Schema: schema}), schema)
	}
	newSchema("before")
	batch("before", 100)
	b.waitStored(t, p.end, time.Minute)

	outages := []struct {
		name string
		fail func()
	}{
		{"503", func() { g.Fail(http.StatusServiceUnavailable, `{"error_code":50301,"message":"unavailable"}`) }},
		{"404 without error code", func() { g.Fail(http.StatusNotFound, "<html>404 page not found</html>") }},
		{"timeout", g.Hang},
	}
	for _, o := range outages {
		failedBefore := counterSum(t, r, "tidemark_schema_registry_errors_total")
		o.fail()
		// Records of a cached schema load during the outage, up to the
		// first record of the new schema.
		batch(o.name+" cached", 20)
		stuck := map[int32]int64{}
		for part, end := range p.end {
			stuck[part] = end
		}
		newSchema(o.name)
		batch(o.name, 150)
		// Several attempts fail, with backoff in between, while the
		// partitions stay where the new schema begins.
		waitfor.Until(t, o.name+": the cached schema's records load and attempts at the registry fail", func() bool {
			stored := ingesttest.StoredOffsets(t, b.pool, group, b.topic)
			return counterSum(t, r, "tidemark_schema_registry_errors_total") >= failedBefore+5 &&
				stored[0] >= stuck[0] && stored[1] >= stuck[1]
		})
		if err := r.in.RegistryError(); err == nil || !strings.Contains(err.Error(), "schema registry unreachable since") {
			t.Errorf("%s: RegistryError() = %v during the outage", o.name, err)
		}
		stored := ingesttest.StoredOffsets(t, b.pool, group, b.topic)
		for part, off := range stuck {
			if stored[part] != off {
				t.Errorf("%s: partition %d stored at %d during the outage, want %d (the first record waiting)", o.name, part, stored[part], off)
			}
		}
		g.Heal()
		b.waitStored(t, p.end, time.Minute)
		if err := r.in.RegistryError(); err != nil {
			t.Errorf("%s: RegistryError() = %v after the outage", o.name, err)
		}
	}
	if n := counterSum(t, r, "tidemark_schema_registry_cached_schemas"); n != 1+float64(len(outages)) {
		t.Errorf("%v schemas cached, want %d", n, 1+len(outages))
	}
	r.stop(t)
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events"); n != int64(total) {
		t.Errorf("%d rows, want %d", n, total)
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(DISTINCT event_id) FROM raw.app_events"); n != int64(total) {
		t.Errorf("%d distinct ids, want %d", n, total)
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT coalesce(sum(rows_written), 0)::bigint FROM tidemark.kafka_offsets"); n != int64(total) {
		t.Errorf("the offsets count %d rows written, want %d", n, total)
	}
	stored := ingesttest.StoredOffsets(t, b.pool, group, b.topic)
	for part, end := range p.end {
		if stored[part] != end {
			t.Errorf("partition %d stored at %d, want %d", part, stored[part], end)
		}
	}
}

// TestAvroRegistryOutageUnderLoad produces a stream of records on four
// partitions for about 35 s, with a new schema every 250 records, while
// the registry is down for 30 s in the middle (3 s with -short) and comes
// back. Loading is delayed, never wrong: every record is stored once, no
// dead letter, every offset stored.
func TestAvroRegistryOutageUnderLoad(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := avroBundle(t, 4, g)
	opts := kafka.Options{}
	kafka.SetRegistryRetry(&opts, 20*time.Millisecond, 200*time.Millisecond)
	r := b.startWith(t, opts)
	ts := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	const total, perSchema = 4000, 250
	var recs []*kgo.Record
	var enc func(any) []byte
	for i := range total {
		if i%perSchema == 0 {
			schema := eventSchema(fmt.Sprintf("S%d", i/perSchema), `"int"`)
			enc = srtest.AvroEncoder(t, g.Register("events-value", sr.Schema{Schema: schema}), schema)
		}
		recs = append(recs, &kgo.Record{Topic: b.topic, Partition: int32(i % 4),
			Value: enc(map[string]any{"event_id": fmt.Sprintf("e-%d", i), "event_time": ts, "v": int32(i)})})
	}
	p := &produced{end: map[int32]int64{}}
	outage, pace := 30*time.Second, 350*time.Millisecond
	if testing.Short() {
		outage, pace = 3*time.Second, 35*time.Millisecond
	}
	done := b.produceStream(p, recs, 40, pace) // 100 chunks: the outage is inside the stream
	b.waitProgress(t, 500, time.Minute)
	g.Fail(http.StatusServiceUnavailable, "")
	down := time.Now()
	waitfor.Until(t, "attempts at the registry fail", func() bool {
		return counterSum(t, r, "tidemark_schema_registry_errors_total") >= 8
	})
	time.Sleep(time.Until(down.Add(outage))) // the outage's length, which is what is tested: not a wait for a state
	during := b.storedTotal(t)
	if err := r.in.RegistryError(); err == nil {
		t.Errorf("no registry error reported after %s of outage", outage)
	}
	g.Heal()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	t.Logf("%d of %d records stored when the registry came back", during, total)
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events"); n != total {
		t.Errorf("%d rows, want %d", n, total)
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(DISTINCT event_id) FROM raw.app_events"); n != total {
		t.Errorf("%d distinct ids, want %d", n, total)
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	stored := ingesttest.StoredOffsets(t, b.pool, group, b.topic)
	for part, end := range p.end {
		if stored[part] != end {
			t.Errorf("partition %d stored at %d, want %d", part, stored[part], end)
		}
	}
}
