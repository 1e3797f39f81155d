package decode

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"

	"github.com/tidemark-dev/tidemark/config"
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
			got, err := toJSON(c, b)
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
			_, err := toJSON(c, tt.payload)
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
	got, err := toJSON(c, []byte{4})
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
	{"name":"r","type":["null",{"type":"record","name":"R","fields":[{"name":"next","type":["null","R"]}]}]},
	{"name":"wide","type":{"type":"bytes","logicalType":"decimal","precision":16383,"scale":16383}},
	{"name":"empties","type":{"type":"array","items":{"type":"record","name":"Empty","fields":[]}}},
	{"name":"nulls","type":{"type":"array","items":"null"}}]}`

// FuzzAvro: any payload either decodes to one JSON document that jsonb
// accepts, or is an error; never a panic, and never more allocated than
// a few times the budget of a record of its size (see allocBound).
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
		"r":     map[string]any{"f.R": map[string]any{"next": map[string]any{"f.R": map[string]any{"next": nil}}}},
		"nulls": []any{nil, nil}, "empties": []map[string]any{{}, {}}, "wide": new(big.Rat).SetFrac(big.NewInt(1), new(big.Int).Exp(big.NewInt(10), big.NewInt(16383), nil)),
	})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := toJSON(c, good); err != nil {
		f.Fatalf("the seed does not decode: %v", err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{0xfe, 0xff, 0xff, 0xff, 0x0f})
	// The array of nulls, last, of 100 blocks of 2^24 items each.
	hostile := slices.Clone(good[:len(good)-1])
	for range 100 {
		hostile = binary.AppendVarint(hostile, 1<<24)
	}
	f.Add(append(hostile, 0))
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := decodeBounded(t, c, payload)
		if err != nil {
			return
		}
		if err := pgjson.Scan(got, nil, nil); err != nil {
			t.Fatalf("output %q: %v", got, err)
		}
	})
}

// hostileAvroSchema is the schema of hostileAvroNulls.
const hostileAvroSchema = `{"type":"record","name":"Z","fields":[{"name":"event_id","type":"string"},` +
	`{"name":"event_time","type":"string"},{"name":"xs","type":{"type":"array","items":"null"}}]}`

// appendAvroString appends s as an Avro string.
func appendAvroString(b []byte, s string) []byte {
	return append(binary.AppendVarint(b, int64(len(s))), s...)
}

// hostileAvroNulls is a value of hostileAvroSchema of 425 bytes (430 in
// the wire format) whose array has 100 blocks of 16,777,216 nulls each,
// which take no bytes.
func hostileAvroNulls() []byte {
	b := appendAvroString(appendAvroString(nil, "e1"), "2026-10-05T09:15:00Z")
	for range 100 {
		b = binary.AppendVarint(b, 1<<24)
	}
	return append(b, 0)
}

// avroNested is a value of avroListSchema nested depth levels deep.
func avroNested(depth int) []byte {
	return append(bytes.Repeat([]byte{2}, depth), 0) // branch 1 (a Node) depth times, then null
}

// avroDAGSchema is a schema of levels records, each with two fields of
// the next one, and nulls in the last: its values take no bytes and hold
// 2^levels nulls.
func avroDAGSchema(levels int) string {
	var b strings.Builder
	for i := range levels {
		fmt.Fprintf(&b, `{"type":"record","name":"R%d","fields":[{"name":"a","type":`, i)
	}
	b.WriteString(`"null"}]}`)
	for i := levels - 1; i >= 1; i-- {
		fmt.Fprintf(&b, `},{"name":"b","type":"R%d"}]}`, i)
	}
	return b.String()
}

// avroListSchema is a recursive schema: a list of nodes.
const avroListSchema = `{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]}]}`

// TestAvroLimits checks that values whose JSON would be larger than
// their budget, or nested deeper than maxDepth, are refused as over a
// limit having allocated a few times their budget at most, and that
// values near the limits decode.
func TestAvroLimits(t *testing.T) {
	emptyRecords := `{"type":"array","items":{"type":"record","name":"E","fields":[]}}`
	tests := []struct {
		name    string
		schema  string
		payload []byte
		lim     config.DecodeLimits
		want    string // the JSON, or a part of the error
		limit   bool   // whether the error is over a limit
	}{
		{"100 blocks of 2^24 nulls", hostileAvroSchema, hostileAvroNulls(), config.DecodeLimits{},
			"at /xs: 16777216 items: more than the 46368 its budget has left (half its 92736 bytes of JSON, 64 times the record's 425 bytes plus 65536: ingest.decode_max_expansion)", true},
		{"nulls within the budget", `{"type":"array","items":"null"}`, binary.AppendVarint(binary.AppendVarint(nil, 3), 0),
			config.DecodeLimits{}, `[null,null,null]`, false},
		{"2^31 empty records", emptyRecords, binary.AppendVarint(binary.AppendVarint(nil, 1<<31), 0), config.DecodeLimits{},
			"2147483648 items: more than", true},
		{"empty records in no bytes", emptyRecords, binary.AppendVarint(binary.AppendVarint(nil, 4), 0), config.DecodeLimits{},
			`[{},{},{},{}]`, false},
		{"a negative block of 2^62 nulls", `{"type":"array","items":"null"}`,
			binary.AppendVarint(binary.AppendVarint(nil, -(1<<62)), 0), config.DecodeLimits{}, "items: more than", true},
		{"a string longer than the cap", `"string"`, appendAvroString(nil, strings.Repeat("\x01", 200_000)),
			config.DecodeLimits{MaxBytes: 1 << 20}, "more than its budget of 1048576 bytes of JSON (ingest.decode_max_bytes)", true},
		{"JSON over the expansion", `{"type":"array","items":{"type":"record","name":"N","fields":[{"name":"a_long_field_name","type":"null"}]}}`,
			binary.AppendVarint(binary.AppendVarint(nil, 10_000), 0), config.DecodeLimits{Expansion: 2},
			"more than its budget of 65544 bytes of JSON (2 times the record's 4 bytes plus 65536: ingest.decode_max_expansion)", true},
		{"a record naming another twice, 60 deep", avroDAGSchema(60), nil, config.DecodeLimits{},
			"the value decodes to more than its budget of 65536 bytes", true},
		{"nested 100,000 deep", avroListSchema, avroNested(100_000), config.DecodeLimits{},
			"nested more than 256 levels deep", true},
		{"nested 256 deep", avroListSchema, avroNested(maxDepth - 1), config.DecodeLimits{},
			strings.Repeat(`{"next":`, maxDepth) + "null" + strings.Repeat("}", maxDepth), false},
		{"2^31 bytes", `"bytes"`, binary.AppendVarint(nil, 1<<31), config.DecodeLimits{}, "truncated", false},
		{"a negative length", `"string"`, binary.AppendVarint(nil, -5), config.DecodeLimits{}, "negative length -5", false},
		{"a map of 2^31 entries", `{"type":"map","values":"null"}`, binary.AppendVarint(nil, 1<<31), config.DecodeLimits{},
			"a block of 2147483648 items in 0 bytes", false},
		{"a decimal of a million bytes", `{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}`,
			append(binary.AppendVarint(nil, 1<<20), bytes.Repeat([]byte{0x7f}, 1<<20)...), config.DecodeLimits{},
			"a decimal of 1048576 bytes has more digits than PostgreSQL's numeric holds", false},
		{"a decimal of a million sign bytes", `{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}`,
			append(append(binary.AppendVarint(nil, 1<<20), bytes.Repeat([]byte{0xff}, 1<<20-1)...), 0x85), config.DecodeLimits{},
			`-1.23`, false},
		{"a decimal of scale 16383", `{"type":"bytes","logicalType":"decimal","precision":16383,"scale":16383}`,
			[]byte{2, 1}, config.DecodeLimits{}, "0." + strings.Repeat("0", 16382) + "1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := compileAvro(tt.schema, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []byte
			b := newBudget(tt.lim, len(tt.payload))
			n := allocated(func() { got, err = c.toJSON(tt.payload, b) })
			if bound := allocBound(b.limit); n > bound {
				t.Errorf("allocated %d bytes, more than %d", n, bound)
			}
			switch {
			case err == nil && (tt.limit || string(got) != tt.want):
				t.Fatalf("got %.200s, want %.200s", got, tt.want)
			case err != nil && (!strings.Contains(err.Error(), tt.want) || errors.Is(err, errLimit) != tt.limit):
				t.Fatalf("got %v (over a limit: %t), want an error containing %q (%t)", err, errors.Is(err, errLimit), tt.want, tt.limit)
			}
		})
	}
}

// TestAvroDecimalScale checks that a decimal whose scale no jsonb number
// can hold is refused with its schema.
func TestAvroDecimalScale(t *testing.T) {
	for _, s := range []string{
		`{"type":"bytes","logicalType":"decimal","precision":300000000,"scale":300000000}`,
		`{"type":"bytes","logicalType":"decimal","precision":16384,"scale":16384}`,
	} {
		_, err := compileAvro(s, nil)
		if err == nil || !strings.Contains(err.Error(), "holds at most 16383 digits after the point") {
			t.Errorf("%s: got %v", s, err)
		}
	}
}
