package kafka_test

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// orderJSONSchema is a draft-07 schema (formats are assertions) whose
// customer is a reference, named relative to the schema.
const orderJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
	"properties":{
		"event_id":{"type":"string","minLength":1},
		"event_time":{"type":"string","format":"date-time"},
		"qty":{"type":"integer","minimum":1},
		"customer":{"$ref":"customer.json"}},
	"required":["event_id","event_time","qty"]}`

// customerJSONSchema is the schema orderJSONSchema references.
const customerJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
	"properties":{"name":{"type":"string","minLength":1},"tier":{"enum":["gold","silver"]}},
	"required":["name"]}`

// TestJSONSchemaSource loads JSON Schema records framed as producers frame
// them: valid values are stored as they were written (numbers keep their
// digits) with their event id and time; a value failing validation, in the
// schema or in the schema it references, is a schema_mismatch dead letter
// with its bytes, and values of other formats are wrong_format.
func TestJSONSchemaSource(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := registryBundle(t, 1, g, config.FormatJSONSchema)
	g.Register("customer-value", sr.Schema{Schema: customerJSONSchema, Type: sr.TypeJSON})
	id := g.Register("orders-value", sr.Schema{Schema: orderJSONSchema, Type: sr.TypeJSON,
		References: []sr.SchemaReference{{Name: "customer.json", Subject: "customer-value", Version: 1}}})
	enc := srtest.JSONSchemaEncoder(t, id)
	good := map[string]string{
		"j-1": `{"event_id":"j-1","event_time":"2026-10-05T10:00:00.5Z","qty":2,"customer":{"name":"Ada","tier":"gold"},"price":12.30,"extra":[1e2,null]}`,
		"j-2": `{"qty": 1, "event_time": "2026-10-05T12:00:00+02:00", "event_id": "j-2", "note": "h\u00e9 ✓"}`,
	}
	var recs []*kgo.Record
	for _, v := range good {
		recs = append(recs, &kgo.Record{Topic: b.topic, Value: enc([]byte(v))})
	}
	protoID := g.Register("proto-value", sr.Schema{Schema: `syntax = "proto3"; message M { string id = 1; }`, Type: sr.TypeProtobuf})
	avroSchema := eventSchema("E", `"int"`)
	avroID := g.Register("avro-value", sr.Schema{Schema: avroSchema})
	bad := []deadLetterCase{
		{"below the minimum", enc([]byte(`{"event_id":"b-1","event_time":"2026-10-05T10:00:00Z","qty":0}`)),
			decode.ReasonSchemaMismatch, "at /qty: minimum: got 0, want 1 [#/properties/qty/minimum]"},
		{"failing the referenced schema", enc([]byte(`{"event_id":"b-2","event_time":"2026-10-05T10:00:00Z","qty":1,"customer":{"name":"Bo","tier":"bronze"}}`)),
			decode.ReasonSchemaMismatch, "at /customer/tier"},
		{"a date-time that is not one", enc([]byte(`{"event_id":"b-3","event_time":"yesterday","qty":1}`)),
			decode.ReasonSchemaMismatch, "at /event_time"},
		{"a required property missing", enc([]byte(`{"event_id":"b-4","event_time":"2026-10-05T10:00:00Z"}`)),
			decode.ReasonSchemaMismatch, "qty"},
		{"not JSON", enc([]byte(`{"event_id":"b-5",`)), decode.ReasonSchemaMismatch, "invalid JSON"},
		{"a string jsonb cannot hold", enc([]byte(`{"event_id":"b-9","event_time":"2026-10-05T10:00:00Z","qty":1,"note":"a\u0000b"}`)),
			decode.ReasonSchemaMismatch, `\u0000 is not allowed`},
		{"plain JSON", []byte(`{"event_id":"b-6","event_time":"2026-10-05T10:00:00Z","qty":1}`), decode.ReasonWrongFormat, "not in the Confluent wire format"},
		{"a Protobuf schema id", srtest.JSONSchemaEncoder(t, protoID)([]byte(`{"event_id":"b-7","event_time":"2026-10-05T10:00:00Z","qty":1}`)),
			decode.ReasonWrongFormat, "names a schema of format protobuf"},
		{"an Avro schema id", srtest.AvroEncoder(t, avroID, avroSchema)(map[string]any{"event_id": "b-8", "event_time": testNow, "v": int32(1)}),
			decode.ReasonWrongFormat, "format avro; the source's format is json_schema"},
	}
	for i, c := range bad {
		recs = append(recs, &kgo.Record{Topic: b.topic, Key: []byte(fmt.Sprint(i)), Value: c.value})
	}
	b.loadAll(t, recs)
	checkPayloads(t, b, good)
	checkDeadLetters(t, b, bad)
	for id, at := range map[string]string{"j-1": "2026-10-05T10:00:00.5Z", "j-2": "2026-10-05T10:00:00Z"} {
		if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events WHERE event_id = $1 AND event_time = $2::timestamptz", id, at); n != 1 {
			t.Errorf("%s: not stored at %s", id, at)
		}
	}
	if n := ingesttest.Scalar(t, b.pool, "SELECT count(*) FROM raw.app_events"); n != int64(len(good)) {
		t.Errorf("%d rows, want %d", n, len(good))
	}
}

// TestJSONSchemaReferenceByID loads records of a schema with an $id whose
// $ref names its reference by the reference's own absolute $id, while the
// registry lists the reference under another name, as Confluent's
// serializers register them.
func TestJSONSchemaReferenceByID(t *testing.T) {
	pgtest.ServerIndependent(t)
	g := srtest.New(t)
	b := registryBundle(t, 1, g, config.FormatJSONSchema)
	g.Register("address-value", sr.Schema{Type: sr.TypeJSON, Schema: `{"$id":"https://schemas.example.com/address.json",
		"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`})
	id := g.Register("shipments-value", sr.Schema{Type: sr.TypeJSON, Schema: `{"$id":"https://schemas.example.com/shipment.json",
		"type":"object","properties":{"to":{"$ref":"https://schemas.example.com/address.json"}},"required":["event_id","event_time","to"]}`,
		References: []sr.SchemaReference{{Name: "address.json", Subject: "address-value", Version: 1}}})
	enc := srtest.JSONSchemaEncoder(t, id)
	good := `{"event_id":"s-1","event_time":"2026-10-05T10:00:00Z","to":{"city":"Bergen"}}`
	bad := []deadLetterCase{{"a property the reference does not allow",
		enc([]byte(`{"event_id":"s-2","event_time":"2026-10-05T10:00:00Z","to":{"city":"Bergen","zip":"5003"}}`)),
		decode.ReasonSchemaMismatch, "at /to: additional properties 'zip' not allowed [https://schemas.example.com/address.json#/additionalProperties]"}}
	b.loadAll(t, []*kgo.Record{{Topic: b.topic, Value: enc([]byte(good))}, {Topic: b.topic, Key: []byte("0"), Value: bad[0].value}})
	checkPayloads(t, b, map[string]string{"s-1": good})
	checkDeadLetters(t, b, bad)
}
