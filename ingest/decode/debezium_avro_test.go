package decode_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// dbzAvroValue is an AvroConverter envelope of a row with Debezium's
// logical types, as its Avro schema carries them.
const dbzAvroValue = `{"type":"record","name":"Envelope","namespace":"s.public.t","fields":[
{"name":"before","type":["null",{"type":"record","name":"Value","fields":[
  {"name":"id","type":{"type":"int","connect.type":"int16"}},
  {"name":"ts","type":["null",{"type":"long","connect.version":1,"connect.name":"io.debezium.time.MicroTimestamp"}],"default":null},
  {"name":"zoned","type":["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.time.ZonedTimestamp"}],"default":null},
  {"name":"amount","type":["null",{"type":"record","name":"VariableScaleDecimal","namespace":"io.debezium.data","fields":[
    {"name":"scale","type":"int"},{"name":"value","type":"bytes"}],"connect.name":"io.debezium.data.VariableScaleDecimal"}],"default":null},
  {"name":"price","type":["null",{"type":"bytes","connect.parameters":{"scale":"3"},"connect.name":"org.apache.kafka.connect.data.Decimal"}],"default":null},
  {"name":"total","type":["null",{"type":"bytes","scale":2,"precision":10,"connect.parameters":{"scale":"2","connect.decimal.precision":"10"},
    "connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}],"default":null},
  {"name":"doc","type":["null",{"type":"string","connect.name":"io.debezium.data.Json"}],"default":null},
  {"name":"uid","type":["null",{"type":"string","connect.name":"io.debezium.data.Uuid"}],"default":null},
  {"name":"photo","type":["null","bytes"],"default":null},
  {"name":"day","type":{"type":"int","logicalType":"date","connect.name":"org.apache.kafka.connect.data.Date"}},
  {"name":"at","type":["null",{"type":"long","connect.name":"io.debezium.time.MicroTime"}],"default":null},
  {"name":"tags","type":{"type":"array","items":"string"}},
  {"name":"bio","type":["null","string"],"default":null}],"connect.name":"s.public.t.Value"}],"default":null},
{"name":"after","type":["null","Value"],"default":null},
{"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql","fields":[
  {"name":"connector","type":"string"},{"name":"ts_ms","type":"long"},{"name":"lsn","type":["null","long"],"default":null}]}},
{"name":"op","type":"string"},
{"name":"ts_ms","type":["null","long"],"default":null}],"connect.name":"s.public.t.Envelope"}`

const dbzAvroKey = `{"type":"record","name":"Key","namespace":"s.public.t","fields":[{"name":"id","type":{"type":"int","connect.type":"int16"}}]}`

type vsd struct {
	Scale int32  `avro:"scale"`
	Value []byte `avro:"value"`
}

type dbzRow struct {
	ID     int32     `avro:"id"`
	TS     *int64    `avro:"ts"`
	Zoned  *string   `avro:"zoned"`
	Amount *vsd      `avro:"amount"`
	Price  []byte    `avro:"price"`
	Total  []byte    `avro:"total"`
	Doc    *string   `avro:"doc"`
	UID    *string   `avro:"uid"`
	Photo  []byte    `avro:"photo"`
	Day    time.Time `avro:"day"`
	At     *int64    `avro:"at"`
	Tags   []string  `avro:"tags"`
	Bio    *string   `avro:"bio"`
}

type dbzSource struct {
	Connector string `avro:"connector"`
	TsMs      int64  `avro:"ts_ms"`
	LSN       *int64 `avro:"lsn"`
}

type dbzEnvelope struct {
	Before *dbzRow   `avro:"before"`
	After  *dbzRow   `avro:"after"`
	Source dbzSource `avro:"source"`
	Op     string    `avro:"op"`
	TsMs   *int64    `avro:"ts_ms"`
}

type dbzKey struct {
	ID int32 `avro:"id"`
}

// The same change as the JSON converter with schemas.enable writes it.
const (
	dbzJSONKey   = `{"schema":{"type":"struct","name":"s.public.t.Key","fields":[{"type":"int16","field":"id"}]},"payload":{"id":7}}`
	dbzJSONValue = `{"schema":{"type":"struct","name":"s.public.t.Envelope","fields":[
{"type":"struct","optional":true,"field":"after","name":"s.public.t.Value","fields":[
  {"type":"int16","field":"id"},
  {"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","field":"ts"},
  {"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","field":"zoned"},
  {"type":"struct","optional":true,"name":"io.debezium.data.VariableScaleDecimal","field":"amount","fields":[{"type":"int32","field":"scale"},{"type":"bytes","field":"value"}]},
  {"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"3"},"field":"price"},
  {"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"10"},"field":"total"},
  {"type":"string","optional":true,"name":"io.debezium.data.Json","field":"doc"},
  {"type":"string","optional":true,"name":"io.debezium.data.Uuid","field":"uid"},
  {"type":"bytes","optional":true,"field":"photo"},
  {"type":"int32","name":"org.apache.kafka.connect.data.Date","field":"day"},
  {"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","field":"at"},
  {"type":"array","items":{"type":"string"},"field":"tags"},
  {"type":"string","optional":true,"field":"bio"}]},
{"type":"struct","field":"source","fields":[{"type":"string","field":"connector"},{"type":"int64","field":"ts_ms"},{"type":"int64","optional":true,"field":"lsn"}]},
{"type":"string","field":"op"},{"type":"int64","optional":true,"field":"ts_ms"}]},
"payload":{"before":null,"after":{"id":7,"ts":1704067200123456,"zoned":"2024-01-01T10:00:00+02:00","amount":{"scale":3,"value":"MDk="},
"price":"AeJA","total":"/4U=","doc":"{\"a\": [1, 2]}","uid":"0b3c7a4e-7c1f-4f58-9a43-4a0d2b5b8f11","photo":"3q2+7w==","day":19723,
"at":45296789000,"tags":["x","y"],"bio":"__debezium_unavailable_value"},
"source":{"connector":"postgresql","ts_ms":1704067200000,"lsn":24023128},"op":"u","ts_ms":1704067200250}}`
)

func dbzAvroChange() dbzEnvelope {
	ptr := func(v int64) *int64 { return &v }
	str := func(s string) *string { return &s }
	return dbzEnvelope{
		After: &dbzRow{ID: 7, TS: ptr(1704067200123456), Zoned: str("2024-01-01T10:00:00+02:00"),
			Amount: &vsd{Scale: 3, Value: []byte{0x30, 0x39}}, Price: []byte{0x01, 0xe2, 0x40}, Total: []byte{0xff, 0x85},
			Doc: str(`{"a": [1, 2]}`), UID: str("0b3c7a4e-7c1f-4f58-9a43-4a0d2b5b8f11"), Photo: []byte{0xde, 0xad, 0xbe, 0xef},
			Day: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), At: ptr(45296789000), Tags: []string{"x", "y"},
			Bio: str("__debezium_unavailable_value")},
		Source: dbzSource{Connector: "postgresql", TsMs: 1704067200000, LSN: ptr(24023128)},
		Op:     "u", TsMs: ptr(1704067200250),
	}
}

// debeziumRegistryDecoder is the decoder of a Debezium source reading the
// registry g.
func debeziumRegistryDecoder(t *testing.T, g *srtest.Registry) *decode.Decoder {
	t.Helper()
	reg, err := decode.NewRegistry(config.SchemaRegistry{URL: g.URL(), Timeout: config.Duration(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := decode.NewRegistryDecoder(&config.Source{Name: "t", Kafka: &config.KafkaSource{Topics: []string{"s.public.t"}}, Format: config.FormatDebezium}, reg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDebeziumAvroAsJSON: a change of the AvroConverter decodes to the
// same event as the JSON converter's with schemas.enable: row, key,
// columns and types, unavailable values, position, id and time.
func TestDebeziumAvroAsJSON(t *testing.T) {
	g := srtest.New(t)
	kid := g.Register("s.public.t-key", sr.Schema{Schema: dbzAvroKey})
	vid := g.Register("s.public.t-value", sr.Schema{Schema: dbzAvroValue})
	rec := &kgo.Record{Topic: "s.public.t",
		Key:   srtest.AvroEncoderOf(t, kid, dbzAvroKey, dbzKey{})(dbzKey{ID: 7}),
		Value: srtest.AvroEncoderOf(t, vid, dbzAvroValue, dbzEnvelope{})(dbzAvroChange())}
	d := debeziumRegistryDecoder(t, g)
	s, err := d.Resolve(context.Background(), []*kgo.Record{rec})
	if err != nil {
		t.Fatal(err)
	}
	got, rej := d.DecodeWith(rec, regNow, s)
	if rej != nil {
		t.Fatalf("Avro: %s: %s", rej.Reason, rej.Detail)
	}
	want, rej := d.DecodeChange("s.public.t", []byte(dbzJSONKey), []byte(dbzJSONValue))
	if rej != nil {
		t.Fatalf("JSON: %s: %s", rej.Reason, rej.Detail)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Avro change:\n%+v\n%s\nJSON converter's:\n%+v\n%s", *got.Change, got.Payload, *want.Change, want.Payload)
	}
	for _, v := range []string{`"amount":12.345`, `"price":123.456`, `"total":-1.23`, `"day":"2024-01-01"`, `"ts":"2024-01-01T00:00:00.123456Z"`,
		`"doc":{"a": [1, 2]}`, `"photo":"\\xdeadbeef"`, `"at":"12:34:56.789"`} {
		if !strings.Contains(string(got.Payload), v) {
			t.Errorf("payload %s lacks %s", got.Payload, v)
		}
	}
	if len(got.Change.Unavailable) != 1 || got.Change.Unavailable[0] != "bio" {
		t.Errorf("unavailable %v, want [bio]", got.Change.Unavailable)
	}

	// A tombstone of the AvroConverter has no value.
	if ev, rej := d.DecodeWith(&kgo.Record{Topic: "s.public.t", Key: rec.Key}, regNow, s); rej != nil || ev.Skip != decode.SkipTombstone {
		t.Errorf("tombstone: %+v %v", ev, rej)
	}
}

// TestDebeziumAvroResolve: a Debezium record waits for its key's schema
// as for its value's, and the bad cases are dead letters with their
// reasons.
func TestDebeziumAvroResolve(t *testing.T) {
	g := srtest.New(t)
	kid := g.Register("s.public.t-key", sr.Schema{Schema: dbzAvroKey})
	vid := g.Register("s.public.t-value", sr.Schema{Schema: dbzAvroValue})
	protoID := g.Register("other-value", sr.Schema{Schema: `syntax = "proto3"; message M { string id = 1; }`, Type: sr.TypeProtobuf})
	value := srtest.AvroEncoderOf(t, vid, dbzAvroValue, dbzEnvelope{})(dbzAvroChange())
	d := debeziumRegistryDecoder(t, g)
	jsonKey := &kgo.Record{Topic: "s.public.t", Key: []byte(dbzJSONKey), Value: value}
	if _, err := d.Resolve(context.Background(), []*kgo.Record{jsonKey}); err != nil {
		t.Fatal(err)
	}
	g.Fail(http.StatusServiceUnavailable, "")
	avroKey := &kgo.Record{Topic: "s.public.t", Key: srtest.AvroEncoderOf(t, kid, dbzAvroKey, dbzKey{})(dbzKey{ID: 7}), Value: value}
	s, err := d.Resolve(context.Background(), []*kgo.Record{jsonKey, avroKey})
	if !errors.Is(err, decode.ErrRegistryUnavailable) || !d.Resolved(s, jsonKey) || d.Resolved(s, avroKey) || !s.Has(avroKey) {
		t.Errorf("resolve with the key's schema unavailable: %v; resolved: JSON key %v, Avro key %v", err, d.Resolved(s, jsonKey), d.Resolved(s, avroKey))
	}
	g.Heal()

	withID := func(id int) []byte {
		b := append([]byte{}, value...)
		b[4] = byte(id)
		return b
	}
	tests := []struct {
		name          string
		key, value    []byte
		reason, where string
	}{
		{"a Protobuf schema", []byte(dbzJSONKey), withID(protoID), decode.ReasonWrongFormat, "format protobuf"},
		{"an unknown schema id", []byte(dbzJSONKey), withID(99), decode.ReasonUnknownSchema, "does not exist"},
		{"truncated bytes", []byte(dbzJSONKey), value[:len(value)-3], decode.ReasonSchemaMismatch, "schema id"},
		{"a zero byte, no header", []byte(dbzJSONKey), []byte{0, 1}, decode.ReasonWrongFormat, "neither JSON"},
		{"a key of an unknown schema", withID(98)[:5], value, decode.ReasonUnknownSchema, "record key: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &kgo.Record{Topic: "s.public.t", Key: tt.key, Value: tt.value}
			s, err := d.Resolve(context.Background(), []*kgo.Record{r})
			if err != nil {
				t.Fatal(err)
			}
			_, rej := d.DecodeWith(r, regNow, s)
			if rej == nil || rej.Reason != tt.reason || !strings.Contains(rej.Detail, tt.where) {
				t.Errorf("rejection %+v, want %s saying %q", rej, tt.reason, tt.where)
			}
		})
	}
}
