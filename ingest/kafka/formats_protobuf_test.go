package kafka_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// registryBundle is a bundle whose source app_events reads format through
// the in-test registry g.
func registryBundle(t *testing.T, parts int32, g *srtest.Registry, format string) *bundle {
	t.Helper()
	b := setup(t, parts)
	b.yaml = "    format: " + format + "\n"
	b.kafkaYAML = fmt.Sprintf("schema_registry: {url: %q, timeout: 300ms}\n", g.URL())
	return b
}

// loadAll produces recs, runs an ingester until every record is stored
// (loaded or dead-lettered), and stops it.
func (b *bundle) loadAll(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	r := b.start(t)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
}

// checkPayloads checks that the event of each id is stored once, as
// exactly the jsonb of its JSON.
func checkPayloads(t *testing.T, b *bundle, want map[string]string) {
	t.Helper()
	for id, js := range want {
		var got, w string
		var n int64
		err := b.pool.QueryRow(context.Background(), `SELECT min(payload::text), $2::jsonb::text, count(*) FROM raw.app_events WHERE event_id = $1`,
			id, js).Scan(&got, &w, &n)
		if err != nil {
			t.Errorf("%s: %v", id, err)
			continue
		}
		if got != w || n != 1 {
			t.Errorf("%s: stored %d times as %s, want once as %s", id, n, got, w)
		}
	}
}

// deadLetterCase is a bad record, its dead-letter reason and a part of
// the detail the reason's text must have.
type deadLetterCase struct {
	name   string
	value  []byte
	reason string
	detail string
}

// checkDeadLetters checks that the record keyed by each case's index is a
// dead letter with the case's reason, detail and the record's bytes, and
// that there are no others.
func checkDeadLetters(t *testing.T, b *bundle, bad []deadLetterCase) {
	t.Helper()
	for i, c := range bad {
		var reason, detail string
		var value []byte
		err := b.pool.QueryRow(context.Background(), "SELECT reason, detail, record_value FROM tidemark.dead_letters WHERE record_key = $1",
			[]byte(fmt.Sprint(i))).Scan(&reason, &detail, &value)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if reason != c.reason || string(value) != string(c.value) || !strings.Contains(detail, c.detail) {
			t.Errorf("%s: %s (%s) with % x; want %s (…%s…) with % x", c.name, reason, detail, value, c.reason, c.detail, c.value)
		}
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != int64(len(bad)) {
		t.Errorf("%d dead letters, want %d", n, len(bad))
	}
}

// moneyProto is the .proto file the event schemas import as a reference.
const moneyProto = `syntax = "proto3";
package common;
message Money {
  string currency_code = 1;
  int64 units = 2;
  int32 nanos = 3;
}`

// staleTimestampProto is a copy of the standard timestamp.proto that is
// not the standard one: a producer may list the standard files among a
// schema's references, and tidemark must use its own.
const staleTimestampProto = `syntax = "proto3";
package google.protobuf;
message Timestamp { string not_the_standard_one = 1; }`

// protoReferences registers the files the event schemas import and
// returns the references a schema lists them by, and the files by import
// path for the producer's compiler.
func protoReferences(g *srtest.Registry) ([]sr.SchemaReference, map[string]string) {
	g.Register("common/money.proto", sr.Schema{Schema: moneyProto, Type: sr.TypeProtobuf})
	g.Register("google/protobuf/timestamp.proto", sr.Schema{Schema: staleTimestampProto, Type: sr.TypeProtobuf})
	return []sr.SchemaReference{
		{Name: "common/money.proto", Subject: "common/money.proto", Version: 1},
		{Name: "google/protobuf/timestamp.proto", Subject: "google/protobuf/timestamp.proto", Version: 1},
	}, map[string]string{"common/money.proto": moneyProto}
}

// protoEventSchema is a .proto file whose first message, test.Event, has
// an event id, an event time (a google.protobuf.Timestamp) and a field v
// of the type given, followed by decls.
func protoEventSchema(typ, decls string) string {
	return `syntax = "proto3";
package test;
import "common/money.proto";
import "google/protobuf/any.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/empty.proto";
import "google/protobuf/field_mask.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Event {
  string event_id = 1;
  google.protobuf.Timestamp event_time = 2;
  ` + typ + ` v = 3;
}
` + decls
}

// protoTypeCase is one field type: its declaration (and the declarations
// it needs), the field's value in protojson ("" leaves it unset) and the
// JSON tidemark stores for it.
type protoTypeCase struct {
	name, typ, decls, value, json string
}

const (
	colorEnum  = "enum Color { RED = 0; GREEN = 1; }"
	innerMsg   = "message Inner { string a = 1; Inner next = 2; }"
	choiceMsg  = "message Choice { oneof c { string s = 1; int64 n = 2; } }"
	anyMoney   = `{"@type":"type.googleapis.com/common.Money","currency_code":"NOK","units":"1"}`
	anyDur     = `{"@type":"type.googleapis.com/google.protobuf.Duration","value":"2s"}`
	jsonStruct = `{"a":[1,"x",null,true],"b":{"c":1.5,"d":"é"}}`
)

// protoTypeCases are the types of docs/formats.md's Protobuf table.
var protoTypeCases = []protoTypeCase{
	{"int32", "int32", "", `-42`, `-42`},
	{"int64 max", "int64", "", `"9223372036854775807"`, `9223372036854775807`},
	{"sint64 min", "sint64", "", `"-9223372036854775808"`, `-9223372036854775808`},
	{"uint64 max", "uint64", "", `"18446744073709551615"`, `18446744073709551615`},
	{"fixed32", "fixed32", "", `4294967295`, `4294967295`},
	{"sfixed64", "sfixed64", "", `"-1"`, `-1`},
	{"sint32 min", "sint32", "", `-2147483648`, `-2147483648`},
	{"int32 unset", "int32", "", ``, `0`},
	{"float", "float", "", `0.1`, `0.1`},
	{"double", "double", "", `1234567.125`, `1234567.125`},
	{"double tiny", "double", "", `1e-7`, `1e-7`},
	{"double huge", "double", "", `1.5e300`, `1.5e300`},
	{"nan", "double", "", `"NaN"`, `"NaN"`},
	{"float -infinity", "float", "", `"-Infinity"`, `"-Infinity"`},
	{"bool", "bool", "", `true`, `true`},
	{"bool unset", "bool", "", ``, `false`},
	{"string", "string", "", `"héllo \"wörld\"\n✓\u0001"`, `"héllo \"wörld\"\n✓\u0001"`},
	{"string unset", "string", "", ``, `""`},
	{"bytes", "bytes", "", `"AAF0aWRlbWFya/8="`, `"AAF0aWRlbWFya/8="`},
	{"enum", "Color", colorEnum, `"GREEN"`, `"GREEN"`},
	{"enum unset", "Color", colorEnum, ``, `"RED"`},
	{"enum unknown number", "Color", colorEnum, `7`, `7`},
	{"repeated", "repeated string", "", `["a","b"]`, `["a","b"]`},
	{"repeated unset", "repeated int64", "", ``, `[]`},
	{"repeated message", "repeated common.Money", "", `[{"currency_code":"NOK","units":"12"},{}]`,
		`[{"currency_code":"NOK","units":12,"nanos":0},{"currency_code":"","units":0,"nanos":0}]`},
	{"map", "map<string, int32>", "", `{"y":2,"x":1}`, `{"x":1,"y":2}`},
	{"map of int64 keys", "map<int64, string>", "", `{"10":"b","-1":"a"}`, `{"-1":"a","10":"b"}`},
	{"map of bool keys", "map<bool, common.Money>", "", `{"true":{"units":"3"}}`, `{"true":{"currency_code":"","units":3,"nanos":0}}`},
	{"map unset", "map<string, string>", "", ``, `{}`},
	{"message of a reference", "common.Money", "", `{"currency_code":"EUR","units":"-3","nanos":-500000000}`,
		`{"currency_code":"EUR","units":-3,"nanos":-500000000}`},
	{"message unset", "common.Money", "", ``, `null`},
	{"nested message", "Inner", innerMsg, `{"a":"x","next":{"a":"y"}}`, `{"a":"x","next":{"a":"y","next":null}}`},
	{"optional unset", "optional int32", "", ``, `null`},
	{"optional zero", "optional int32", "", `0`, `0`},
	{"oneof", "Choice", choiceMsg, `{"n":"5"}`, `{"s":null,"n":5}`},
	{"timestamp", "google.protobuf.Timestamp", "", `"2026-10-05T11:15:00.120+02:00"`, `"2026-10-05T09:15:00.12Z"`},
	{"timestamp nanos", "google.protobuf.Timestamp", "", `"2026-10-05T09:15:00.000000001Z"`, `"2026-10-05T09:15:00.000000001Z"`},
	{"duration", "google.protobuf.Duration", "", `"1.5s"`, `"1.500s"`},
	{"int64 wrapper", "google.protobuf.Int64Value", "", `"9007199254740993"`, `9007199254740993`},
	{"uint32 wrapper", "google.protobuf.UInt32Value", "", `0`, `0`},
	{"string wrapper unset", "google.protobuf.StringValue", "", ``, `null`},
	{"bool wrapper false", "google.protobuf.BoolValue", "", `false`, `false`},
	{"bytes wrapper", "google.protobuf.BytesValue", "", `"3q2+7w=="`, `"3q2+7w=="`},
	{"float wrapper", "google.protobuf.FloatValue", "", `2.5`, `2.5`},
	{"struct", "google.protobuf.Struct", "", jsonStruct, jsonStruct},
	{"value null", "google.protobuf.Value", "", `null`, `null`},
	{"value", "google.protobuf.Value", "", `{"k":[1.25]}`, `{"k":[1.25]}`},
	{"list value", "google.protobuf.ListValue", "", `[1,"a",{}]`, `[1,"a",{}]`},
	{"empty", "google.protobuf.Empty", "", `{}`, `{}`},
	{"field mask", "google.protobuf.FieldMask", "", `"fooBar,baz.qux"`, `"fooBar,baz.qux"`},
	{"any", "google.protobuf.Any", "", anyMoney, `{"@type":"type.googleapis.com/common.Money","currency_code":"NOK","units":1,"nanos":0}`},
	{"any of a well-known type", "google.protobuf.Any", "", anyDur, anyDur},
}

// TestProtobufTypes loads one record per Protobuf type through the
// registry, each of its own schema (which imports a reference, and lists a
// stale copy of a standard file among its references), framed by
// franz-go's serde, and checks that each value is stored as exactly the
// jsonb of its JSON equivalent, with the event time read from a
// google.protobuf.Timestamp.
func TestProtobufTypes(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := registryBundle(t, 1, g, config.FormatProtobuf)
	refs, imports := protoReferences(g)
	ts := time.Date(2026, 10, 5, 9, 15, 0, 123_456_789, time.UTC)
	var recs []*kgo.Record
	for i, tt := range protoTypeCases {
		schema := protoEventSchema(tt.typ, tt.decls)
		id := g.Register(fmt.Sprintf("events-value-%d", i), sr.Schema{Schema: schema, Type: sr.TypeProtobuf, References: refs})
		f := srtest.CompileProto(t, schema, imports)
		pj := fmt.Sprintf(`{"event_id":%q,"event_time":%q`, tt.name, ts.Format(time.RFC3339Nano))
		if tt.value != "" {
			pj += `,"v":` + tt.value
		}
		m := f.New(t, f.Message(t, "test.Event"), pj+"}")
		recs = append(recs, &kgo.Record{Topic: b.topic, Value: srtest.ProtobufEncoder(t, id, 0)(m)})
	}
	b.loadAll(t, recs)
	for _, tt := range protoTypeCases {
		var got, want string
		var eventTime time.Time
		err := b.pool.QueryRow(context.Background(), `SELECT (payload->'v')::text, $2::jsonb::text, event_time FROM raw.app_events WHERE event_id = $1`,
			tt.name, tt.json).Scan(&got, &want, &eventTime)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		// PostgreSQL keeps microseconds.
		if got != want || !eventTime.Equal(ts.Truncate(time.Microsecond)) {
			t.Errorf("%s: stored %s at %s, want %s (the jsonb of %s) at %s", tt.name, got, eventTime, want, tt.json, ts)
		}
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE payload->>'event_time' = $1", "2026-10-05T09:15:00.123456789Z"); n != int64(len(protoTypeCases)) {
		t.Errorf("%d payloads hold the event time as 2026-10-05T09:15:00.123456789Z, want %d", n, len(protoTypeCases))
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// nestedProto declares messages nested two levels deep, after a map field
// whose entry type the message indexes do not count: Confluent's indexes
// are [0] for Other, [1, 1] for Envelope.Event, [1, 1, 0] for
// Envelope.Event.Deep.
const nestedProto = `syntax = "proto3";
package test;
import "google/protobuf/timestamp.proto";
message Other {
  string event_id = 1;
  google.protobuf.Timestamp event_time = 2;
  string other = 3;
}
message Envelope {
  map<string, string> labels = 1;
  message Header { string source = 1; }
  message Event {
    int64 event_id = 1;
    google.protobuf.Timestamp event_time = 2;
    Header header = 3;
    map<string, Header> by_name = 4;
    message Deep {
      uint64 event_id = 1;
      google.protobuf.Timestamp event_time = 2;
    }
  }
}`

// TestProtobufMessageIndexes loads records of one schema whose message
// indexes pick a top-level message (Confluent's single 0 byte, or a
// count of 1 and the index 0), a nested
// one after a map field, and one nested two levels deep; their event ids
// are a string, an int64 beyond a double's precision and a uint64.
func TestProtobufMessageIndexes(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := registryBundle(t, 1, g, config.FormatProtobuf)
	id := g.Register("envelope-value", sr.Schema{Schema: nestedProto, Type: sr.TypeProtobuf})
	f := srtest.CompileProto(t, nestedProto, nil)
	if env := f.Message(t, "test.Envelope"); !env.Messages().Get(0).IsMapEntry() {
		t.Fatalf("the producer's compiler does not put the map entry first in %s: the indexes below are wrong", env.FullName())
	}
	cases := []struct {
		msg   string
		index []int
		pj    string
		id    string
		json  string
	}{
		{"test.Other", []int{0}, `{"event_id":"other-1","event_time":"2026-10-05T10:00:00Z","other":"o"}`, "other-1",
			`{"event_id":"other-1","event_time":"2026-10-05T10:00:00Z","other":"o"}`},
		{"test.Envelope.Event", []int{1, 1}, `{"event_id":"9007199254740993","event_time":"2026-10-05T10:00:01Z","header":{"source":"web"},"by_name":{"k":{}}}`,
			"9007199254740993",
			`{"event_id":9007199254740993,"event_time":"2026-10-05T10:00:01Z","header":{"source":"web"},"by_name":{"k":{"source":""}}}`},
		{"test.Envelope.Event.Deep", []int{1, 1, 0}, `{"event_id":"18446744073709551615","event_time":"2026-10-05T10:00:02.5Z"}`,
			"18446744073709551615", `{"event_id":18446744073709551615,"event_time":"2026-10-05T10:00:02.5Z"}`},
	}
	var recs []*kgo.Record
	want := map[string]string{}
	for _, c := range cases {
		m := f.New(t, f.Message(t, c.msg), c.pj)
		recs = append(recs, &kgo.Record{Topic: b.topic, Value: srtest.ProtobufEncoder(t, id, c.index...)(m)})
		want[c.id] = c.json
	}
	// The first message's indexes written in full (a count of 1, then 0),
	// as some serializers do, instead of Confluent's single 0 byte.
	full := f.New(t, f.Message(t, "test.Other"), `{"event_id":"other-2","event_time":"2026-10-05T10:00:03Z"}`)
	v := srtest.ProtobufEncoder(t, id, 0)(full)
	if v[5] != 0 {
		t.Fatalf("franz-go's serde frames index [0] as % x, not as the single byte 0", v[5:6])
	}
	recs = append(recs, &kgo.Record{Topic: b.topic, Value: append(append(v[:5:5], 0x02, 0x00), v[6:]...)})
	want["other-2"] = `{"event_id":"other-2","event_time":"2026-10-05T10:00:03Z","other":""}`
	b.loadAll(t, recs)
	checkPayloads(t, b, want)
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE event_id = '18446744073709551615' AND event_time = '2026-10-05T10:00:02.5Z'"); n != 1 {
		t.Errorf("the deep message's event time is not 2026-10-05T10:00:02.5Z")
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// TestProtobufSchemaEvolution loads records of three versions of a
// schema in one partition: a field added, then one removed. Each record
// is stored with the fields of the schema its id names; a field the bytes
// hold that the schema does not know is left out.
func TestProtobufSchemaEvolution(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := registryBundle(t, 1, g, config.FormatProtobuf)
	const head = "syntax = \"proto3\";\npackage shop;\nimport \"google/protobuf/timestamp.proto\";\n" +
		"message Order {\n  string event_id = 1;\n  google.protobuf.Timestamp event_time = 2;\n"
	versions := []string{
		head + "  int64 amount = 3;\n}",
		head + "  int64 amount = 3;\n  string currency = 4;\n}",
		head + "  reserved 3;\n  string currency = 4;\n}",
	}
	type version struct {
		file *srtest.ProtoFile
		enc  func(*dynamicpb.Message) []byte
	}
	var vs []version
	for _, s := range versions {
		id := g.Register("orders-value", sr.Schema{Schema: s, Type: sr.TypeProtobuf})
		vs = append(vs, version{srtest.CompileProto(t, s, nil), srtest.ProtobufEncoder(t, id, 0)})
	}
	want := map[string]string{}
	var recs []*kgo.Record
	for i := range 30 {
		v := i % 3
		id := fmt.Sprintf("o-%d", i)
		full := fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","amount":%d,"currency":"NOK"}`, id, i)
		var pj string
		switch v {
		case 0:
			pj = fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","amount":%d}`, id, i)
			want[id] = pj
		case 1:
			pj = full
			want[id] = full
		case 2:
			pj = fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","currency":"NOK"}`, id)
			want[id] = pj
		}
		recs = append(recs, &kgo.Record{Topic: b.topic, Value: vs[v].enc(vs[v].file.New(t, vs[v].file.Message(t, "shop.Order"), pj))})
	}
	// Bytes of version 2 under the ids of versions 1 and 3 (a producer
	// whose schema is ahead of or behind the id it frames with): the field
	// the id's schema does not have is skipped.
	v2 := vs[1].file.Message(t, "shop.Order")
	recs = append(recs,
		&kgo.Record{Topic: b.topic, Value: vs[0].enc(vs[1].file.New(t, v2, `{"event_id":"ahead","event_time":"2026-10-05T10:00:00Z","amount":5,"currency":"SEK"}`))},
		&kgo.Record{Topic: b.topic, Value: vs[2].enc(vs[1].file.New(t, v2, `{"event_id":"behind","event_time":"2026-10-05T10:00:00Z","amount":6,"currency":"DKK"}`))})
	want["ahead"] = `{"event_id":"ahead","event_time":"2026-10-05T10:00:00Z","amount":5}`
	want["behind"] = `{"event_id":"behind","event_time":"2026-10-05T10:00:00Z","currency":"DKK"}`
	b.loadAll(t, recs)
	checkPayloads(t, b, want)
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events"); n != int64(len(want)) {
		t.Errorf("%d rows, want %d", n, len(want))
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// TestProtobufDeadLetters checks that each bad record on a Protobuf
// source is a dead letter with its reason and its bytes, values of the
// other formats included, and that the records around it load.
func TestProtobufDeadLetters(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := registryBundle(t, 1, g, config.FormatProtobuf)
	const schema = "syntax = \"proto3\";\npackage test;\nimport \"google/protobuf/timestamp.proto\";\n" +
		"message E {\n  string event_id = 1;\n  google.protobuf.Timestamp event_time = 2;\n  int64 v = 3;\n}"
	id := g.Register("events-value", sr.Schema{Schema: schema, Type: sr.TypeProtobuf})
	f := srtest.CompileProto(t, schema, nil)
	md := f.Message(t, "test.E")
	enc := srtest.ProtobufEncoder(t, id, 0)
	// v is 300, two bytes of varint: whatever the order proto.Marshal
	// writes the fields in, a value cut one byte short ends inside one.
	good := func(name string) []byte {
		return enc(f.New(t, md, fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","v":"300"}`, name)))
	}
	avroSchema := eventSchema("E", `"int"`)
	avroID := g.Register("avro-value", sr.Schema{Schema: avroSchema})
	jsonID := g.Register("json-value", sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	missingImport := g.Register("missing-import-value", sr.Schema{Type: sr.TypeProtobuf,
		Schema: "syntax = \"proto3\";\nimport \"other.proto\";\nmessage E { Other o = 1; }"})
	missingRef := g.Register("missing-ref-value", sr.Schema{Type: sr.TypeProtobuf, Schema: schema,
		References: []sr.SchemaReference{{Name: "other.proto", Subject: "nobody-registered-it", Version: 1}}})
	withID := func(v []byte, id int) []byte {
		v = append([]byte{}, v...)
		v[1], v[2], v[3], v[4] = byte(id>>24), byte(id>>16), byte(id>>8), byte(id)
		return v
	}
	cut := func(v []byte) []byte { return v[:len(v)-1] }
	header := func(id int, index ...int) []byte {
		h, _ := new(sr.ConfluentHeader).AppendEncode(nil, id, index)
		return h
	}
	// A proto3 string that is not UTF-8, and a Timestamp after the year
	// 9999, written with protowire: proto.Marshal refuses to.
	badUTF8 := protowire.AppendBytes(protowire.AppendTag(header(id, 0), 1, protowire.BytesType), []byte("e-\xff"))
	ts := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 253402300800)
	farTime := protowire.AppendBytes(protowire.AppendTag(protowire.AppendString(protowire.AppendTag(header(id, 0), 1, protowire.BytesType), "far"),
		2, protowire.BytesType), ts)
	bad := []deadLetterCase{
		{"plain JSON", []byte(`{"event_id":"j","event_time":"2026-10-05T10:00:00Z"}`), decode.ReasonWrongFormat, "not in the Confluent wire format"},
		{"an Avro schema id", srtest.AvroEncoder(t, avroID, avroSchema)(map[string]any{"event_id": "a", "event_time": testNow, "v": int32(1)}),
			decode.ReasonWrongFormat, "format avro; the source's format is protobuf"},
		{"a JSON Schema id", srtest.JSONSchemaEncoder(t, jsonID)([]byte(`{"event_id":"js"}`)), decode.ReasonWrongFormat, "format json_schema;"},
		{"an unknown schema id", withID(good("u"), 4711), decode.ReasonUnknownSchema, "4711"},
		{"an import that is no reference", withID(good("i"), missingImport), decode.ReasonInvalidSchema, "other.proto"},
		{"a reference that does not exist", withID(good("r"), missingRef), decode.ReasonInvalidSchema, "nobody-registered-it"},
		{"truncated", cut(good("t")), decode.ReasonSchemaMismatch, "cannot parse invalid wire-format data"},
		{"indexes naming no message", append(header(id, 3), good("n")[6:]...), decode.ReasonSchemaMismatch, "no message at index 3"},
		{"no message indexes", header(id), decode.ReasonSchemaMismatch, "message indexes"},
		{"a string that is not UTF-8", badUTF8, decode.ReasonSchemaMismatch, "field test.E.event_id contains invalid UTF-8"},
		{"a timestamp after 9999", farTime, decode.ReasonSchemaMismatch, "at event_time: google.protobuf.Timestamp"},
	}
	var recs []*kgo.Record
	for i, c := range bad {
		recs = append(recs, &kgo.Record{Topic: b.topic, Key: []byte(fmt.Sprint(i)), Value: c.value},
			&kgo.Record{Topic: b.topic, Value: good(fmt.Sprintf("good-%d", i))})
	}
	b.loadAll(t, recs)
	checkDeadLetters(t, b, bad)
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE event_id LIKE 'good-%' AND payload->>'v' = '300'"); n != int64(len(bad)) {
		t.Errorf("%d good records stored, want %d", n, len(bad))
	}
}

// TestProtobufReferenceChain loads a record whose schema imports a file
// that imports another: the registry lists the second file among the
// first one's references, not the schema's.
func TestProtobufReferenceChain(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := registryBundle(t, 1, g, config.FormatProtobuf)
	const lineProto = `syntax = "proto3";
package shop;
import "common/money.proto";
message Line { string sku = 1; common.Money price = 2; }`
	const schema = `syntax = "proto3";
package shop;
import "shop/line.proto";
import "google/protobuf/timestamp.proto";
message Order { string event_id = 1; google.protobuf.Timestamp event_time = 2; repeated Line lines = 3; }`
	g.Register("money", sr.Schema{Schema: moneyProto, Type: sr.TypeProtobuf})
	g.Register("line", sr.Schema{Schema: lineProto, Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "common/money.proto", Subject: "money", Version: 1}}})
	id := g.Register("orders-value", sr.Schema{Schema: schema, Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "shop/line.proto", Subject: "line", Version: 1}}})
	f := srtest.CompileProto(t, schema, map[string]string{"shop/line.proto": lineProto, "common/money.proto": moneyProto})
	m := f.New(t, f.Message(t, "shop.Order"),
		`{"event_id":"o-1","event_time":"2026-10-05T10:00:00Z","lines":[{"sku":"a","price":{"currency_code":"NOK","units":"12","nanos":300000000}}]}`)
	b.loadAll(t, []*kgo.Record{{Topic: b.topic, Value: srtest.ProtobufEncoder(t, id, 0)(m)}})
	checkPayloads(t, b, map[string]string{"o-1": `{"event_id":"o-1","event_time":"2026-10-05T10:00:00Z",` +
		`"lines":[{"sku":"a","price":{"currency_code":"NOK","units":12,"nanos":300000000}}]}`})
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// TestProtobufReferenceOutage loads Protobuf records whose schema's id
// the registry answers while the requests for its reference fail (503):
// the records wait, neither loaded nor dead-lettered as invalid_schema,
// and load once the registry answers them.
func TestProtobufReferenceOutage(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	var failing atomic.Bool
	target, err := url.Parse(g.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() && strings.HasPrefix(r.URL.Path, "/subjects/") {
			http.Error(w, `{"error_code":50301,"message":"unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	b := registryBundle(t, 1, g, config.FormatProtobuf)
	b.kafkaYAML = fmt.Sprintf("schema_registry: {url: %q, timeout: 300ms}\n", front.URL)
	refs, imports := protoReferences(g)
	schema := protoEventSchema("common.Money", "")
	id := g.Register("events-value", sr.Schema{Schema: schema, Type: sr.TypeProtobuf, References: refs})
	f := srtest.CompileProto(t, schema, imports)
	enc := srtest.ProtobufEncoder(t, id, 0)
	var recs []*kgo.Record
	want := map[string]string{}
	for i := range 5 {
		name := fmt.Sprintf("r-%d", i)
		recs = append(recs, &kgo.Record{Topic: b.topic, Value: enc(f.New(t, f.Message(t, "test.Event"),
			fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","v":{"units":"%d"}}`, name, i)))})
		want[name] = fmt.Sprintf(`{"event_id":%q,"event_time":"2026-10-05T10:00:00Z","v":{"currency_code":"","units":%d,"nanos":0}}`, name, i)
	}
	failing.Store(true)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	opts := kafka.Options{}
	kafka.SetRegistryRetry(&opts, 20*time.Millisecond, 200*time.Millisecond)
	r := b.startWith(t, opts)
	// Nothing written is no offset stored: rows, dead letters and offsets
	// commit together.
	waitfor.Until(t, "attempts at the reference fail (or records are written)", func() bool {
		return counterSum(t, r, "tidemark_schema_registry_errors_total") >= 3 || b.storedTotal(t) > 0
	})
	if n := b.storedTotal(t); n != 0 {
		t.Errorf("%d records loaded or dead-lettered while the reference could not be fetched, want none", n)
	}
	if err := r.in.RegistryError(); err == nil {
		t.Errorf("RegistryError() = nil while the reference could not be fetched")
	}
	failing.Store(false)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	checkPayloads(t, b, want)
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM tidemark.dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}
