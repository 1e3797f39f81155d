package decode_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

const orderSchema = `{"type":"record","name":"Order","namespace":"shop","fields":[
	{"name":"id","type":"string"},{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}`

var regNow = time.Date(2026, 10, 5, 9, 15, 0, 0, time.UTC)

// registryDecoder is a decoder of an Avro source reading the registry g.
func registryDecoder(t *testing.T, g *srtest.Registry, format string) *decode.Decoder {
	t.Helper()
	reg, err := decode.NewRegistry(config.SchemaRegistry{URL: g.URL(), Timeout: config.Duration(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := decode.NewRegistryDecoder(&config.Source{Name: "orders", Format: format, EventID: "/id", EventTime: "/ts",
		EventTimeFormat: config.TimeAuto, MaxAge: config.Duration(24 * time.Hour), MaxFutureSkew: config.Duration(time.Hour)}, reg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestRegistryDecode decodes records of the registry's schemas and checks
// each bad case's reason, and that a registry that cannot answer is an
// outage, not a dead letter.
func TestRegistryDecode(t *testing.T) {
	g := srtest.New(t)
	id := g.Register("orders-value", sr.Schema{Schema: orderSchema})
	protoID := g.Register("other-value", sr.Schema{Schema: `syntax = "proto3"; message M { string id = 1; }`, Type: sr.TypeProtobuf})
	badID := g.Register("bad-value", sr.Schema{Schema: `{"type":"record","name":"B","fields":[{"name":"x","type":"Nope"}]}`})
	refID := g.Register("ref-value", sr.Schema{Schema: orderSchema,
		References: []sr.SchemaReference{{Name: "shop.Missing", Subject: "missing", Version: 1}}})
	enc := srtest.AvroEncoder(t, id, orderSchema)
	good := enc(map[string]any{"id": "o-1", "ts": regNow.Add(-time.Minute)})
	withID := func(id int) []byte {
		b := append([]byte{}, good...)
		b[4] = byte(id)
		return b
	}
	d := registryDecoder(t, g, config.FormatAvro)
	tests := []struct {
		name   string
		value  []byte
		reason string
		detail string
	}{
		{"good", good, "", ""},
		{"json value", []byte(`{"id":"o-1"}`), decode.ReasonWrongFormat, "not in the Confluent wire format"},
		{"short", []byte{0, 0, 1}, decode.ReasonWrongFormat, "not in the Confluent wire format"},
		{"unknown id", withID(99), decode.ReasonUnknownSchema, "schema id 99 does not exist"},
		{"protobuf schema", withID(protoID), decode.ReasonWrongFormat, "names a schema of format protobuf; the source's format is avro"},
		{"invalid schema", withID(badID), decode.ReasonInvalidSchema, "schema id 3 (avro)"},
		{"missing reference", withID(refID), decode.ReasonInvalidSchema, "the reference shop.Missing (subject missing, version 1) does not exist"},
		{"truncated", good[:len(good)-1], decode.ReasonSchemaMismatch, "at /ts: truncated"},
		{"trailing", append(append([]byte{}, good...), 1, 2), decode.ReasonSchemaMismatch, "2 bytes after the value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &kgo.Record{Value: tt.value}
			s, err := d.Resolve(context.Background(), []*kgo.Record{r})
			if err != nil {
				t.Fatal(err)
			}
			ev, rej := d.DecodeWith(r, regNow, s)
			switch {
			case tt.reason == "" && rej != nil:
				t.Fatalf("rejected: %+v", rej)
			case tt.reason == "":
				if ev.ID != "o-1" || !ev.Time.Equal(regNow.Add(-time.Minute)) ||
					string(ev.Payload) != `{"id":"o-1","ts":"2026-10-05T09:14:00Z"}` {
					t.Errorf("got %+v (%s)", ev, ev.Payload)
				}
			case rej == nil || rej.Reason != tt.reason || !strings.Contains(rej.Detail, tt.detail):
				t.Errorf("got %+v, want %s: ...%s...", rej, tt.reason, tt.detail)
			}
		})
	}

	// An outage: nothing resolved, an error, no rejection.
	outages := []struct {
		name string
		fail func()
	}{
		{"503", func() { g.Fail(http.StatusServiceUnavailable, "down") }},
		{"429", func() { g.Fail(http.StatusTooManyRequests, `{"error_code":42901,"message":"slow down"}`) }},
		{"404 without error code", func() { g.Fail(http.StatusNotFound, "<html>no such path</html>") }},
		{"hanging", g.Hang},
	}
	fresh := withID(id) // cached by now: use a decoder with an empty cache
	for _, o := range outages {
		t.Run(o.name, func(t *testing.T) {
			d := registryDecoder(t, g, config.FormatAvro)
			o.fail()
			defer g.Heal()
			r := &kgo.Record{Value: fresh}
			s, err := d.Resolve(context.Background(), []*kgo.Record{r})
			if !errors.Is(err, decode.ErrRegistryUnavailable) {
				t.Fatalf("Resolve: %v, want ErrRegistryUnavailable", err)
			}
			if s.Has(r) {
				t.Errorf("the record's schema is resolved during an outage")
			}
			g.Heal()
			if s, err = d.Resolve(context.Background(), []*kgo.Record{r}); err != nil || !s.Has(r) {
				t.Fatalf("after the outage: %v", err)
			}
			if _, rej := d.DecodeWith(r, regNow, s); rej != nil {
				t.Errorf("after the outage: %+v", rej)
			}
		})
	}
}

// TestResolveUntil checks that a resolution whose time is up takes what
// the cache holds and asks the registry nothing more.
func TestResolveUntil(t *testing.T) {
	g := srtest.New(t)
	first := g.Register("a-value", sr.Schema{Schema: orderSchema})
	second := g.Register("b-value", sr.Schema{Schema: orderSchema})
	d := registryDecoder(t, g, config.FormatAvro)
	rec := func(id int) *kgo.Record {
		return &kgo.Record{Value: srtest.AvroEncoder(t, id, orderSchema)(map[string]any{"id": "x", "ts": regNow})}
	}
	a, b := rec(first), rec(second)
	if _, err := d.Resolve(context.Background(), []*kgo.Record{a}); err != nil {
		t.Fatal(err)
	}
	asked := g.Requests()
	s, err := d.ResolveUntil(context.Background(), []*kgo.Record{a, b}, time.Now().Add(-time.Second))
	if !errors.Is(err, decode.ErrResolveTime) || !s.Has(a) || s.Has(b) || g.Requests() != asked {
		t.Errorf("ResolveUntil past its time: %v, has the cached schema %v, the other %v, %d requests", err, s.Has(a), s.Has(b), g.Requests()-asked)
	}
}

// TestRegistryAsksAgain checks that the registry's answers that a schema
// id, or a schema's reference, does not exist are asked again after a
// minute, so a schema registered later loads without a restart, while the
// schema is not asked for again before then.
func TestRegistryAsksAgain(t *testing.T) {
	g := srtest.New(t)
	refID := g.Register("order-value", sr.Schema{Schema: `{"type":"record","name":"Order","namespace":"shop","fields":[
		{"name":"id","type":"string"},{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
		{"name":"item","type":["null","shop.Item"],"default":null}]}`,
		References: []sr.SchemaReference{{Name: "shop.Item", Subject: "item", Version: 1}}})
	d := registryDecoder(t, g, config.FormatAvro)
	enc := srtest.AvroEncoder(t, refID, orderSchema)
	rec := &kgo.Record{Value: enc(map[string]any{"id": "o-1", "ts": regNow})}
	rec.Value = append(rec.Value[:len(rec.Value):len(rec.Value)], 0) // item: null (union branch 0)
	decodeOnce := func() *decode.Rejection {
		t.Helper()
		s, err := d.Resolve(context.Background(), []*kgo.Record{rec})
		if err != nil {
			t.Fatal(err)
		}
		_, rej := d.DecodeWith(rec, regNow, s)
		return rej
	}
	if rej := decodeOnce(); rej == nil || rej.Reason != decode.ReasonInvalidSchema {
		t.Fatalf("with the reference missing: %+v, want invalid_schema", rej)
	}
	g.Register("item", sr.Schema{Schema: `{"type":"record","name":"Item","namespace":"shop","fields":[{"name":"sku","type":"string"}]}`})
	asked := g.Requests()
	if rej := decodeOnce(); rej == nil || rej.Reason != decode.ReasonInvalidSchema || g.Requests() != asked {
		t.Fatalf("within the minute: %+v after %d requests, want the cached invalid_schema and none", rej, g.Requests()-asked)
	}
	decode.AdvanceCacheClock(t, time.Minute+time.Second)
	if rej := decodeOnce(); rej != nil {
		t.Fatalf("a minute later, with the reference registered: %+v", rej)
	}
}

// TestRegistryNotASchema checks that an answer 200 that is not a schema,
// for an id or for a reference, is an outage that says what came back:
// nothing is resolved, so nothing is dead-lettered, the registry does not
// count as answering, and once the answers are right again the record
// decodes.
func TestRegistryNotASchema(t *testing.T) {
	g := srtest.New(t)
	itemSchema := `{"type":"record","name":"Item","namespace":"shop","fields":[{"name":"sku","type":"string"}]}`
	g.Register("item", sr.Schema{Schema: itemSchema})
	id := g.Register("orders-value", sr.Schema{Schema: orderSchema})
	refID := g.Register("order-item-value", sr.Schema{Schema: `{"type":"record","name":"Order","namespace":"shop","fields":[
		{"name":"id","type":"string"},{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
		{"name":"item","type":["null","shop.Item"],"default":null}]}`,
		References: []sr.SchemaReference{{Name: "shop.Item", Subject: "item", Version: 1}}})
	plain := srtest.AvroEncoder(t, id, orderSchema)(map[string]any{"id": "o-1", "ts": regNow})
	withRef := srtest.AvroEncoder(t, refID, orderSchema)(map[string]any{"id": "o-1", "ts": regNow})
	withRef = append(withRef[:len(withRef):len(withRef)], 0) // item: null (union branch 0)
	bodies := []struct {
		name, body, says string
	}{
		{"empty object", `{}`, `is not a schema (no "schema"): "{}"`},
		{"empty schema text", `{"schema":""}`, `an empty "schema"`},
		{"blank schema text", `{"schema":" \n"}`, `an empty "schema"`},
		{"null schema", `{"schema":null}`, `no "schema"`},
		{"other fields only", `{"status":"ok","message":"maintenance"}`, `no "schema"`},
		{"schema not a string", `{"schema":{"type":"record"}}`, "not a schema object"},
		{"references not a list", `{"schema":"\"string\"","references":"shop.Item"}`, "not a schema object"},
		{"null", `null`, "not a JSON object"},
		{"array", `[]`, "not a JSON object"},
		{"string", `"ok"`, "not a JSON object"},
		{"no body", ``, "not a JSON object"},
		{"html", `<html><body>Welcome</body></html>`, "not a JSON object"},
	}
	targets := []struct {
		name  string
		value []byte
		path  string
	}{
		{"id", plain, fmt.Sprintf("/schemas/ids/%d", id)},
		{"reference", withRef, "/subjects/item/versions/1"},
	}
	for _, target := range targets {
		for _, tt := range bodies {
			t.Run(target.name+"/"+tt.name, func(t *testing.T) {
				reg, d := registryAndDecoder(t, g)
				g.AnswerPath(target.path, http.StatusOK, tt.body)
				defer g.Heal()
				r := &kgo.Record{Value: target.value}
				s, err := d.Resolve(context.Background(), []*kgo.Record{r})
				if !errors.Is(err, decode.ErrRegistryUnavailable) || !strings.Contains(err.Error(), tt.says) ||
					!strings.Contains(err.Error(), g.URL()+target.path) {
					t.Fatalf("Resolve: %v, want ErrRegistryUnavailable naming %s and saying %q", err, target.path, tt.says)
				}
				if s.Has(r) {
					t.Fatalf("the record's schema is resolved from an answer that is not a schema")
				}
				if reg.Answered() != 0 && target.name == "id" {
					t.Errorf("an answer that is not a schema counts as answered")
				}
				g.Heal()
				if s, err = d.Resolve(context.Background(), []*kgo.Record{r}); err != nil || !s.Has(r) {
					t.Fatalf("once the registry answers the schema: %v", err)
				}
				if _, rej := d.DecodeWith(r, regNow, s); rej != nil {
					t.Errorf("once the registry answers the schema: %+v", rej)
				}
			})
		}
	}
}

// registryAndDecoder is registryDecoder with its registry, whose cache
// is empty.
func registryAndDecoder(t *testing.T, g *srtest.Registry) (*decode.Registry, *decode.Decoder) {
	t.Helper()
	reg, err := decode.NewRegistry(config.SchemaRegistry{URL: g.URL(), Timeout: config.Duration(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := decode.NewRegistryDecoder(&config.Source{Name: "orders", Format: config.FormatAvro, EventID: "/id", EventTime: "/ts",
		EventTimeFormat: config.TimeAuto, MaxAge: config.Duration(24 * time.Hour), MaxFutureSkew: config.Duration(time.Hour)}, reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, d
}

// TestRegistryInvalidSchemaAsksAgain checks that a schema that does not
// compile (here text that a proxy served in place of the registered one)
// is kept as invalid_schema for InvalidTTL, without a request, and asked
// again once then: once per id whatever the number of records, so that
// the repaired registry's schema loads without a restart.
func TestRegistryInvalidSchemaAsksAgain(t *testing.T) {
	g := srtest.New(t)
	id := g.Register("orders-value", sr.Schema{Schema: orderSchema})
	enc := srtest.AvroEncoder(t, id, orderSchema)
	recs := make([]*kgo.Record, 100)
	for i := range recs {
		recs[i] = &kgo.Record{Value: enc(map[string]any{"id": "o-1", "ts": regNow})}
	}
	_, d := registryAndDecoder(t, g)
	g.Answer(id, http.StatusOK, `{"schema":"{\"type\":\"record\",\"name\":\"B\",\"fields\":[{\"name\":\"x\",\"type\":\"Nope\"}]}"}`)
	decodeAll := func() (reason string, requests int64) {
		t.Helper()
		before := g.Requests()
		s, err := d.Resolve(context.Background(), recs)
		if err != nil {
			t.Fatal(err)
		}
		reasons := map[string]int{}
		for _, r := range recs {
			if _, rej := d.DecodeWith(r, regNow, s); rej != nil {
				reasons[rej.Reason]++
			} else {
				reasons["loaded"]++
			}
		}
		if len(reasons) != 1 {
			t.Fatalf("the records of one id decode differently: %v", reasons)
		}
		for reason := range reasons {
			return reason, g.Requests() - before
		}
		return "", 0
	}
	steps := []struct {
		name    string
		advance time.Duration
		heal    bool
		reason  string
		asks    int64
	}{
		{"served a schema that does not compile", 0, false, decode.ReasonInvalidSchema, 1},
		{"repaired, at once", 0, true, decode.ReasonInvalidSchema, 0},
		{"repaired, before the expiry", decode.InvalidTTL - time.Second, false, decode.ReasonInvalidSchema, 0},
		{"repaired, after the expiry", 2 * time.Second, false, "loaded", 1},
		{"long after", 24 * time.Hour, false, "loaded", 0},
	}
	for _, st := range steps {
		if st.heal {
			g.Heal()
		}
		decode.AdvanceCacheClock(t, st.advance)
		if reason, asks := decodeAll(); reason != st.reason || asks != st.asks {
			t.Errorf("%s: %d records %s after %d requests, want %s after %d", st.name, len(recs), reason, asks, st.reason, st.asks)
		}
	}
}

// TestRegistryInvalidSchemaCost checks what a schema that truly does not
// compile costs over time: one request per InvalidTTL for its id, however
// many records carry it.
func TestRegistryInvalidSchemaCost(t *testing.T) {
	g := srtest.New(t)
	badID := g.Register("bad-value", sr.Schema{Schema: `{"type":"record","name":"B","fields":[{"name":"x","type":"Nope"}]}`})
	_, d := registryAndDecoder(t, g)
	rec := &kgo.Record{Value: []byte{0, 0, 0, 0, byte(badID), 2, 'x'}}
	const expiries = 5
	start := g.Requests()
	for range expiries {
		for range 1000 {
			s, err := d.Resolve(context.Background(), []*kgo.Record{rec})
			if err != nil {
				t.Fatal(err)
			}
			if _, rej := d.DecodeWith(rec, regNow, s); rej == nil || rej.Reason != decode.ReasonInvalidSchema {
				t.Fatalf("got %+v, want invalid_schema", rej)
			}
		}
		decode.AdvanceCacheClock(t, decode.InvalidTTL+time.Second)
	}
	if n := g.Requests() - start; n != expiries {
		t.Errorf("%d requests for %d records over %d expiries, want %d", n, expiries*1000, expiries, expiries)
	}
}
