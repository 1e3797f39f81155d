package decode

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// orderSchema is a 2020-12 schema (no $schema) with the keywords the
// cases below break.
const orderSchema = `{
  "type": "object",
  "required": ["id", "qty"],
  "additionalProperties": false,
  "properties": {
    "id": {"type": "string", "minLength": 1},
    "qty": {"type": "integer", "minimum": 1},
    "price": {"type": "number"},
    "status": {"enum": ["open", "closed"]},
    "email": {"type": "string", "format": "email"},
    "items": {
      "type": "array",
      "items": {
        "type": "object",
        "required": ["sku"],
        "properties": {"sku": {"type": "string", "pattern": "^[A-Z]+-[0-9]+$"}}
      }
    }
  }
}`

// mustCompileJSONSchema compiles a schema the test expects to compile.
func mustCompileJSONSchema(t *testing.T, schema string, refs ...schemaRef) codec {
	t.Helper()
	c, err := compileJSONSchema(schema, refs)
	if err != nil {
		t.Fatalf("compileJSONSchema: %v", err)
	}
	return c
}

// checkValid fails unless c takes payload and returns it unchanged.
func checkValid(t *testing.T, c codec, payload string) {
	t.Helper()
	got, err := toJSON(c, []byte(payload))
	if err != nil {
		t.Fatalf("toJSON(%s): %v", payload, err)
	}
	if !bytes.Equal(got, []byte(payload)) {
		t.Fatalf("toJSON changed the value\n got: %s\nwant: %s", got, payload)
	}
}

// checkInvalid fails unless c refuses payload with an error holding each
// of wants.
func checkInvalid(t *testing.T, c codec, payload string, wants ...string) {
	t.Helper()
	got, err := toJSON(c, []byte(payload))
	if err == nil {
		t.Fatalf("toJSON(%s) = %s, want an error", payload, got)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not contain %q", err, w)
		}
	}
}

// TestJSONSchemaValidate: a valid value comes back byte for byte; an
// invalid one is an error naming the instance location and the keyword.
func TestJSONSchemaValidate(t *testing.T) {
	c := mustCompileJSONSchema(t, orderSchema)
	valid := []string{
		`{"id":"o1","qty":1}`,
		` {"id" : "o1", "qty": 12, "price": 12345678901234567890.123456789, "status": "open",
		  "items": [{"sku": "AB-1"}, {"sku": "C-22", "extra": [null, true]}]} `,
		`{"id":"o1","qty":1.0,"price":-1e400}`,
		`{"id":"\u00e9\ud83d\ude00","qty":1,"id":"dup, last wins as in jsonb"}`,
		// Formats are annotations in 2020-12.
		`{"id":"o1","qty":1,"email":"not an email"}`,
	}
	for _, v := range valid {
		checkValid(t, c, v)
	}
	cases := []struct {
		name    string
		payload string
		wants   []string
	}{
		{"missing property", `{"id":"o1"}`, []string{"at the document root: missing property 'qty' [#/required]"}},
		{"wrong type", `{"id":"o1","qty":"3"}`, []string{"at /qty: got string, want integer [#/properties/qty/type]"}},
		{"below minimum", `{"id":"o1","qty":0}`, []string{"at /qty: minimum: got 0, want 1 [#/properties/qty/minimum]"}},
		{"fraction for an integer", `{"id":"o1","qty":1.5}`, []string{"at /qty", "#/properties/qty/type"}},
		{"not in the enum", `{"id":"o1","qty":1,"status":"lost"}`, []string{"at /status", "[#/properties/status/enum]"}},
		{"additional property", `{"id":"o1","qty":1,"note":"x"}`, []string{"at the document root", "'note'", "[#/additionalProperties]"}},
		{"nested array item", `{"id":"o1","qty":1,"items":[{"sku":"AB-1"},{"sku":"ab"}]}`,
			[]string{"at /items/1/sku", "[#/properties/items/items/properties/sku/pattern]"}},
		{"several failures", `{"qty":0,"id":""}`, []string{"at /qty", "at /id", "; "}},
		{"not an object", `[]`, []string{"at the document root: got array, want object [#/type]"}},
		{"not JSON", `{"id":`, []string{"invalid JSON"}},
		{"trailing data", `{"id":"o1","qty":1} x`, []string{"after the JSON value"}},
		{"empty", ``, nil},
		{"NUL that jsonb refuses", `{"id":"a\u0000","qty":1}`, []string{"invalid JSON"}},
		{"invalid UTF-8", "{\"id\":\"\xff\",\"qty\":1}", []string{"invalid JSON"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkInvalid(t, c, tc.payload, tc.wants...)
		})
	}
}

// TestJSONSchemaErrorLength: however many failures, the error text stays
// short and valid UTF-8.
func TestJSONSchemaErrorLength(t *testing.T) {
	c := mustCompileJSONSchema(t, `{"type":"array","items":{"type":"string","minLength":100}}`)
	var b strings.Builder
	b.WriteString("[")
	for i := range 500 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"ééééééééééééééééééééééééééééééééééééééé"`)
	}
	b.WriteString("]")
	_, err := toJSON(c, []byte(b.String()))
	if err == nil {
		t.Fatal("toJSON: want an error")
	}
	if msg := err.Error(); len(msg) > maxSchemaErrorLen+len("…") || !utf8.ValidString(msg) ||
		!strings.Contains(msg, "at /0: minLength") || !strings.Contains(msg, "and 497 more") {
		t.Fatalf("error text (%d bytes): %q", len(msg), msg)
	}
}

// TestJSONSchemaDrafts: $schema picks the draft; without it the schema is
// 2020-12. Formats assert in drafts 4 to 7 and annotate from 2019-09 on.
func TestJSONSchemaDrafts(t *testing.T) {
	cases := []struct {
		name           string
		schema         string
		valid, invalid string
	}{
		{"no $schema is 2020-12: prefixItems applies", `{"prefixItems":[{"type":"integer"}]}`, `[1,"x"]`, `["x"]`},
		{"2020-12 by $schema", `{"$schema":"https://json-schema.org/draft/2020-12/schema","prefixItems":[{"type":"integer"}]}`,
			`[1]`, `["x"]`},
		{"2019-09: dependentRequired", `{"$schema":"https://json-schema.org/draft/2019-09/schema","dependentRequired":{"a":["b"]}}`,
			`{"a":1,"b":2}`, `{"a":1}`},
		{"draft-07: items as a tuple", `{"$schema":"http://json-schema.org/draft-07/schema#","items":[{"type":"integer"}]}`,
			`[1,"x"]`, `["x"]`},
		{"draft-06: exclusiveMinimum as a number", `{"$schema":"http://json-schema.org/draft-06/schema#","exclusiveMinimum":5}`,
			`6`, `5`},
		{"draft-04: exclusiveMinimum as a boolean", `{"$schema":"http://json-schema.org/draft-04/schema#","minimum":5,"exclusiveMinimum":true}`,
			`6`, `5`},
		{"draft-07 asserts formats", `{"$schema":"http://json-schema.org/draft-07/schema#","format":"date-time"}`,
			`"2026-10-05T09:15:00Z"`, `"yesterday"`},
		{"draft-04 asserts formats", `{"$schema":"http://json-schema.org/draft-04/schema#","format":"ipv4"}`,
			`"10.0.0.1"`, `"10.0.0.256"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustCompileJSONSchema(t, tc.schema)
			checkValid(t, c, tc.valid)
			checkInvalid(t, c, tc.invalid, "JSON schema validation failed")
		})
	}
	for _, schema := range []string{
		`{"format":"date-time"}`,
		`{"$schema":"https://json-schema.org/draft/2019-09/schema","format":"date-time"}`,
	} {
		checkValid(t, mustCompileJSONSchema(t, schema), `"yesterday"`)
	}
}

// TestJSONSchemaReferences: $refs resolve to the references by URL,
// relative to the schema's $id or not, and references refer to each
// other.
func TestJSONSchemaReferences(t *testing.T) {
	customer := `{"type":"object","required":["name"],"properties":{"name":{"type":"string"},"address":{"$ref":"address.json"}}}`
	address := `{"type":"object","required":["city"],"properties":{"city":{"type":"string"}}}`
	defs := `{"$defs":{"money":{"type":"object","required":["units"],"properties":{"units":{"type":"integer"}}}}}`
	cases := []struct {
		name           string
		schema         string
		refs           []schemaRef
		valid, invalid string
		wants          []string
	}{
		{"relative name, schema without $id",
			`{"type":"object","properties":{"customer":{"$ref":"customer.json"}}}`,
			[]schemaRef{{"customer.json", customer}, {"address.json", address}},
			`{"customer":{"name":"c","address":{"city":"x"}}}`, `{"customer":{"name":"c","address":{}}}`,
			[]string{"at /customer/address: missing property 'city' [registry:///address.json#/required]"}},
		{"relative name, schema with $id",
			`{"$id":"https://example.com/schemas/order.json","properties":{"customer":{"$ref":"customer.json"}}}`,
			[]schemaRef{{"customer.json", customer}, {"address.json", address}},
			`{"customer":{"name":"c"}}`, `{"customer":{"name":1}}`,
			[]string{"at /customer/name: got number, want string [https://example.com/schemas/customer.json#/properties/name/type]"}},
		{"absolute name",
			`{"properties":{"customer":{"$ref":"https://example.com/customer.json"}}}`,
			[]schemaRef{{"https://example.com/customer.json", customer}, {"https://example.com/address.json", address}},
			`{"customer":{"name":"c"}}`, `{"customer":{}}`,
			[]string{"at /customer: missing property 'name'"}},
		{"reference found by its own $id",
			`{"properties":{"customer":{"$ref":"https://example.com/c"}}}`,
			[]schemaRef{{"customer.json", `{"$id":"https://example.com/c","required":["name"]}`}},
			`{"customer":{"name":"c"}}`, `{"customer":{}}`,
			[]string{"missing property 'name'"}},
		{"fragment into a reference",
			`{"properties":{"price":{"$ref":"defs.json#/$defs/money"}}}`,
			[]schemaRef{{"defs.json", defs}},
			`{"price":{"units":3}}`, `{"price":{"units":"3"}}`,
			[]string{"at /price/units", "defs.json#/$defs/money/properties/units/type"}},
		{"draft-07 reference from a 2020-12 schema",
			`{"properties":{"t":{"$ref":"tuple.json"}}}`,
			[]schemaRef{{"tuple.json", `{"$schema":"http://json-schema.org/draft-07/schema#","items":[{"type":"integer"}]}`}},
			`{"t":[1,"x"]}`, `{"t":["x"]}`, []string{"at /t/0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustCompileJSONSchema(t, tc.schema, tc.refs...)
			checkValid(t, c, tc.valid)
			checkInvalid(t, c, tc.invalid, tc.wants...)
		})
	}
}

// TestCompileJSONSchemaErrors: schemas that do not compile are errors
// saying why; nothing outside the references is ever loaded.
func TestCompileJSONSchemaErrors(t *testing.T) {
	cases := []struct {
		name   string
		schema string
		refs   []schemaRef
		want   string
	}{
		{"not JSON", `{"type":`, nil, "JSON schema is not JSON"},
		{"invalid against the meta-schema", `{"type":5}`, nil, "the schema is not valid against its meta-schema: at /type: "},
		{"unknown type name", `{"type":"integr"}`, nil, "at /type: value must be one of"},
		{"remote $ref not among the references", `{"$ref":"https://example.com/missing.json"}`, nil,
			`"https://example.com/missing.json": not among the schema's references`},
		{"relative $ref not among the references", `{"$ref":"missing.json"}`,
			[]schemaRef{{"other.json", `{}`}}, `"registry:///missing.json": not among the schema's references`},
		{"file $ref", `{"$ref":"file:///etc/hostname"}`, nil, `"file:///etc/hostname": not among the schema's references`},
		{"unknown $schema", `{"$schema":"https://example.com/my-meta","type":"object"}`, nil, `"https://example.com/my-meta": not among the schema's references`},
		{"pattern Go's regexp cannot compile", `{"pattern":"^(?!x)"}`, nil, "at /pattern: '^(?!x)' is not valid regex"},
		{"reference not JSON", `{"$ref":"r.json"}`, []schemaRef{{"r.json", `{`}}, `reference "r.json" is not JSON`},
		{"invalid reference", `{"$ref":"r.json"}`, []schemaRef{{"r.json", `{"minimum":"x"}`}}, "reference registry:///r.json is not valid against its meta-schema: at /minimum"},
		{"reference without a name", `{}`, []schemaRef{{"", `{}`}}, "is not a URL"},
		{"reference named like the schema", `{}`, []schemaRef{{"schema.json", `{}`}}, "resolves to the schema's own URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := compileJSONSchema(tc.schema, tc.refs)
			if err == nil {
				t.Fatalf("compileJSONSchema = %v, want an error", c)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestJSONSchemaLimits checks that values nested deeper than maxDepth,
// larger than their budget, or holding numbers that would cost the
// validator more than their size pays for, are refused as over a limit
// having allocated a few times their budget at most; and that ordinary
// numbers are not.
func TestJSONSchemaLimits(t *testing.T) {
	c := mustCompileJSONSchema(t, `{"type": "array", "items": {"type": ["integer", "array"], "minimum": 0}}`)
	tests := []struct {
		name    string
		payload string
		lim     config.DecodeLimits
		want    string // an error's part; empty: valid
		limit   bool
	}{
		{"10,000 numbers of exponent 131071", "[" + strings.Repeat("1e131071,", 9_999) + "1e131071]", config.DecodeLimits{},
			"a number of 1 digits and an exponent of 131071: more than", true},
		{"a number of 131,072 digits", "[1" + strings.Repeat("0", 131_071) + "]", config.DecodeLimits{},
			"a number of 131072 digits and an exponent of 0: more than", true},
		{"nested 100,000 deep", strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000), config.DecodeLimits{},
			"nested more than 256 levels deep", true},
		{"nested 256 deep", strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth), config.DecodeLimits{}, "", false},
		{"ordinary numbers", "[" + strings.Repeat("12345678901234567890,1e300,", 10_000) + "0]", config.DecodeLimits{}, "", false},
		{"a string over the cap", `["` + strings.Repeat("x", 2<<20) + `"]`, config.DecodeLimits{MaxBytes: 1 << 20},
			"ingest.decode_max_bytes", true},
		{"escapes are no numbers", `[[], "\"1e131071\\", "1e131071"]`, config.DecodeLimits{}, "at /1: got string, want integer", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBudget(tt.lim, len(tt.payload))
			var err error
			n := allocated(func() { _, err = c.toJSON([]byte(tt.payload), b) })
			if bound := allocBound(b.limit); n > bound {
				t.Errorf("allocated %d bytes, more than %d", n, bound)
			}
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want the value", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || errors.Is(err, errLimit) != tt.limit):
				t.Fatalf("got %.300v (over a limit: %t), want an error containing %q (%t)", err, errors.Is(err, errLimit), tt.want, tt.limit)
			}
		})
	}
}

// fuzzJSONSchema uses the keywords that read numbers exactly (type
// integer, minimum, multipleOf, enum, uniqueItems), a pattern, and
// recursion through $ref.
const fuzzJSONSchema = `{
  "type": "object",
  "properties": {
    "qty": {"type": "integer", "minimum": 1, "multipleOf": 1},
    "price": {"type": "number", "maximum": 1e9},
    "status": {"enum": ["open", "closed", 1.5]},
    "tags": {"type": "array", "uniqueItems": true},
    "sku": {"type": "string", "pattern": "^[A-Z]+-[0-9]+$"},
    "children": {"type": "array", "items": {"$ref": "#"}}
  }
}`

// FuzzJSONSchema: any payload either is valid and comes back unchanged as
// JSON that jsonb takes, or is an error; never a panic, and never more
// allocated than a few times the budget of a record of its size (see
// allocBound).
func FuzzJSONSchema(f *testing.F) {
	c, err := compileJSONSchema(fuzzJSONSchema, nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		`{"qty": 2, "price": 9.5, "status": "open", "tags": [1, "1", [1]], "sku": "AB-1", "children": [{"qty": 1}]}`,
		`{"qty": 1e131071}`,
		`{"tags": [` + strings.Repeat(`1e1000,`, 100) + `1]}`,
		strings.Repeat(`{"children": [`, 100) + strings.Repeat(`]}`, 100),
		`{"qty": 0.5, "status": "lost"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := decodeBounded(t, c, payload)
		if err != nil {
			return
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("toJSON changed %q into %q", payload, got)
		}
		if err := pgjson.Scan(got, nil, nil); err != nil {
			t.Fatalf("output %q: %v", got, err)
		}
	})
}
