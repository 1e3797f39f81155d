package decode

import (
	"encoding/json"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// TestAvroToJSON encodes values with hamba/avro and checks the JSON the
// codec makes of them, type by type.
func TestAvroToJSON(t *testing.T) {
	ts := time.Date(2026, 10, 5, 9, 15, 0, 123_000_000, time.UTC)
	tests := []struct {
		name   string
		schema string
		value  any
		want   string
	}{
		{"int", `"int"`, int32(-42), `-42`},
		{"long", `"long"`, int64(math.MaxInt64), `9223372036854775807`},
		{"float", `"float"`, float32(0.1), `0.1`},
		{"double", `"double"`, 2.5e-7, `2.5e-07`},
		{"NaN", `"double"`, math.NaN(), `"NaN"`},
		{"-Infinity", `"float"`, float32(math.Inf(-1)), `"-Infinity"`},
		{"boolean", `"boolean"`, true, `true`},
		{"string", `"string"`, "a \"q\"\n\u00e9\u2028", "\"a \\\"q\\\"\\n\u00e9\u2028\""},
		{"bytes", `"bytes"`, []byte{0, 1, 0xfe, 0xff}, `"AAH+/w=="`},
		{"fixed", `{"type":"fixed","name":"F","size":3}`, [3]byte{1, 2, 3}, `"AQID"`},
		{"enum", `{"type":"enum","name":"E","symbols":["A","B"]}`, "B", `"B"`},
		{"array", `{"type":"array","items":"int"}`, []int32{1, 2, 3}, `[1,2,3]`},
		{"empty array", `{"type":"array","items":"int"}`, []int32{}, `[]`},
		{"map", `{"type":"map","values":"long"}`, map[string]int64{"a": 1}, `{"a":1}`},
		{"nullable null", `["null","string"]`, nil, `null`},
		{"nullable value", `["string","null"]`, "x", `"x"`},
		{"union", `["null","string","long"]`, map[string]any{"long": int64(5)}, `{"long":5}`},
		{"union null", `["null","string","long"]`, nil, `null`},
		{"timestamp-millis", `{"type":"long","logicalType":"timestamp-millis"}`, ts, `"2026-10-05T09:15:00.123Z"`},
		{"timestamp-micros", `{"type":"long","logicalType":"timestamp-micros"}`, ts.Add(456 * time.Microsecond), `"2026-10-05T09:15:00.123456Z"`},
		{"timestamp whole second", `{"type":"long","logicalType":"timestamp-millis"}`, ts.Truncate(time.Second), `"2026-10-05T09:15:00Z"`},
		{"local-timestamp-millis", `{"type":"long","logicalType":"local-timestamp-millis"}`, ts, `"2026-10-05T09:15:00.123Z"`},
		{"date", `{"type":"int","logicalType":"date"}`, ts, `"2026-10-05"`},
		{"time-millis", `{"type":"int","logicalType":"time-millis"}`, 9*time.Hour + 15*time.Minute + 123*time.Millisecond, `"09:15:00.123"`},
		{"time-micros", `{"type":"long","logicalType":"time-micros"}`, 9*time.Hour + 5*time.Microsecond, `"09:00:00.000005"`},
		{"decimal", `{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}`, big.NewRat(1230, 100), `12.30`},
		{"negative decimal", `{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}`, big.NewRat(-5, 100), `-0.05`},
		{"wide decimal", `{"type":"bytes","logicalType":"decimal","precision":38,"scale":3}`,
			new(big.Rat).SetFrac(new(big.Int).Neg(new(big.Int).Exp(big.NewInt(10), big.NewInt(25), nil)), big.NewInt(1000)), `-10000000000000000000000.000`},
		{"decimal min int64", `{"type":"bytes","logicalType":"decimal","precision":19,"scale":0}`,
			new(big.Rat).SetInt64(math.MinInt64), `-9223372036854775808`},
		{"decimal scale 0", `{"type":"bytes","logicalType":"decimal","precision":9,"scale":0}`, big.NewRat(100, 1), `100`},
		{"fixed decimal", `{"type":"fixed","name":"D","size":8,"logicalType":"decimal","precision":18,"scale":3}`, big.NewRat(-123456, 1000), `-123.456`},
		{"uuid", `{"type":"string","logicalType":"uuid"}`, "6ba7b810-9dad-11d1-80b4-00c04fd430c8", `"6ba7b810-9dad-11d1-80b4-00c04fd430c8"`},
		{"duration", `{"type":"fixed","name":"Dur","size":12,"logicalType":"duration"}`, avro.LogicalDuration{Months: 1, Days: 2, Milliseconds: 3}, `{"months":1,"days":2,"milliseconds":3}`},
		{"record", `{"type":"record","name":"R","namespace":"n","fields":[{"name":"a","type":"int"},{"name":"b","type":{"type":"record","name":"S","fields":[{"name":"c","type":"string"}]}}]}`,
			map[string]any{"a": int32(1), "b": map[string]any{"c": "x"}}, `{"a":1,"b":{"c":"x"}}`},
		{"union of records", `["null",{"type":"record","name":"R","namespace":"n","fields":[{"name":"a","type":"int"}]},"string"]`,
			map[string]any{"n.R": map[string]any{"a": int32(1)}}, `{"n.R":{"a":1}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := avro.MustParse(tt.schema)
			b, err := avro.Marshal(s, tt.value)
			if err != nil {
				t.Fatal(err)
			}
			c, err := compileAvro(tt.schema, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.toJSON(b)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
			if !json.Valid(got) {
				t.Errorf("%s is not JSON", got)
			}
		})
	}
}

// TestAvroMismatch checks that bytes that do not match their schema are
// an error that says where.
func TestAvroMismatch(t *testing.T) {
	const schema = `{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"s","type":"string"},
		{"name":"m","type":{"type":"map","values":{"type":"enum","name":"E","symbols":["X"]}}}]}`
	c, err := compileAvro(schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	good, err := avro.Marshal(avro.MustParse(schema), map[string]any{"a": int32(1), "s": "hé", "m": map[string]any{"k": "X"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		payload []byte
		want    string
	}{
		{"truncated", good[:len(good)-2], "at /m/k: truncated"},
		{"trailing", append(append([]byte{}, good...), 0), "1 bytes after the value"},
		{"bad utf-8", []byte{2, 4, 0xff, 0xfe, 0}, "at /s: a string is not valid UTF-8"},
		{"NUL in a string", []byte{2, 4, 'a', 0, 0}, "at /s: a string holds the character U+0000"},
		{"NUL in a map key", []byte{2, 0, 2, 2, 0, 0, 0}, "a string holds the character U+0000"},
		{"long varint", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, "at /a: a variable-length integer is longer"},
		{"int out of range", []byte{0xff, 0xff, 0xff, 0xff, 0x7f}, "at /a: int"},
		{"enum index", []byte{2, 0, 2, 2, 'k', 4, 0}, "at /m/k: enum index 2 of 1 symbols"},
		{"huge block", []byte{2, 0, 0xfe, 0xff, 0xff, 0xff, 0x0f}, "at /m: a block of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.toJSON(tt.payload)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestAvroInvalidSchema checks that schemas that do not compile are
// errors.
func TestAvroInvalidSchema(t *testing.T) {
	for _, s := range []string{`{"type":"record","name":"R","fields":[{"name":"a","type":"Missing"}]}`, `not json`, `{"type":"wat"}`} {
		if _, err := compileAvro(s, nil); err == nil {
			t.Errorf("%s compiled", s)
		}
	}
	// A reference makes the named type known.
	refs := []schemaRef{{Name: "n.Inner", Schema: `{"type":"record","name":"Inner","namespace":"n","fields":[{"name":"x","type":"int"}]}`}}
	c, err := compileAvro(`{"type":"record","name":"Outer","fields":[{"name":"i","type":"n.Inner"}]}`, refs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.toJSON([]byte{4})
	if err != nil || string(got) != `{"i":{"x":2}}` {
		t.Errorf("got %s, %v", got, err)
	}
}

// fuzzAvroSchema holds every kind of type the Avro codec writes.
const fuzzAvroSchema = `{"type":"record","name":"All","namespace":"f","fields":[
	{"name":"i","type":"int"},{"name":"l","type":"long"},{"name":"f","type":"float"},{"name":"d","type":"double"},
	{"name":"b","type":"boolean"},{"name":"s","type":"string"},{"name":"by","type":"bytes"},
	{"name":"fx","type":{"type":"fixed","name":"F","size":3}},
	{"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}},
	{"name":"a","type":{"type":"array","items":"long"}},
	{"name":"m","type":{"type":"map","values":["null","string"]}},
	{"name":"u","type":["null","string","long"]},
	{"name":"ts","type":{"type":"long","logicalType":"timestamp-micros"}},
	{"name":"dt","type":{"type":"int","logicalType":"date"}},
	{"name":"tm","type":{"type":"int","logicalType":"time-millis"}},
	{"name":"dec","type":{"type":"bytes","logicalType":"decimal","precision":38,"scale":4}},
	{"name":"fdec","type":{"type":"fixed","name":"FD","size":8,"logicalType":"decimal","precision":18,"scale":2}},
	{"name":"dur","type":{"type":"fixed","name":"Dur","size":12,"logicalType":"duration"}},
	{"name":"r","type":["null",{"type":"record","name":"R","fields":[{"name":"next","type":["null","R"]}]}]}]}`

// FuzzAvro: any payload either decodes to one JSON document that jsonb
// accepts, or is an error; never a panic or a runaway allocation.
func FuzzAvro(f *testing.F) {
	c, err := compileAvro(fuzzAvroSchema, nil)
	if err != nil {
		f.Fatal(err)
	}
	good, err := avro.Marshal(avro.MustParse(fuzzAvroSchema), map[string]any{
		"i": int32(-1), "l": int64(math.MaxInt64), "f": float32(0.5), "d": math.Inf(1), "b": true, "s": "x\u2028",
		"by": []byte{0, 0xff}, "fx": [3]byte{1, 2, 3}, "e": "B", "a": []int64{1, -2}, "m": map[string]any{"k": "v", "n": nil},
		"u": map[string]any{"long": int64(5)}, "ts": time.Date(2026, 10, 5, 9, 15, 0, 0, time.UTC),
		"dt": time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC), "tm": 9 * time.Hour, "dec": big.NewRat(-12345, 100),
		"fdec": big.NewRat(7, 100), "dur": avro.LogicalDuration{Months: 1, Days: 2, Milliseconds: 3},
		"r": map[string]any{"f.R": map[string]any{"next": map[string]any{"f.R": map[string]any{"next": nil}}}},
	})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := c.toJSON(good); err != nil {
		f.Fatalf("the seed does not decode: %v", err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{0xfe, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := c.toJSON(payload)
		if err != nil {
			return
		}
		if err := pgjson.Scan(got, nil, nil); err != nil {
			t.Fatalf("output %q: %v", got, err)
		}
	})
}
