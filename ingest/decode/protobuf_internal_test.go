package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgjson"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// allTypesProto has a field of every kind the mapping covers.
const allTypesProto = `syntax = "proto3";
package shop.v1;

import "google/protobuf/any.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/empty.proto";
import "google/protobuf/field_mask.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

enum Status {
  STATUS_UNSPECIFIED = 0;
  STATUS_OPEN = 1;
  STATUS_CLOSED = 2;
}

message All {
  message Inner {
    string name = 1;
    double score = 2;
  }
  int32 i32 = 1;
  int64 i64 = 2;
  uint32 u32 = 3;
  uint64 u64 = 4;
  sint32 s32 = 5;
  sint64 s64 = 6;
  fixed32 f32 = 7;
  fixed64 f64 = 8;
  sfixed32 sf32 = 9;
  sfixed64 sf64 = 10;
  float fl = 11;
  double db = 12;
  bool b = 13;
  string s = 14;
  bytes by = 15;
  Status status = 16;
  repeated string tags = 17;
  map<string, int64> counts = 18;
  map<int32, string> names = 19;
  Inner inner = 20;
  repeated Inner inners = 21;
  optional string opt = 22;
  oneof choice {
    string text = 23;
    int64 number = 24;
    Inner nested = 25;
  }
  google.protobuf.Timestamp ts = 26;
  google.protobuf.Duration dur = 27;
  google.protobuf.Int64Value w_i64 = 28;
  google.protobuf.StringValue w_s = 29;
  google.protobuf.Struct st = 30;
  google.protobuf.Value val = 31;
  google.protobuf.ListValue lv = 32;
  google.protobuf.Empty empty = 33;
  google.protobuf.FieldMask mask = 34;
  google.protobuf.Any any = 35;
  map<bool, Inner> by_flag = 36;
  repeated double dbs = 37;
  map<uint64, Status> by_id = 38;
}

message Second {
  string id = 1;
}
`

// allZero is All with nothing set.
const allZero = `{"i32":0,"i64":0,"u32":0,"u64":0,"s32":0,"s64":0,"f32":0,"f64":0,"sf32":0,"sf64":0,
	"fl":0,"db":0,"b":false,"s":"","by":"","status":"STATUS_UNSPECIFIED","tags":[],"counts":{},"names":{},
	"inner":null,"inners":[],"opt":null,"text":null,"number":null,"nested":null,"ts":null,"dur":null,
	"w_i64":null,"w_s":null,"st":null,"val":null,"lv":null,"empty":null,"mask":null,"any":null,
	"by_flag":{},"dbs":[],"by_id":{}}`

// mustCompileProtobuf compiles a schema the test expects to compile.
func mustCompileProtobuf(t testing.TB, schema string, refs ...schemaRef) *protoCodec {
	t.Helper()
	c, err := compileProtobuf(schema, refs)
	if err != nil {
		t.Fatalf("compileProtobuf: %v", err)
	}
	return c.(*protoCodec)
}

// protoMessage builds a message of the named type from its protojson form
// (which takes .proto and lowerCamelCase names, 64-bit integers as
// numbers or strings, "NaN"), then lets edit change it further.
func protoMessage(t testing.TB, c *protoCodec, name, pjson string, edit func(*dynamicpb.Message)) *dynamicpb.Message {
	t.Helper()
	md := c.types[protoreflect.FullName(name)]
	if md == nil {
		t.Fatalf("no message %s in the schema", name)
	}
	m := dynamicpb.NewMessage(md)
	opts := protojson.UnmarshalOptions{Resolver: srtest.ProtoTypes(t, c.file)}
	if err := opts.Unmarshal([]byte(pjson), m); err != nil {
		t.Fatalf("protojson %s: %v", pjson, err)
	}
	if edit != nil {
		edit(m)
	}
	return m
}

// framed returns what follows the schema id in the Confluent wire format
// for msg at the message indexes index, as franz-go's serde writes it.
func framed(t testing.TB, index []int, msg []byte) []byte {
	t.Helper()
	b, err := new(sr.ConfluentHeader).AppendEncode(nil, 7, index)
	if err != nil {
		t.Fatalf("AppendEncode: %v", err)
	}
	if len(b) < 5 {
		t.Fatalf("header %x shorter than magic byte and schema id", b)
	}
	return append(b[5:], msg...)
}

// marshalProto returns the wire bytes of m.
func marshalProto(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("proto.Marshal: %v", err)
	}
	return b
}

// canonJSON decodes JSON text with numbers as exact rationals, so that
// documents compare by meaning: key order, spacing and number spelling
// (1e+300, 1E300) do not matter, 9007199254740993 and 9007199254740992
// differ.
func canonJSON(t testing.TB, text string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, text)
	}
	var conv func(any) any
	conv = func(v any) any {
		switch v := v.(type) {
		case json.Number:
			r, ok := new(big.Rat).SetString(string(v))
			if !ok {
				t.Fatalf("number %s", v)
			}
			return r.RatString()
		case []any:
			for i := range v {
				v[i] = conv(v[i])
			}
		case map[string]any:
			for k := range v {
				v[k] = conv(v[k])
			}
		}
		return v
	}
	return conv(v)
}

// checkJSON fails unless got is JSON that jsonb takes and means what want
// means.
func checkJSON(t testing.TB, got []byte, want string) {
	t.Helper()
	if err := pgjson.Scan(got, nil, nil); err != nil {
		t.Fatalf("output is not JSON that jsonb takes: %v\n%s", err, got)
	}
	if g, w := canonJSON(t, string(got)), canonJSON(t, want); !reflect.DeepEqual(g, w) {
		t.Fatalf("JSON differs\n got: %s\nwant: %s", got, want)
	}
}

// withFields returns allZero with the given fields replaced, so that each
// case below says only what it sets.
func withFields(t testing.TB, fields string) string {
	t.Helper()
	var base, over map[string]json.RawMessage
	if err := json.Unmarshal([]byte(allZero), &base); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(fields), &over); err != nil {
		t.Fatalf("case fields: %v", err)
	}
	for k, v := range over {
		if _, ok := base[k]; !ok {
			t.Fatalf("All has no field %q", k)
		}
		base[k] = v
	}
	b, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func setField(m *dynamicpb.Message, path string, v protoreflect.Value) {
	names := strings.Split(path, ".")
	var msg protoreflect.Message = m
	for _, n := range names[:len(names)-1] {
		msg = msg.Mutable(msg.Descriptor().Fields().ByName(protoreflect.Name(n))).Message()
	}
	msg.Set(msg.Descriptor().Fields().ByName(protoreflect.Name(names[len(names)-1])), v)
}

// TestProtobufTypes: each type maps to JSON as docs/formats.md says.
func TestProtobufTypes(t *testing.T) {
	c := mustCompileProtobuf(t, allTypesProto)
	cases := []struct {
		name  string
		input string // protojson of shop.v1.All
		edit  func(*dynamicpb.Message)
		want  string // the fields of All that differ from allZero
	}{
		{name: "nothing set", input: `{}`, want: `{}`},
		{name: "integers at their limits",
			input: `{"i32":-2147483648,"i64":"9007199254740993","u32":4294967295,"u64":"18446744073709551615",
				"s32":-1,"s64":"-9223372036854775808","f32":4294967295,"f64":"18446744073709551615",
				"sf32":-2147483648,"sf64":"9223372036854775807"}`,
			want: `{"i32":-2147483648,"i64":9007199254740993,"u32":4294967295,"u64":18446744073709551615,
				"s32":-1,"s64":-9223372036854775808,"f32":4294967295,"f64":18446744073709551615,
				"sf32":-2147483648,"sf64":9223372036854775807}`},
		{name: "floats", input: `{"fl":0.1,"db":1e300,"dbs":[1e-7,-2.5,0,123456789012345678901234]}`,
			want: `{"fl":0.1,"db":1e300,"dbs":[1e-7,-2.5,0,1.2345678901234569e23]}`},
		{name: "float specials", input: `{"fl":"Infinity","db":"NaN","dbs":["-Infinity","Infinity"]}`,
			want: `{"fl":"Infinity","db":"NaN","dbs":["-Infinity","Infinity"]}`},
		{name: "bool and string", input: `{"b":true,"s":"a\"b\\c\n\t\u00e9\u2028\ud83d\ude00\u0001\u001f/"}`,
			want: `{"b":true,"s":"a\"b\\c\n\t\u00e9\u2028\ud83d\ude00\u0001\u001f/"}`},
		{name: "bytes as padded standard base64", input: `{"by":"AAH+/w8="}`, want: `{"by":"AAH+/w8="}`},
		{name: "enum by name", input: `{"status":"STATUS_CLOSED"}`, want: `{"status":"STATUS_CLOSED"}`},
		{name: "enum number not in the schema", input: `{"status":7}`, want: `{"status":7}`},
		{name: "repeated and nested",
			input: `{"tags":["a","b"],"inner":{"name":"x","score":1.5},"inners":[{"name":"y"},{}]}`,
			want: `{"tags":["a","b"],"inner":{"name":"x","score":1.5},
				"inners":[{"name":"y","score":0},{"name":"","score":0}]}`},
		{name: "maps with string, integer and bool keys",
			input: `{"counts":{"a":"9223372036854775807","":0},"names":{"-1":"neg","7":"seven"},
				"by_flag":{"true":{"name":"t"}},"by_id":{"18446744073709551615":"STATUS_OPEN"}}`,
			want: `{"counts":{"a":9223372036854775807,"":0},"names":{"-1":"neg","7":"seven"},
				"by_flag":{"true":{"name":"t","score":0}},"by_id":{"18446744073709551615":"STATUS_OPEN"}}`},
		{name: "proto3 optional set to its zero value", input: `{"opt":""}`, want: `{"opt":""}`},
		{name: "oneof string set to its zero value", input: `{"text":""}`, want: `{"text":""}`},
		{name: "oneof integer", input: `{"number":"-9007199254740993"}`, want: `{"number":-9007199254740993}`},
		{name: "oneof message", input: `{"nested":{"name":"n"}}`, want: `{"nested":{"name":"n","score":0}}`},
		{name: "timestamp with millis", input: `{"ts":"2026-10-05T09:15:00.123Z"}`, want: `{"ts":"2026-10-05T09:15:00.123Z"}`},
		{name: "timestamp fraction trimmed", input: `{"ts":"2026-10-05T11:15:00.120+02:00"}`, want: `{"ts":"2026-10-05T09:15:00.12Z"}`},
		{name: "timestamp nanos", input: `{"ts":"2026-10-05T09:15:00.000000001Z"}`, want: `{"ts":"2026-10-05T09:15:00.000000001Z"}`},
		{name: "timestamp whole second", input: `{"ts":"2026-10-05T09:15:00Z"}`, want: `{"ts":"2026-10-05T09:15:00Z"}`},
		{name: "timestamp limits", input: `{"ts":"0001-01-01T00:00:00Z","any":{"@type":"type.googleapis.com/google.protobuf.Timestamp","value":"9999-12-31T23:59:59.999999999Z"}}`,
			want: `{"ts":"0001-01-01T00:00:00Z","any":{"@type":"type.googleapis.com/google.protobuf.Timestamp","value":"9999-12-31T23:59:59.999999999Z"}}`},
		{name: "timestamp epoch set explicitly", input: `{"ts":"1970-01-01T00:00:00Z"}`, want: `{"ts":"1970-01-01T00:00:00Z"}`},
		{name: "durations", input: `{"dur":"1.5s"}`, want: `{"dur":"1.500s"}`},
		{name: "negative duration", input: `{"dur":"-0.000000001s"}`, want: `{"dur":"-0.000000001s"}`},
		{name: "wrappers as plain values", input: `{"w_i64":"9007199254740993","w_s":"x"}`, want: `{"w_i64":9007199254740993,"w_s":"x"}`},
		{name: "wrappers set to zero values", input: `{"w_i64":0,"w_s":""}`, want: `{"w_i64":0,"w_s":""}`},
		{name: "struct, value, list",
			input: `{"st":{"a":1,"b":[true,null,"x"],"c":{"d":1.5}},"val":"hello","lv":[1,"a",{}]}`,
			want:  `{"st":{"a":1,"b":[true,null,"x"],"c":{"d":1.5}},"val":"hello","lv":[1,"a",{}]}`},
		{name: "value holding null", input: `{"val":null,"lv":[null]}`, want: `{"val":null,"lv":[null]}`},
		{name: "value with no kind set", input: `{}`,
			edit: func(m *dynamicpb.Message) { m.Mutable(m.Descriptor().Fields().ByName("val")) },
			want: `{"val":null}`},
		{name: "empty", input: `{"empty":{}}`, want: `{"empty":{}}`},
		{name: "field mask", input: `{"mask":"fooBar,baz.quxQuux"}`, want: `{"mask":"fooBar,baz.quxQuux"}`},
		{name: "any holding a message of the schema",
			input: `{"any":{"@type":"type.googleapis.com/shop.v1.Second","id":"s1"}}`,
			want:  `{"any":{"@type":"type.googleapis.com/shop.v1.Second","id":"s1"}}`},
		{name: "any holding a nested message, mapped like the others",
			input: `{"any":{"@type":"type.googleapis.com/shop.v1.All.Inner","name":"i"}}`,
			want:  `{"any":{"@type":"type.googleapis.com/shop.v1.All.Inner","name":"i","score":0}}`},
		{name: "any holding a well-known type",
			input: `{"any":{"@type":"type.googleapis.com/google.protobuf.Int64Value","value":"9007199254740993"}}`,
			want:  `{"any":{"@type":"type.googleapis.com/google.protobuf.Int64Value","value":9007199254740993}}`},
		{name: "any holding empty",
			input: `{"any":{"@type":"type.googleapis.com/google.protobuf.Empty"}}`,
			want:  `{"any":{"@type":"type.googleapis.com/google.protobuf.Empty"}}`},
		{name: "empty any", input: `{"any":{}}`, want: `{"any":{}}`},
		{name: "unknown fields are left out", input: `{"i32":1}`,
			edit: func(m *dynamicpb.Message) { m.SetUnknown(protoreflect.RawFields{0xf8, 0x3e, 0x05}) }, // field 999, varint 5
			want: `{"i32":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := protoMessage(t, c, "shop.v1.All", tc.input, tc.edit)
			got, err := toJSON(c, framed(t, []int{0}, marshalProto(t, m)))
			if err != nil {
				t.Fatalf("toJSON: %v", err)
			}
			checkJSON(t, got, withFields(t, tc.want))
		})
	}
}

// TestProtobufValueErrors: values the wire format carries but the mapping
// cannot write are errors naming the field.
func TestProtobufValueErrors(t *testing.T) {
	c := mustCompileProtobuf(t, allTypesProto)
	cases := []struct {
		name  string
		input string
		edit  func(*dynamicpb.Message)
		want  string // in the error text
	}{
		{name: "timestamp after 9999", edit: func(m *dynamicpb.Message) {
			setField(m, "ts.seconds", protoreflect.ValueOfInt64(253402300800))
		}, want: "at ts: google.protobuf.Timestamp: seconds 253402300800 outside the years 1 to 9999"},
		{name: "timestamp before year 1", edit: func(m *dynamicpb.Message) {
			setField(m, "ts.seconds", protoreflect.ValueOfInt64(-62135596801))
		}, want: "at ts: google.protobuf.Timestamp: seconds"},
		{name: "timestamp negative nanos", edit: func(m *dynamicpb.Message) {
			setField(m, "ts.nanos", protoreflect.ValueOfInt32(-1))
		}, want: "nanos -1"},
		{name: "timestamp nanos of a second or more", edit: func(m *dynamicpb.Message) {
			setField(m, "any.type_url", protoreflect.ValueOfString("type.googleapis.com/google.protobuf.Timestamp"))
			setField(m, "any.value", protoreflect.ValueOfBytes([]byte{0x10, 0x80, 0x94, 0xeb, 0xdc, 0x03})) // nanos 1e9
		}, want: "at any: google.protobuf.Timestamp: nanos 1000000000"},
		{name: "duration out of range", edit: func(m *dynamicpb.Message) {
			setField(m, "dur.seconds", protoreflect.ValueOfInt64(315576000001))
		}, want: "at dur: "},
		{name: "any of a type the schema does not know", input: `{"any":{}}`, edit: func(m *dynamicpb.Message) {
			setField(m, "any.type_url", protoreflect.ValueOfString("type.googleapis.com/other.Missing"))
		}, want: `at any: google.protobuf.Any: type "type.googleapis.com/other.Missing" is not in the schema`},
		{name: "any with malformed content", edit: func(m *dynamicpb.Message) {
			setField(m, "any.type_url", protoreflect.ValueOfString("type.googleapis.com/shop.v1.Second"))
			setField(m, "any.value", protoreflect.ValueOfBytes([]byte{0x0a, 0x05, 'a'}))
		}, want: "at any: google.protobuf.Any: shop.v1.Second:"},
		{name: "NUL in a string", input: `{"inners":[{},{"name":"a\u0000b"}]}`, want: "at inners[1].name: string holds the character U+0000"},
		{name: "NUL in a map key", input: `{"counts":{"a\u0000":1}}`, want: "at counts[key]: string holds the character U+0000"},
		{name: "NUL in a struct", input: `{"st":{"k":{"n":"\u0000"}}}`, want: `at st["k"]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			input := tc.input
			if input == "" {
				input = `{}`
			}
			m := protoMessage(t, c, "shop.v1.All", input, tc.edit)
			got, err := toJSON(c, framed(t, []int{0}, marshalProto(t, m)))
			if err == nil {
				t.Fatalf("toJSON = %s, want an error", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestProtobufMalformed: bytes that are not a message of the schema are
// errors, never a panic or a partial document.
func TestProtobufMalformed(t *testing.T) {
	c := mustCompileProtobuf(t, allTypesProto)
	good := marshalProto(t, protoMessage(t, c, "shop.v1.All", `{"s":"x","i64":5,"inner":{"name":"n"}}`, nil))
	cases := []struct {
		name    string
		payload []byte
		want    string
	}{
		{"empty payload", nil, "message indexes: missing or malformed count"},
		{"unterminated index count", []byte{0x80}, "message indexes: missing or malformed count"},
		{"negative index count", []byte{0x01}, "count -1 is out of range"},
		{"index count beyond the payload", []byte{0x7e, 0x00}, "count 63 is out of range"},
		{"top-level index out of range", framed(t, []int{2}, good), "message indexes [2]: no message at index 2 (2 there)"},
		{"negative index", []byte{0x02, 0x01}, "no message at index -1"},
		{"nested index out of range", framed(t, []int{0, 1}, good), "message indexes [0 1]: no message at index 1 (1 there)"},
		{"index into a message with no nested ones", framed(t, []int{1, 0}, good), "no message at index 0 (0 there)"},
		{"unterminated index", []byte{0x04, 0x00, 0x80}, "message indexes: malformed index after [0]"},
		{"truncated message", framed(t, []int{0}, good[:len(good)-1]), "shop.v1.All"},
		{"length beyond the message", framed(t, []int{0}, []byte{0x72, 0x05, 'a'}), "shop.v1.All"},
		{"invalid UTF-8 in a proto3 string", framed(t, []int{0}, []byte{0x72, 0x01, 0xff}), "UTF-8"},
		{"field number 0", framed(t, []int{0}, append(append([]byte{}, good...), 0x00)), "shop.v1.All"},
		// Field 18 (counts), one entry: key "a", then field 1 again as a
		// varint. google.golang.org/protobuf v1.36.12 panics on it.
		{"map key repeated with another wire type", []byte{0x00, 0x92, 0x01, 0x05, 0x0a, 0x01, 'a', 0x08, 0x00},
			"shop.v1.All: malformed message"},
		{"truncated fixed32 in a nested message", framed(t, []int{0}, []byte{0xa2, 0x01, 0x02, 0x0d, 0x00}), "shop.v1.All"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := toJSON(c, tc.payload)
			if err == nil {
				t.Fatalf("toJSON = %s, want an error", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestProtobufMessageIndexes: the indexes after the schema id pick the
// message among the file's top-level and nested messages.
func TestProtobufMessageIndexes(t *testing.T) {
	const schema = `syntax = "proto3";
package idx;
message A {
  map<string, string> labels = 2;
  message X { string x = 1; }
  message Y {
    message Z { string z = 1; }
    string y = 1;
  }
  string a = 1;
}
message B { string b = 1; }
`
	c := mustCompileProtobuf(t, schema)
	cases := []struct {
		name    string
		message string
		index   []int
		input   string
		want    string
	}{
		{"first message, one zero byte", "idx.A", []int{0}, `{"a":"1","labels":{"k":"v"}}`, `{"a":"1","labels":{"k":"v"}}`},
		{"second top-level message", "idx.B", []int{1}, `{"b":"2"}`, `{"b":"2"}`},
		{"first nested message, after a map field", "idx.A.X", []int{0, 0}, `{"x":"3"}`, `{"x":"3"}`},
		{"second nested message", "idx.A.Y", []int{0, 1}, `{"y":"4"}`, `{"y":"4"}`},
		{"nested two levels", "idx.A.Y.Z", []int{0, 1, 0}, `{"z":"5"}`, `{"z":"5"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			payload := framed(t, tc.index, marshalProto(t, protoMessage(t, c, tc.message, tc.input, nil)))
			got, err := toJSON(c, payload)
			if err != nil {
				t.Fatalf("toJSON: %v", err)
			}
			checkJSON(t, got, tc.want)
		})
	}
	// The long form of [0] (count 1, index 0), which some producers
	// write instead of the single zero byte.
	msg := marshalProto(t, protoMessage(t, c, "idx.A", `{"a":"long"}`, nil))
	got, err := toJSON(c, append([]byte{0x02, 0x00}, msg...))
	if err != nil {
		t.Fatalf("toJSON: %v", err)
	}
	checkJSON(t, got, `{"a":"long","labels":{}}`)
}

// TestProtobufEvolution: bytes written with one version of a schema read
// with another: added fields take their unset form, removed fields are
// ignored.
func TestProtobufEvolution(t *testing.T) {
	const v1 = `syntax = "proto3";
package shop;
message Order {
  string id = 1;
  int64 qty = 2;
}`
	const v2 = `syntax = "proto3";
package shop;
message Order {
  string id = 1;
  int64 qty = 2;
  string note = 3;
  Customer customer = 4;
  optional int32 priority = 5;
  repeated string tags = 6;
}
message Customer { string name = 1; }`
	const v3 = `syntax = "proto3";
package shop;
message Order {
  reserved 2;
  string id = 1;
  string note = 3;
}`
	cases := []struct {
		name          string
		writer, input string
		reader        string
		want          string
	}{
		{"field added in the reader", v1, `{"id":"o1","qty":3}`, v2,
			`{"id":"o1","qty":3,"note":"","customer":null,"priority":null,"tags":[]}`},
		{"field removed in the reader", v2, `{"id":"o1","qty":3,"note":"n","customer":{"name":"c"},"priority":1,"tags":["t"]}`, v3,
			`{"id":"o1","note":"n"}`},
		{"older reader", v2, `{"id":"o1","qty":3,"note":"n","priority":0}`, v1, `{"id":"o1","qty":3}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := mustCompileProtobuf(t, tc.writer)
			r := mustCompileProtobuf(t, tc.reader)
			payload := framed(t, []int{0}, marshalProto(t, protoMessage(t, w, "shop.Order", tc.input, nil)))
			got, err := toJSON(r, payload)
			if err != nil {
				t.Fatalf("toJSON: %v", err)
			}
			checkJSON(t, got, tc.want)
		})
	}
}

// TestProtobufReferences: imports resolve to the references by import
// path, a reference's own imports too, and the standard imports without
// being references.
func TestProtobufReferences(t *testing.T) {
	money := schemaRef{Name: "shop/common/money.proto", Schema: `syntax = "proto3";
package shop.common;
import "shop/common/currency.proto";
import "google/protobuf/timestamp.proto";
message Money {
  Currency currency = 1;
  int64 units = 2;
  google.protobuf.Timestamp as_of = 3;
}`}
	currency := schemaRef{Name: "shop/common/currency.proto", Schema: `syntax = "proto3";
package shop.common;
enum Currency { CURRENCY_UNSPECIFIED = 0; EUR = 1; }`}
	// A copy of a standard file among the references does not replace
	// the standard one (here it would break the Timestamp mapping).
	fakeTimestamp := schemaRef{Name: "google/protobuf/timestamp.proto", Schema: `syntax = "proto3";
package google.protobuf;
message Timestamp { string seconds = 1; }`}
	const schema = `syntax = "proto3";
package shop;
import "shop/common/money.proto";
message Order {
  string id = 1;
  shop.common.Money price = 2;
}`
	c := mustCompileProtobuf(t, schema, money, currency, fakeTimestamp)
	m := protoMessage(t, c, "shop.Order", `{"id":"o1","price":{"currency":"EUR","units":"12","as_of":"2026-10-05T09:15:00Z"}}`, nil)
	got, err := toJSON(c, framed(t, []int{0}, marshalProto(t, m)))
	if err != nil {
		t.Fatalf("toJSON: %v", err)
	}
	checkJSON(t, got, `{"id":"o1","price":{"currency":"EUR","units":12,"as_of":"2026-10-05T09:15:00Z"}}`)
}

// TestProtobufProto2: fields with explicit presence are null when unset,
// defaults included; a missing required field is an error.
func TestProtobufProto2(t *testing.T) {
	c := mustCompileProtobuf(t, `syntax = "proto2";
package p2;
message M {
  required string id = 1;
  optional int32 n = 2 [default = 5];
  optional string s = 3;
  repeated int32 r = 4;
  optional bytes raw = 5;
}`)
	m := protoMessage(t, c, "p2.M", `{"id":"x","s":""}`, nil)
	got, err := toJSON(c, framed(t, []int{0}, marshalProto(t, m)))
	if err != nil {
		t.Fatalf("toJSON: %v", err)
	}
	checkJSON(t, got, `{"id":"x","n":null,"s":"","r":[],"raw":null}`)

	// proto2 strings are not checked for UTF-8 by the decoder; the
	// mapping refuses them.
	b := []byte{0x0a, 0x01, 'x', 0x1a, 0x02, 0xc3, 0x28}
	if got, err := toJSON(c, framed(t, []int{0}, b)); err == nil || !strings.Contains(err.Error(), "at s: string is not valid UTF-8") {
		t.Fatalf("toJSON = %s, %v; want the UTF-8 error at s", got, err)
	}
	if got, err := toJSON(c, framed(t, []int{0}, []byte{0x10, 0x01})); err == nil || !strings.Contains(err.Error(), "required field p2.M.id not set") {
		t.Fatalf("toJSON = %s, %v; want the missing required field", got, err)
	}
}

// TestProtobufDepth: nesting deeper than jsonb takes is an error.
func TestProtobufDepth(t *testing.T) {
	c := mustCompileProtobuf(t, `syntax = "proto3";
package deep;
message N { N next = 1; int32 v = 2; }`)
	nest := func(levels int) []byte {
		b := []byte{0x10, 0x01}
		for range levels - 1 {
			b = append(protowireBytes(b), b...)
		}
		return b
	}
	if _, err := toJSON(c, framed(t, []int{0}, nest(pgjson.MaxDepth))); err != nil {
		t.Fatalf("%d levels: %v", pgjson.MaxDepth, err)
	}
	if got, err := toJSON(c, framed(t, []int{0}, nest(pgjson.MaxDepth+1))); err == nil {
		t.Fatalf("%d levels: toJSON = %.40s…, want an error", pgjson.MaxDepth+1, got)
	}
}

// protowireBytes is the tag and length of field 1 holding b.
func protowireBytes(b []byte) []byte {
	out := []byte{0x0a}
	n := len(b)
	for n >= 0x80 {
		out = append(out, byte(n)|0x80)
		n >>= 7
	}
	return append(out, byte(n))
}

// TestCompileProtobufErrors: schemas that do not compile are errors that
// say why.
func TestCompileProtobufErrors(t *testing.T) {
	cases := []struct {
		name   string
		schema string
		refs   []schemaRef
		want   string
	}{
		{"syntax error", `syntax = "proto3"; message M { string a = 1 }`, nil, "syntax error"},
		{"unknown type", `syntax = "proto3"; message M { Missing a = 1; }`, nil, "Missing"},
		{"import not among the references", `syntax = "proto3"; import "other/x.proto"; message M { int32 a = 1; }`, nil,
			`"other/x.proto" is neither a reference nor a standard import`},
		{"duplicate field number", `syntax = "proto3"; message M { int32 a = 1; int32 b = 1; }`, nil, "M"},
		{"no message", `syntax = "proto3"; enum E { E0 = 0; }`, nil, "defines no message"},
		{"broken reference", `syntax = "proto3"; import "r.proto"; message M { int32 a = 1; }`,
			[]schemaRef{{Name: "r.proto", Schema: `syntax = "proto3"; message R {`}}, "r.proto"},
		{"reference listed twice with different texts", `syntax = "proto3"; message M { int32 a = 1; }`,
			[]schemaRef{{Name: "r.proto", Schema: `syntax = "proto3";`}, {Name: "r.proto", Schema: `syntax = "proto2";`}},
			"listed twice"},
		{"not a proto file", `{"type":"record","name":"R","fields":[]}`, nil, "syntax error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := compileProtobuf(tc.schema, tc.refs)
			if err == nil {
				t.Fatalf("compileProtobuf = %v, want an error", c)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
	// A reference named like the schema's own file does not collide.
	c, err := compileProtobuf(`syntax = "proto3"; import "schema.proto"; message M { R r = 1; }`,
		[]schemaRef{{Name: protoMainFile, Schema: `syntax = "proto3"; message R { int32 x = 1; }`}})
	if err != nil {
		t.Fatalf("reference named %s: %v", protoMainFile, err)
	}
	got, err := toJSON(c, []byte{0, 0x0a, 0x02, 0x08, 0x03})
	if err != nil {
		t.Fatalf("toJSON: %v", err)
	}
	checkJSON(t, got, `{"r":{"x":3}}`)
}

// FuzzProtobuf: any payload either fails or gives JSON that jsonb takes;
// never a panic, and never more allocated than a few times the budget of
// a record of its size (see allocBound).
func FuzzProtobuf(f *testing.F) {
	c := mustCompileProtobuf(f, allTypesProto)
	for _, in := range []string{`{}`, `{"s":"x","counts":{"a":1},"inners":[{"name":"y"}]}`,
		`{"ts":"2026-10-05T09:15:00Z","st":{"a":[1,{"b":null}]},"any":{"@type":"type.googleapis.com/shop.v1.Second","id":"s"}}`} {
		f.Add(framed(f, []int{0}, marshalProto(f, protoMessage(f, c, "shop.v1.All", in, nil))))
	}
	f.Add([]byte{0x02, 0x02, 0x0a})
	// Empty elements of inners (field 21), and unknown groups nested
	// deep.
	f.Add(framed(f, []int{0}, bytes.Repeat([]byte{0xaa, 0x01, 0x00}, 1000)))
	f.Add(framed(f, []int{0}, protoGroups(1000)))
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := decodeBounded(t, c, payload)
		if err != nil {
			return
		}
		if err := pgjson.Scan(got, nil, nil); err != nil || !bytes.Equal(bytes.TrimSpace(got), got) {
			t.Fatalf("output %q: %v", got, err)
		}
	})
}

// TestCodecsConcurrent: one compiled codec serves many goroutines (run
// with -race).
func TestCodecsConcurrent(t *testing.T) {
	pc := mustCompileProtobuf(t, allTypesProto)
	pbPayload := framed(t, []int{0}, marshalProto(t, protoMessage(t, pc, "shop.v1.All",
		`{"s":"x","counts":{"a":1,"b":2},"any":{"@type":"type.googleapis.com/shop.v1.Second","id":"s"},"dur":"2s"}`, nil)))
	jc, err := compileJSONSchema(orderSchema, nil)
	if err != nil {
		t.Fatalf("compileJSONSchema: %v", err)
	}
	jsPayload := []byte(`{"id":"o1","qty":2,"items":[{"sku":"AB-1"}]}`)
	want, err := toJSON(pc, pbPayload)
	if err != nil {
		t.Fatalf("toJSON: %v", err)
	}
	errs := make(chan error, 8)
	for range cap(errs) {
		go func() {
			for range 50 {
				got, err := toJSON(pc, pbPayload)
				if err == nil && !bytes.Equal(got, want) {
					err = fmt.Errorf("protobuf: got %s, want %s", got, want)
				}
				if err == nil {
					_, err = toJSON(jc, jsPayload)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// hostileProto is a schema for the hostile Protobuf values: a recursive
// message, one of many fields, a map of them, and Anys.
var hostileProto = `syntax = "proto3";
package hostile;
import "google/protobuf/any.proto";
message N { N next = 1; int32 v = 2; }
message Big { ` + bigFields + ` }
message Holder {
  repeated Big bigs = 1;
  map<string, Big> by_name = 2;
  google.protobuf.Any any = 3;
  repeated int32 packed = 4;
  bytes pad = 5;
}
`

// bigFields declares 50 string fields of long names.
var bigFields = func() string {
	var b strings.Builder
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&b, "string a_rather_long_field_name_%d = %d; ", i, i)
	}
	return b.String()
}()

// protoNested is a message N nested levels deep, as TestProtobufDepth
// builds it, but without growing a copy at each level: the lengths are
// written from the inside out.
func protoNested(levels int) []byte {
	inner := []byte{0x10, 0x01}
	sizes := make([]int, levels)
	sizes[levels-1] = len(inner)
	for i := levels - 2; i >= 0; i-- {
		sizes[i] = 1 + protowire.SizeVarint(uint64(sizes[i+1])) + sizes[i+1]
	}
	var b []byte
	for i := range levels - 1 {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizes[i+1]))
	}
	return append(b, inner...)
}

// protoGroups is field 99, not in the schema, as groups nested levels
// deep.
func protoGroups(levels int) []byte {
	start, end := protowire.AppendTag(nil, 99, protowire.StartGroupType), protowire.AppendTag(nil, 99, protowire.EndGroupType)
	return append(bytes.Repeat(start, levels), bytes.Repeat(end, levels)...)
}

// protoAnys is a Holder whose Any holds an Any, levels deep, around a
// Holder with pad bytes of padding.
func protoAnys(levels, pad int) []byte {
	b := protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), make([]byte, pad))
	url := "type.googleapis.com/hostile.Holder"
	for range levels {
		anyMsg := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), url)
		anyMsg = protowire.AppendBytes(protowire.AppendTag(anyMsg, 2, protowire.BytesType), b)
		b = protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), anyMsg)
	}
	return b
}

// TestProtobufLimits checks that messages whose JSON would be larger
// than their budget, or nested deeper than maxDepth (messages, or groups
// no field declares), are refused as over a limit having allocated a few
// times their budget at most, and that messages within them decode.
func TestProtobufLimits(t *testing.T) {
	c := mustCompileProtobuf(t, hostileProto)
	empties := func(field protowire.Number, n int) []byte {
		var b []byte
		for i := range n {
			if field == 1 {
				b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), nil)
				continue
			}
			entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), strconv.Itoa(i))
			b = protowire.AppendBytes(protowire.AppendTag(b, field, protowire.BytesType), entry)
		}
		return b
	}
	tests := []struct {
		name    string
		index   int // of the message: 0 N, 2 Holder
		payload []byte
		lim     config.DecodeLimits
		want    string // a part of the JSON, or of the error
		limit   bool
	}{
		{"nested 100,000 deep", 0, protoNested(100_000), config.DecodeLimits{}, "hostile.N: nested more than 256 levels deep", true},
		{"nested 256 deep", 0, protoNested(maxDepth), config.DecodeLimits{}, `{"next":{"next":`, false},
		{"unknown groups 100,000 deep", 0, protoGroups(100_000), config.DecodeLimits{}, "hostile.N: nested more than 256 levels deep", true},
		{"unknown groups 255 deep", 0, protoGroups(maxDepth - 1), config.DecodeLimits{}, `{"next":null,"v":0}`, false},
		{"unknown groups 255 deep in a message", 0, protowire.AppendBytes([]byte{0x0a}, protoGroups(maxDepth-1)),
			config.DecodeLimits{}, "nested more than 256 levels deep", true},
		{"an unknown group not ended", 0, protowire.AppendTag(nil, 99, protowire.StartGroupType), config.DecodeLimits{},
			"hostile.N: proto", false},
		{"100,000 empty messages of 50 fields", 2, empties(1, 100_000), config.DecodeLimits{},
			"at bigs[", true},
		{"a map of 100,000 empty messages", 2, empties(2, 100_000), config.DecodeLimits{},
			`at by_name["`, true},
		{"a few empty messages", 2, empties(1, 3), config.DecodeLimits{}, `"bigs":[{"a_rather_long_field_name_1":""`, false},
		{"Anys in Anys", 2, protoAnys(200, 10_000), config.DecodeLimits{},
			"google.protobuf.Any hostile.Holder: more than the", true},
		{"Anys in Anys within the budget", 2, protoAnys(3, 100), config.DecodeLimits{}, `"@type":"type.googleapis.com/hostile.Holder"`, false},
		{"2^31 packed items", 2, protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.BytesType), 1<<31),
			config.DecodeLimits{}, "hostile.Holder: proto", false},
		{"a negative length", 2, protowire.AppendVarint(protowire.AppendTag(nil, 5, protowire.BytesType), 1<<63),
			config.DecodeLimits{}, "hostile.Holder: proto", false},
		{"over the cap", 2, protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), make([]byte, 900_000)),
			config.DecodeLimits{MaxBytes: 1 << 20}, "ingest.decode_max_bytes", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := framed(t, []int{tt.index}, tt.payload)
			b := newBudget(tt.lim, len(payload))
			var got []byte
			var err error
			n := allocated(func() { got, err = c.toJSON(payload, b) })
			if bound := allocBound(b.limit); n > bound {
				t.Errorf("allocated %d bytes, more than %d", n, bound)
			}
			switch {
			case err == nil && (tt.limit || !strings.Contains(string(got), tt.want)):
				t.Fatalf("got %.300s, want %.300s", got, tt.want)
			case err != nil && (!strings.Contains(err.Error(), tt.want) || errors.Is(err, errLimit) != tt.limit):
				t.Fatalf("got %.300v (over a limit: %t), want an error containing %q (%t)", err, errors.Is(err, errLimit), tt.want, tt.limit)
			}
		})
	}
}
