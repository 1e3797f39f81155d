package decode

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

var updateHostile = flag.Bool("update-hostile", false, "write the corpus of testdata/hostile from hostileCorpus")

// hostileDir holds the hostile-record corpus: for each case NAME, the
// manifest NAME.json (a hostileCase) and NAME.value.gz, the record value
// as Kafka carries it, gzipped.
const hostileDir = "testdata/hostile"

// hostileSchemaID is the schema id of the corpus's registry values.
const hostileSchemaID = 1

// hostileCase is what a record of the corpus is and what decoding it
// must give.
type hostileCase struct {
	// Format is the source's format.
	Format string `json:"format"`
	// Schema is the schema of id hostileSchemaID, for a registry format.
	Schema string `json:"schema,omitempty"`
	// Key is the record key (Debezium changes).
	Key string `json:"key,omitempty"`
	// Reason is the rejection's reason, Detail a part of its detail.
	Reason string `json:"reason"`
	Detail string `json:"detail"`
	// About says what the record is.
	About string `json:"about"`
}

// wire is payload in the Confluent wire format with hostileSchemaID.
func wire(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{0}, hostileSchemaID), payload...)
}

// protoWire is msg in the wire format as a message of the top-level
// index.
func protoWire(index int, msg []byte) []byte {
	idx := []byte{0}
	if index != 0 {
		idx = binary.AppendVarint(binary.AppendVarint(nil, 1), int64(index))
	}
	return wire(append(idx, msg...))
}

// hostileCorpus is the corpus as its builders make it; -update-hostile
// writes it to hostileDir.
func hostileCorpus() map[string]struct {
	hostileCase
	value []byte
} {
	type entry = struct {
		hostileCase
		value []byte
	}
	avroLong := func(vs ...int64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.AppendVarint(b, v)
		}
		return b
	}
	decimalRecord := `{"type":"record","name":"D","fields":[{"name":"event_id","type":"string"},` +
		`{"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":300000000,"scale":300000000}}]}`
	dbzDecimals := func(value string) []byte {
		return []byte(`{"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
			{"field": "amounts", "type": "array", "items": {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
			"parameters": {"scale": "1000"}}}]}]},
			"payload": {"op": "c", "after": {"id": 1, "amounts": [` + value + `]},
			"source": {"connector": "postgresql", "ts_ms": 1, "lsn": 1}}}`)
	}
	jsonNumbers := `{"type": "array", "items": {"type": "integer", "minimum": 0}}`
	return map[string]entry{
		"avro-null-blocks": {hostileCase{Format: config.FormatAvro, Schema: hostileAvroSchema, Reason: ReasonDecodeLimit,
			Detail: "at /xs: 16777216 items: more than the 46528 its budget has left (half its 93056 bytes of JSON, " +
				"64 times the record's 430 bytes plus 65536: ingest.decode_max_expansion)",
			About: "430 bytes: an array of 100 blocks of 16,777,216 nulls each, which take no bytes"}, wire(hostileAvroNulls())},
		"avro-decimal-scale": {hostileCase{Format: config.FormatAvro, Schema: decimalRecord, Reason: ReasonInvalidSchema,
			Detail: "decimal scale 300000000", About: "a bytes decimal of precision and scale 300,000,000"},
			wire(append(appendAvroString(nil, "e1"), 2, 1))},
		"avro-empty-records": {hostileCase{Format: config.FormatAvro,
			Schema: `{"type":"array","items":{"type":"record","name":"E","fields":[]}}`, Reason: ReasonDecodeLimit,
			Detail: "2147483648 items: more than", About: "an array of 2^31 empty records, which take no bytes"},
			wire(avroLong(1<<31, 0))},
		"avro-length-2-31": {hostileCase{Format: config.FormatAvro, Schema: `"string"`, Reason: ReasonSchemaMismatch,
			Detail: "truncated", About: "a string of length 2^31"}, wire(avroLong(1 << 31))},
		"avro-negative-length": {hostileCase{Format: config.FormatAvro, Schema: `"bytes"`, Reason: ReasonSchemaMismatch,
			Detail: "negative length -2147483648", About: "bytes of length -2^31"}, wire(avroLong(-1 << 31))},
		"avro-map-2-31": {hostileCase{Format: config.FormatAvro, Schema: `{"type":"map","values":"null"}`, Reason: ReasonSchemaMismatch,
			Detail: "a block of 2147483648 items in 1 bytes", About: "a map whose block claims 2^31 entries"}, wire(avroLong(1<<31, 0))},
		"avro-schema-dag": {hostileCase{Format: config.FormatAvro, Schema: avroDAGSchema(60), Reason: ReasonDecodeLimit,
			Detail: "the value decodes to more than its budget of 65856 bytes",
			About:  "an empty value of a schema of 60 records, each naming the next twice: 2^60 nulls"}, wire(nil)},
		"avro-recursive-100000": {hostileCase{Format: config.FormatAvro, Schema: avroListSchema, Reason: ReasonDecodeLimit,
			Detail: "nested more than 256 levels deep", About: "a recursive record nested 100,000 deep"}, wire(avroNested(100_000))},
		"protobuf-nested-20000": {hostileCase{Format: config.FormatProtobuf, Schema: hostileProto, Reason: ReasonDecodeLimit,
			Detail: "hostile.N: nested more than 256 levels deep",
			About:  "a recursive message nested 20,000 deep (its lengths make deeper ones large files)"},
			protoWire(0, protoNested(20_000))},
		"protobuf-unknown-groups-100000": {hostileCase{Format: config.FormatProtobuf, Schema: hostileProto, Reason: ReasonDecodeLimit,
			Detail: "hostile.N: nested more than 256 levels deep", About: "groups of a field the schema does not declare, nested 100,000 deep"},
			protoWire(0, protoGroups(100_000))},
		"protobuf-empty-messages": {hostileCase{Format: config.FormatProtobuf, Schema: hostileProto, Reason: ReasonDecodeLimit,
			Detail: "the value decodes to more than its budget of", About: "100,000 empty elements of a message of 50 fields"},
			protoWire(2, bytes.Repeat([]byte{0x0a, 0x00}, 100_000))},
		"protobuf-map-of-empty-messages": {hostileCase{Format: config.FormatProtobuf, Schema: hostileProto, Reason: ReasonDecodeLimit,
			Detail: "the value decodes to more than its budget of", About: "a map of 20,000 entries of empty messages of 50 fields"},
			protoWire(2, func() []byte {
				var b []byte
				for i := range 20_000 {
					entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), strconv.Itoa(i))
					b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), entry)
				}
				return b
			}())},
		"protobuf-any-in-any": {hostileCase{Format: config.FormatProtobuf, Schema: hostileProto, Reason: ReasonDecodeLimit,
			Detail: "google.protobuf.Any hostile.Holder: more than the", About: "Anys within Anys 200 deep around 10,000 bytes"},
			protoWire(2, protoAnys(200, 10_000))},
		"protobuf-length-2-31": {hostileCase{Format: config.FormatProtobuf, Schema: hostileProto, Reason: ReasonSchemaMismatch,
			Detail: "hostile.Holder: proto", About: "packed items of length 2^31"},
			protoWire(2, protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.BytesType), 1<<31))},
		"json-schema-nested-100000": {hostileCase{Format: config.FormatJSONSchema, Schema: jsonNumbers, Reason: ReasonDecodeLimit,
			Detail: "nested more than 256 levels deep", About: "arrays nested 100,000 deep"},
			wire([]byte(strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000)))},
		"json-schema-exponents": {hostileCase{Format: config.FormatJSONSchema, Schema: jsonNumbers, Reason: ReasonDecodeLimit,
			Detail: "a number of 1 digits and an exponent of 131071: more than",
			About:  "10,000 integers 1e131071, which the validator expands"},
			wire([]byte("[" + strings.Repeat("1e131071,", 9_999) + "1e131071]"))},
		"json-schema-long-number": {hostileCase{Format: config.FormatJSONSchema, Schema: jsonNumbers, Reason: ReasonDecodeLimit,
			Detail: "a number of 131072 digits", About: "an integer of 131,072 digits"},
			wire([]byte("[1" + strings.Repeat("0", 131_071) + "]"))},
		"debezium-decimals": {hostileCase{Format: config.FormatDebezium, Key: `{"id": 1}`, Reason: ReasonDecodeLimit,
			Detail: "column amounts: the value decodes to more than its budget of",
			About:  "50,000 Connect decimals of scale 1000, six bytes each"},
			dbzDecimals(strings.Repeat(`"AA==",`, 49_999) + `"AA=="`)},
		"debezium-decimal-million-bytes": {hostileCase{Format: config.FormatDebezium, Key: `{"id": 1}`, Reason: ReasonInvalidEnvelope,
			Detail: "a decimal of 1048576 bytes has more digits than PostgreSQL's numeric holds",
			About:  "a Connect decimal of 1,048,576 bytes"},
			dbzDecimals(`"` + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x7f}, 1<<20)) + `"`)},
	}
}

// writeHostileCorpus writes hostileCorpus to hostileDir.
func writeHostileCorpus(t *testing.T) {
	t.Helper()
	if err := os.MkdirAll(hostileDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, c := range hostileCorpus() {
		manifest, err := json.MarshalIndent(c.hostileCase, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(hostileDir, name+".json"), append(manifest, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		var gz bytes.Buffer
		w, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		if _, err := w.Write(c.value); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(hostileDir, name+".value.gz"), gz.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readHostile reads the case NAME of the corpus.
func readHostile(t *testing.T, name string) (hostileCase, []byte) {
	t.Helper()
	var c hostileCase
	b, err := os.ReadFile(filepath.Join(hostileDir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s.json: %v", name, err)
	}
	f, err := os.Open(filepath.Join(hostileDir, name+".value.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var value bytes.Buffer
	if _, err := value.ReadFrom(r); err != nil {
		t.Fatalf("%s.value.gz: %v", name, err)
	}
	return c, value.Bytes()
}

// TestHostileCorpus decodes each record of the hostile-record corpus as
// a source of its format does, and checks that it is the dead letter its
// manifest says, having allocated a few times the budget of its size at
// most.
func TestHostileCorpus(t *testing.T) {
	if *updateHostile {
		writeHostileCorpus(t)
	}
	manifests, err := filepath.Glob(filepath.Join(hostileDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if want := len(hostileCorpus()); len(manifests) != want {
		t.Fatalf("%s holds %d cases, want %d (go test -run TestHostileCorpus -update-hostile writes them)", hostileDir, len(manifests), want)
	}
	for _, m := range manifests {
		name := strings.TrimSuffix(filepath.Base(m), ".json")
		t.Run(name, func(t *testing.T) {
			c, value := readHostile(t, name)
			src := &config.Source{Name: "hostile", Kafka: &config.KafkaSource{Topics: []string{"hostile"}}, Format: c.Format,
				EventID: "/event_id", EventTime: "/event_time", EventTimeFormat: config.TimeAuto,
				MaxAge: config.Duration(24 * time.Hour), MaxFutureSkew: config.Duration(time.Hour)}
			var reg *Registry
			if config.UsesRegistry(c.Format) {
				g := srtest.New(t)
				typ := map[string]sr.SchemaType{config.FormatAvro: sr.TypeAvro, config.FormatProtobuf: sr.TypeProtobuf,
					config.FormatJSONSchema: sr.TypeJSON}[c.Format]
				g.RegisterAs("hostile-value", hostileSchemaID, sr.Schema{Schema: c.Schema, Type: typ})
				if reg, err = NewRegistry(config.SchemaRegistry{URL: g.URL(), Timeout: config.Duration(10 * time.Second)}); err != nil {
					t.Fatal(err)
				}
			} else {
				src.EventID, src.EventTime, src.EventTimeFormat = "", "", ""
				src.Mirror = &config.Mirror{Table: "hostile"}
			}
			d, err := NewRegistryDecoder(src, reg)
			if err != nil {
				t.Fatal(err)
			}
			r := &kgo.Record{Topic: "hostile", Value: value, Timestamp: decodeNow}
			if c.Key != "" {
				r.Key = []byte(c.Key)
			}
			s, err := d.Resolve(context.Background(), []*kgo.Record{r})
			if err != nil {
				t.Fatal(err)
			}
			var rej *Rejection
			n := allocated(func() { _, rej = d.DecodeWith(r, decodeNow, s) })
			if bound := allocBound(newBudget(config.DecodeLimits{}, len(r.Value)+len(r.Key)).limit); n > bound {
				t.Errorf("allocated %d bytes, more than %d", n, bound)
			}
			if rej == nil || rej.Reason != c.Reason || !strings.Contains(rej.Detail, c.Detail) {
				t.Fatalf("got %.400v\nwant %s: ...%s...", rej, c.Reason, c.Detail)
			}
		})
	}
}
