package pgjson

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// absent marks, in the tables below, a pointer that names no value.
const absent = "<absent>"

// nest returns depth nested arrays around inner, e.g. nest(2, "1") is [[1]].
func nest(depth int, inner string) string {
	return strings.Repeat("[", depth) + inner + strings.Repeat("]", depth)
}

// nestObj returns depth nested objects {"a":…} around inner.
func nestObj(depth int, inner string) string {
	return strings.Repeat(`{"a":`, depth) + inner + strings.Repeat("}", depth)
}

// mustPointers compiles pointer texts or fails the test.
func mustPointers(t testing.TB, texts ...string) []Pointer {
	t.Helper()
	ptrs := make([]Pointer, len(texts))
	for i, p := range texts {
		var err error
		if ptrs[i], err = ParsePointer(p); err != nil {
			t.Fatalf("ParsePointer(%q): %v", p, err)
		}
	}
	return ptrs
}

// scan runs Scan with the given pointers, starting from an out slice
// full of stale bytes so that a value left over from earlier use shows up.
func scan(t testing.TB, doc string, texts ...string) ([][]byte, error) {
	t.Helper()
	ptrs := mustPointers(t, texts...)
	out := make([][]byte, len(ptrs))
	for k := range out {
		out[k] = []byte("stale")
	}
	err := Scan([]byte(doc), ptrs, out)
	return out, err
}

func TestScanValidity(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		ok   bool
	}{
		// Scalars and containers.
		{"object", `{"a":1}`, true},
		{"empty object", `{}`, true},
		{"empty array", `[]`, true},
		{"array", `[1,"two",3.0,true,false,null,{},[]]`, true},
		{"string", `"hello"`, true},
		{"empty string", `""`, true},
		{"true", `true`, true},
		{"false", `false`, true},
		{"null", `null`, true},
		{"zero", `0`, true},
		{"minus zero", `-0`, true},
		{"integer", `12345678901234567890123456789`, true},
		{"negative", `-17`, true},
		{"fraction", `3.14159`, true},
		{"zero fraction", `0.5`, true},
		{"exponent", `1e5`, true},
		{"exponent upper", `1E5`, true},
		{"exponent plus", `1e+5`, true},
		{"exponent minus", `1.5e-5`, true},
		{"zero exponent", `0e0`, true},
		{"exponent leading zeros", `1e0000000000000000000000005`, true},
		{"exponent at limit", `1e100000`, true},
		{"exponent at limit upper plus", `1E+100000`, true},
		{"small number jsonb accepts", `1e-16383`, true},
		{"whitespace everywhere", " \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } } \n", true},
		{"nested", `{"a":{"b":{"c":[{"d":[null]}]}}}`, true},
		{"duplicate keys", `{"a":1,"a":2}`, true},
		{"empty key", `{"":1}`, true},

		// Strings and escapes.
		{"all simple escapes", `"\" \\ \/ \b \f \n \r \t"`, true},
		{"unicode escape", `"\u00e9\u00E9"`, true},
		{"escape of ffff", `"\uFFFF"`, true},
		{"paired surrogates", `"\ud83d\ude00"`, true},
		{"paired surrogates upper", `"\uD83D\uDE00"`, true},
		{"last paired surrogates", `"\uDBFF\uDFFF"`, true},
		{"first paired surrogates", `"\uD800\uDC00"`, true},
		{"raw 2 byte utf8", "\"é\"", true},
		{"raw 3 byte utf8", "\"€\"", true},
		{"raw 4 byte utf8", "\"😀\"", true},
		{"raw max code point", "\"\U0010FFFF\"", true},
		{"raw replacement character", "\"\uFFFD\"", true},
		{"raw DEL", "\"\x7f\"", true},
		{"escaped key", `{"a\/b\u0063":1}`, true},
		{"escaped backslash then u0000 text", `"\\u0000"`, true},

		// Nesting.
		{"array depth 256", nest(256, "1"), true},
		{"object depth 256", nestObj(256, "1"), true},
		{"empty arrays depth 256", nest(256, ""), true},
		{"array depth 257", nest(257, "1"), false},
		{"object depth 257", nestObj(257, "1"), false},
		{"mixed depth 257", "[" + nestObj(256, "[]") + "]", false},
		{"very deep", nest(100000, ""), false},
		{"depth is not width", "[" + strings.Repeat(nest(200, "")+",", 10) + "1]", true},

		// Empty and truncated input.
		{"empty", ``, false},
		{"only whitespace", " \n\t", false},
		{"open object", `{`, false},
		{"open array", `[`, false},
		{"object without value", `{"a":`, false},
		{"object without colon", `{"a"`, false},
		{"object without close", `{"a":1`, false},
		{"object after comma", `{"a":1,`, false},
		{"array without close", `[1`, false},
		{"array after comma", `[1,`, false},
		{"unterminated string", `"abc`, false},
		{"unterminated key", `{"abc`, false},
		{"unterminated escape", `"\`, false},
		{"short unicode escape", `"\u12`, false},
		{"short unicode escape closed", `"\u12"`, false},
		{"truncated true", `tru`, false},
		{"truncated false", `fals`, false},
		{"truncated null", `nul`, false},
		{"minus alone", `-`, false},
		{"fraction without digits", `1.`, false},
		{"exponent without digits", `1e`, false},
		{"exponent sign without digits", `1e+`, false},
		{"truncated surrogate pair", `"\ud83d\ude0`, false},

		// Trailing data.
		{"two values", `1 2`, false},
		{"two objects", `{} {}`, false},
		{"garbage after object", `{}x`, false},
		{"comma after value", `[1],`, false},
		{"extra close", `[1]]`, false},
		{"NUL after value", "{}\x00", false},
		{"literal with suffix", `truex`, false},
		{"null with suffix", `nulll`, false},
		{"number then literal", `[1true]`, false},

		// Numbers.
		{"leading zero", `01`, false},
		{"negative leading zero", `-01`, false},
		{"double zero", `00`, false},
		{"leading zero in array", `[01]`, false},
		{"leading zero in object", `{"a":00}`, false},
		{"leading plus", `+1`, false},
		{"leading dot", `.5`, false},
		{"minus dot", `-.5`, false},
		{"double minus", `--1`, false},
		{"hex", `0x10`, false},
		{"NaN", `NaN`, false},
		{"Infinity", `Infinity`, false},
		{"minus Infinity", `-Infinity`, false},
		{"two dots", `1.2.3`, false},
		{"two exponents", `1e2e3`, false},
		{"exponent over limit", `1e131072`, false},
		{"negative exponent over limit", `1e-100001`, false},
		{"huge exponent", `1e99999999999999999999999999`, false},
		{"huge exponent in array", `[1E+99999999999999999999]`, false},

		// Literals and structure.
		{"capital True", `True`, false},
		{"capital NULL", `NULL`, false},
		{"undefined", `undefined`, false},
		{"trailing comma in array", `[1,]`, false},
		{"trailing comma in object", `{"a":1,}`, false},
		{"leading comma in array", `[,1]`, false},
		{"lone comma in object", `{,}`, false},
		{"missing comma in array", `[1 2]`, false},
		{"missing comma in object", `{"a":1 "b":2}`, false},
		{"missing colon", `{"a" 1}`, false},
		{"double colon", `{"a"::1}`, false},
		{"unquoted key", `{a:1}`, false},
		{"number key", `{1:1}`, false},
		{"single quoted key", `{'a':1}`, false},
		{"single quoted string", `'a'`, false},
		{"mismatched brackets", `[}`, false},
		{"mismatched braces", `{]`, false},
		{"array closed by brace", `[1}`, false},
		{"comment", `{} // x`, false},
		{"block comment", `/* x */ {}`, false},
		{"byte order mark", "\ufeff{}", false},
		{"form feed is not whitespace", "\f{}", false},
		{"vertical tab is not whitespace", "{}\v", false},
		{"no-break space is not whitespace", "{}\u00a0", false},

		// Escapes.
		{"unknown escape", `"\x41"`, false},
		{"escaped single quote", `"\'"`, false},
		{"capital U escape", `"\U0041"`, false},
		{"bad hex digit", `"\u00G0"`, false},
		{"escaped newline char", "\"\\\n\"", false},
		{"u0000", `"\u0000"`, false},
		{"u0000 in key", `{"\u0000":1}`, false},
		{"u0000 in the middle", `"abc\u0000def"`, false},
		{"lone high surrogate", `"\ud800"`, false},
		{"lone high surrogate then text", `"\ud83dx"`, false},
		{"high surrogate then letter escape", `"\ud83d\u0041"`, false},
		{"high surrogate then high surrogate", `"\ud83d\ud83d"`, false},
		{"high surrogate then simple escape", `"\ud83d\n"`, false},
		{"high surrogate then bad hex", `"\ud83d\uDZ00"`, false},
		{"high surrogate then u0000", `"\ud83d\u0000"`, false},
		{"lone low surrogate", `"\udc00"`, false},
		{"lone low surrogate upper", `"\uDFFF"`, false},
		{"reversed surrogate pair", `"\ude00\ud83d"`, false},
		{"lone surrogate in key", `{"\ud800":1}`, false},
		{"lone surrogate after pair", `"\ud83d\ude00\ud83d"`, false},

		// Control characters.
		{"raw NUL in string", "\"a\x00b\"", false},
		{"raw tab in string", "\"a\tb\"", false},
		{"raw newline in string", "\"a\nb\"", false},
		{"raw carriage return in string", "\"a\rb\"", false},
		{"raw 0x1f in string", "\"\x1f\"", false},
		{"raw control in key", "{\"\x01\":1}", false},

		// UTF-8.
		{"invalid byte", "\"\xff\"", false},
		{"continuation byte alone", "\"\x80\"", false},
		{"truncated two byte sequence", "\"\xc3\"", false},
		{"truncated three byte sequence", "\"\xe2\x82\"", false},
		{"truncated four byte sequence at end", "\"\xf0\x9f\x98", false},
		{"overlong slash", "\"\xc0\xaf\"", false},
		{"overlong three byte", "\"\xe0\x80\xaf\"", false},
		{"utf8 encoded surrogate", "\"\xed\xa0\x80\"", false},
		{"utf8 beyond U+10FFFF", "\"\xf4\x90\x80\x80\"", false},
		{"invalid utf8 in key", "{\"\xfe\":1}", false},
		{"invalid utf8 outside string", "[1,\xff]", false},
		{"latin1 text", "\"caf\xe9\"", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Scan([]byte(tt.doc), nil, nil)
			switch {
			case tt.ok && err != nil:
				t.Errorf("Scan(%.60q) = %v, want nil", tt.doc, err)
			case !tt.ok && err == nil:
				t.Errorf("Scan(%.60q) = nil, want an error", tt.doc)
			case !tt.ok && !errors.Is(err, ErrInvalid):
				t.Errorf("Scan(%.60q) = %v, want an error wrapping ErrInvalid", tt.doc, err)
			}
			// With or without pointers the verdict is the same.
			err2 := Scan([]byte(tt.doc), mustPointers(t, "/a", "/0/0"), make([][]byte, 2))
			if (err == nil) != (err2 == nil) {
				t.Errorf("Scan(%.60q): %v without pointers but %v with pointers", tt.doc, err, err2)
			}
		})
	}
}

// TestScanNumberRange checks numbers that are valid JSON but that
// PostgreSQL's numeric type, and therefore jsonb, cannot hold: jsonb
// accepts at most 131072 digits before the decimal point and a display
// scale of at most 16383 (digits after the point, less the exponent).
// The verdicts were checked against PostgreSQL 15 ('…'::jsonb).
func TestScanNumberRange(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		ok   bool
	}{
		{"smallest scale jsonb accepts", `1e-16383`, true},
		{"one fraction digit within scale", `1.5e-16382`, true},
		{"16383 fraction digits", "0." + strings.Repeat("1", 16383), true},
		{"exponent beyond scale", `1e-16384`, false},
		{"fraction digits and exponent beyond scale", `1.55e-16382`, false},
		{"zero with large negative exponent", `0e-20000`, false},
		{"negative exponent at the positive limit", `1e-100000`, false},
		{"16384 fraction digits", "0." + strings.Repeat("1", 16384), false},
		{"131073 integer digits", strings.Repeat("1", 131073), false},
		{"131072 integer digits", strings.Repeat("1", 131072), true},
		{"largest weight", `9.9e131071`, true},
		{"weight beyond the limit", `10e131071`, false},
		{"zero with a huge exponent", `0e200000`, true},
		{"zero with an exponent just inside numeric's limit", `0e1073741822`, true},
		{"an exponent at numeric's limit", `0e1073741823`, false},
		{"an exponent written with leading zeros", `1e-0000000000000000000001`, true},
		{"leading fraction zeros lower the weight", `0.0001e131074`, true},
		{"fraction shifted into range", `0.05e-16381`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Scan([]byte(tt.doc), nil, nil)
			if tt.ok && err != nil {
				t.Errorf("Scan(%.40q…) = %v, want nil", tt.doc, err)
			}
			if !tt.ok && err == nil {
				t.Errorf("Scan(%.40q…) = nil, want an error: jsonb rejects it (value overflows numeric format)", tt.doc)
			}
		})
	}
}

func TestScanPointers(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		ptrs []string
		want []string // raw bytes, or absent
	}{
		// Top level.
		{"top-level number", `{"a":1}`, []string{"/a"}, []string{"1"}},
		{"top-level string keeps quotes and escapes", `{"a":"x\ny\u00e9"}`, []string{"/a"}, []string{`"x\ny\u00e9"`}},
		{"top-level literals", `{"t":true,"f":false,"n":null}`, []string{"/t", "/f", "/n"}, []string{"true", "false", "null"}},
		{"raw object keeps inner whitespace", `{ "a" : { "b" : [ 1 , 2 ] } , "c":3 }`, []string{"/a"}, []string{`{ "b" : [ 1 , 2 ] }`}},
		{"raw array", `{"a":[1, [2], {"x":3}]}`, []string{"/a"}, []string{`[1, [2], {"x":3}]`}},
		{"number text kept", `{"a":-1.50E+03}`, []string{"/a"}, []string{"-1.50E+03"}},
		{"later keys do not matter", `{"a":1,"b":2,"c":3}`, []string{"/b"}, []string{"2"}},
		{"missing key", `{"a":1}`, []string{"/b"}, []string{absent}},
		{"empty object", `{}`, []string{"/a"}, []string{absent}},
		{"key is case sensitive", `{"A":1}`, []string{"/a"}, []string{absent}},
		{"key prefix is not a match", `{"ab":1}`, []string{"/a"}, []string{absent}},
		{"empty key", `{"":5,"a":1}`, []string{"/"}, []string{"5"}},
		{"empty key nested", `{"":{"":7}}`, []string{"//"}, []string{"7"}},

		// Nested.
		{"nested", `{"a":{"b":{"c":"deep"}}}`, []string{"/a/b/c"}, []string{`"deep"`}},
		{"nested intermediate", `{"a":{"b":{"c":"deep"}}}`, []string{"/a/b"}, []string{`{"c":"deep"}`}},
		{"nested missing leaf", `{"a":{"b":{}}}`, []string{"/a/b/c"}, []string{absent}},
		{"nested missing middle", `{"a":{"x":{"c":1}}}`, []string{"/a/b/c"}, []string{absent}},
		{"same key at other level does not match", `{"b":1,"a":{"c":2}}`, []string{"/a/b"}, []string{absent}},
		{"leaf name at top level does not match", `{"c":1}`, []string{"/a/c"}, []string{absent}},
		{"pointer at depth 256", nestObj(256, "1"), []string{strings.Repeat("/a", 256)}, []string{"1"}},

		// Arrays.
		{"array index 0", `{"a":[10,20,30]}`, []string{"/a/0"}, []string{"10"}},
		{"array index 2", `{"a":[10,20,30]}`, []string{"/a/2"}, []string{"30"}},
		{"array index out of range", `{"a":[10,20,30]}`, []string{"/a/3"}, []string{absent}},
		{"array index with leading zero", `{"a":[10,20,30]}`, []string{"/a/01"}, []string{absent}},
		{"array index dash", `{"a":[10,20,30]}`, []string{"/a/-"}, []string{absent}},
		{"array index negative", `{"a":[10,20,30]}`, []string{"/a/-1"}, []string{absent}},
		{"array index not a number", `{"a":[10,20,30]}`, []string{"/a/x"}, []string{absent}},
		{"array index with plus sign", `{"a":[10,20,30]}`, []string{"/a/+1"}, []string{absent}},
		{"array index minus zero", `{"a":[10,20,30]}`, []string{"/a/-0"}, []string{absent}},
		{"array index empty token", `{"a":[10,20,30]}`, []string{"/a/"}, []string{absent}},
		{"array index huge", `{"a":[10]}`, []string{"/a/99999999999999999999"}, []string{absent}},
		{"top-level array", `[1,[2,3]]`, []string{"/1/0"}, []string{"2"}},
		{"top-level array element", `["x", {"y":1}]`, []string{"/1"}, []string{`{"y":1}`}},
		{"object through array", `{"a":[{"b":1},{"b":2}]}`, []string{"/a/1/b"}, []string{"2"}},
		{"index token on object key", `{"a":{"1":"one"}}`, []string{"/a/1"}, []string{`"one"`}},
		{"key token on array", `{"a":[1]}`, []string{"/a/b"}, []string{absent}},
		{"index 10", `[0,1,2,3,4,5,6,7,8,9,10,11]`, []string{"/10"}, []string{"10"}},
		{"empty array", `{"a":[]}`, []string{"/a/0"}, []string{absent}},

		// Keys with escapes and pointer escapes.
		{"escaped slash in key", `{"a\/b":1}`, []string{"/a~1b"}, []string{"1"}},
		{"raw slash in key", `{"a/b":1}`, []string{"/a~1b"}, []string{"1"}},
		{"slash in key is not nesting", `{"a":{"b":1}}`, []string{"/a~1b"}, []string{absent}},
		{"nesting is not slash in key", `{"a/b":1}`, []string{"/a/b"}, []string{absent}},
		{"unicode escape in key", `{"\u0061":1}`, []string{"/a"}, []string{"1"}},
		{"unicode escape upper hex", `{"\u00C9t\u00e9":1}`, []string{"/Été"}, []string{"1"}},
		{"raw non-ascii key", `{"été":1}`, []string{"/été"}, []string{"1"}},
		{"surrogate pair key", `{"\ud83d\ude00":1}`, []string{"/😀"}, []string{"1"}},
		{"escaped quote in key", `{"a\"b":1}`, []string{`/a"b`}, []string{"1"}},
		{"escaped backslash in key", `{"a\\b":1}`, []string{`/a\b`}, []string{"1"}},
		{"escaped newline in key", `{"a\nb":1}`, []string{"/a\nb"}, []string{"1"}},
		{"escape text is not the key", `{"a\\u0062":1}`, []string{"/ab"}, []string{absent}},
		{"escaped key is not its raw text", `{"\u0061":1}`, []string{`/\u0061`}, []string{absent}},
		{"tilde in key", `{"a~b":1}`, []string{"/a~0b"}, []string{"1"}},
		{"tilde one in key", `{"~1":1}`, []string{"/~01"}, []string{"1"}},
		{"tilde zero in key", `{"~0":1}`, []string{"/~00"}, []string{"1"}},
		{"tilde slash pair", `{"~/":1}`, []string{"/~0~1"}, []string{"1"}},
		{"slash tilde pair", `{"/~":1}`, []string{"/~1~0"}, []string{"1"}},
		{"decoded tilde one is slash", `{"~1":1}`, []string{"/~1"}, []string{absent}},
		{"escaped key nested", `{"\u0061":{"b\/c":[0,{"\u007e":"x"}]}}`, []string{"/a/b~1c/1/~0"}, []string{`"x"`}},

		// Pointers into scalars and other absent paths.
		{"into a number", `{"a":1}`, []string{"/a/b"}, []string{absent}},
		{"into a string", `{"a":"bcd"}`, []string{"/a/0"}, []string{absent}},
		{"into null", `{"a":null}`, []string{"/a/b"}, []string{absent}},
		{"into true", `{"a":true}`, []string{"/a/0"}, []string{absent}},
		{"top-level scalar", `"a"`, []string{"/a"}, []string{absent}},
		{"top-level number", `0`, []string{"/0"}, []string{absent}},
		{"top-level null", `null`, []string{"/a"}, []string{absent}},

		// Duplicate keys: the last one wins, as in jsonb.
		{"duplicate top-level", `{"a":1,"a":2}`, []string{"/a"}, []string{"2"}},
		{"duplicate with other keys between", `{"a":1,"b":0,"a":{"x":1}}`, []string{"/a"}, []string{`{"x":1}`}},
		{"duplicate three times", `{"a":1,"a":2,"a":3}`, []string{"/a"}, []string{"3"}},
		{"duplicate escaped later", `{"a":1,"\u0061":2}`, []string{"/a"}, []string{"2"}},
		{"duplicate escaped earlier", `{"\u0061":1,"a":2}`, []string{"/a"}, []string{"2"}},
		{"nested through duplicate, later lacks leaf", `{"a":{"b":1},"a":{"c":2}}`, []string{"/a/b"}, []string{absent}},
		{"nested through duplicate, later has leaf", `{"a":{"b":1},"a":{"b":2}}`, []string{"/a/b"}, []string{"2"}},
		{"nested through duplicate, later is scalar", `{"a":{"b":1},"a":3}`, []string{"/a/b"}, []string{absent}},
		{"nested through duplicate, earlier is scalar", `{"a":3,"a":{"b":1}}`, []string{"/a/b"}, []string{"1"}},
		{"nested through duplicate, later is empty", `{"a":{"b":1},"a":{}}`, []string{"/a/b"}, []string{absent}},
		{"nested through duplicate, later lacks index", `{"a":[1,2],"a":[3]}`, []string{"/a/1"}, []string{absent}},
		{"nested through duplicate two levels", `{"a":{"b":{"c":1}},"a":{"b":{"d":2}}}`, []string{"/a/b/c"}, []string{absent}},
		{"duplicate inside nested object", `{"a":{"b":1,"b":2}}`, []string{"/a/b"}, []string{"2"}},
		{"duplicate inside later duplicate", `{"a":{"b":1},"a":{"b":2,"b":3}}`, []string{"/a/b"}, []string{"3"}},
		{"duplicate of a sibling does not clear", `{"a":{"b":1},"c":{"b":2},"c":3}`, []string{"/a/b"}, []string{"1"}},
		{"duplicate in array element", `[{"a":1,"a":2}]`, []string{"/0/a"}, []string{"2"}},
		{"duplicate parent and whole value", `{"a":{"b":1},"a":{"c":2}}`, []string{"/a", "/a/b", "/a/c"}, []string{`{"c":2}`, absent, "2"}},

		// Several pointers in one pass.
		{"two pointers", `{"id":"x","ts":5}`, []string{"/id", "/ts"}, []string{`"x"`, "5"}},
		{"two pointers reversed", `{"ts":5,"id":"x"}`, []string{"/id", "/ts"}, []string{`"x"`, "5"}},
		{"one present one absent", `{"id":"x"}`, []string{"/id", "/ts"}, []string{`"x"`, absent}},
		{"same pointer twice", `{"a":1}`, []string{"/a", "/a"}, []string{"1", "1"}},
		{"prefix pointers", `{"a":{"b":2}}`, []string{"/a", "/a/b"}, []string{`{"b":2}`, "2"}},
		{"sibling pointers", `{"m":{"id":1,"ts":2}}`, []string{"/m/ts", "/m/id"}, []string{"2", "1"}},
		{"array and object pointers", `{"a":[{"b":1}],"c":2}`, []string{"/a/0/b", "/c", "/a/1"}, []string{"1", "2", absent}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := scan(t, tt.doc, tt.ptrs...)
			if err != nil {
				t.Fatalf("Scan(%.60q): %v", tt.doc, err)
			}
			for k, want := range tt.want {
				got := absent
				if out[k] != nil {
					got = string(out[k])
				}
				if got != want {
					t.Errorf("Scan(%.60q) pointer %q = %.60q, want %.60q", tt.doc, tt.ptrs[k], got, want)
				}
			}
		})
	}
}

// TestScanResetsOut checks that results from an earlier document do not
// survive into the next one.
func TestScanResetsOut(t *testing.T) {
	ptrs := mustPointers(t, "/a", "/b")
	out := make([][]byte, 2)
	if err := Scan([]byte(`{"a":1,"b":2}`), ptrs, out); err != nil {
		t.Fatal(err)
	}
	if string(out[0]) != "1" || string(out[1]) != "2" {
		t.Fatalf("first scan: got %q, %q", out[0], out[1])
	}
	if err := Scan([]byte(`{"c":3}`), ptrs, out); err != nil {
		t.Fatal(err)
	}
	if out[0] != nil || out[1] != nil {
		t.Errorf("second scan: got %q, %q, want nil, nil", out[0], out[1])
	}
}

func TestScanPointerCount(t *testing.T) {
	texts := make([]string, 65)
	doc := make([]string, 65)
	for i := range texts {
		texts[i] = "/k" + strconv.Itoa(i)
		doc[i] = `"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i)
	}
	body := []byte("{" + strings.Join(doc, ",") + "}")

	// 64 pointers: all extracted, the last one too.
	ptrs := mustPointers(t, texts[:64]...)
	out := make([][]byte, 64)
	if err := Scan(body, ptrs, out); err != nil {
		t.Fatalf("64 pointers: %v", err)
	}
	for i, v := range out {
		if string(v) != strconv.Itoa(i) {
			t.Errorf("64 pointers: %s = %q, want %d", texts[i], v, i)
		}
	}

	// 65 pointers: refused.
	ptrs = mustPointers(t, texts...)
	if err := Scan(body, ptrs, make([][]byte, 65)); err == nil {
		t.Errorf("65 pointers: got nil error")
	}
}

func TestParsePointer(t *testing.T) {
	tests := []struct {
		ptr    string
		tokens []string
		index  []int
		bad    bool
	}{
		{ptr: "/a", tokens: []string{"a"}, index: []int{-1}},
		{ptr: "/event_id", tokens: []string{"event_id"}, index: []int{-1}},
		{ptr: "/meta/ts", tokens: []string{"meta", "ts"}, index: []int{-1, -1}},
		{ptr: "/", tokens: []string{""}, index: []int{-1}},
		{ptr: "//", tokens: []string{"", ""}, index: []int{-1, -1}},
		{ptr: "/a/", tokens: []string{"a", ""}, index: []int{-1, -1}},
		{ptr: "/0", tokens: []string{"0"}, index: []int{0}},
		{ptr: "/a/0/b", tokens: []string{"a", "0", "b"}, index: []int{-1, 0, -1}},
		{ptr: "/10", tokens: []string{"10"}, index: []int{10}},
		{ptr: "/123456", tokens: []string{"123456"}, index: []int{123456}},
		{ptr: "/01", tokens: []string{"01"}, index: []int{-1}},
		{ptr: "/00", tokens: []string{"00"}, index: []int{-1}},
		{ptr: "/-", tokens: []string{"-"}, index: []int{-1}},
		{ptr: "/-1", tokens: []string{"-1"}, index: []int{-1}},
		{ptr: "/1a", tokens: []string{"1a"}, index: []int{-1}},
		{ptr: "/ 1", tokens: []string{" 1"}, index: []int{-1}},
		{ptr: "/1.0", tokens: []string{"1.0"}, index: []int{-1}},
		{ptr: "/+1", tokens: []string{"+1"}, index: []int{-1}},
		{ptr: "/-0", tokens: []string{"-0"}, index: []int{-1}},
		{ptr: "/99999999999999999999999", tokens: []string{"99999999999999999999999"}, index: []int{-1}},
		{ptr: "/~0", tokens: []string{"~"}, index: []int{-1}},
		{ptr: "/~1", tokens: []string{"/"}, index: []int{-1}},
		{ptr: "/a~1b", tokens: []string{"a/b"}, index: []int{-1}},
		{ptr: "/a~0b", tokens: []string{"a~b"}, index: []int{-1}},
		{ptr: "/~01", tokens: []string{"~1"}, index: []int{-1}},
		{ptr: "/~10", tokens: []string{"/0"}, index: []int{-1}},
		{ptr: "/~00", tokens: []string{"~0"}, index: []int{-1}},
		{ptr: "/~0~1~1~0", tokens: []string{"~//~"}, index: []int{-1}},
		{ptr: "/~1/~0", tokens: []string{"/", "~"}, index: []int{-1, -1}},
		{ptr: "/é/😀", tokens: []string{"é", "😀"}, index: []int{-1, -1}},
		{ptr: `/a\b`, tokens: []string{`a\b`}, index: []int{-1}},
		{ptr: "", bad: true},
		{ptr: "a", bad: true},
		{ptr: "a/b", bad: true},
		{ptr: "#/a", bad: true},
		{ptr: " /a", bad: true},
		{ptr: "/~", bad: true},
		{ptr: "/a~", bad: true},
		{ptr: "/~2", bad: true},
		{ptr: "/~a", bad: true},
		{ptr: "/~~0", bad: true},
		{ptr: "/ok/~/x", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.ptr, func(t *testing.T) {
			p, err := ParsePointer(tt.ptr)
			if tt.bad {
				if err == nil {
					t.Fatalf("ParsePointer(%q) = %+v, want an error", tt.ptr, p)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePointer(%q): %v", tt.ptr, err)
			}
			if p.String() != tt.ptr {
				t.Errorf("String() = %q, want %q", p.String(), tt.ptr)
			}
			if !equalSlices(p.tokens, tt.tokens) {
				t.Errorf("tokens = %q, want %q", p.tokens, tt.tokens)
			}
			if !equalSlices(p.index, tt.index) {
				t.Errorf("index = %v, want %v (RFC 6901 array indexes are 0 or [1-9][0-9]*)", p.index, tt.index)
			}
		})
	}
}

func equalSlices[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestUnquote(t *testing.T) {
	tests := []struct {
		raw  string
		want string
		bad  bool
	}{
		{raw: `"abc"`, want: "abc"},
		{raw: `""`, want: ""},
		{raw: `" spaced "`, want: " spaced "},
		{raw: `"é😀"`, want: "é😀"},
		{raw: `"a\nb"`, want: "a\nb"},
		{raw: `"\"\\\/\b\f\n\r\t"`, want: "\"\\/\b\f\n\r\t"},
		{raw: `"\u0041\u00e9\u20AC"`, want: "Aé€"},
		{raw: `"\ud83d\ude00"`, want: "😀"},
		{raw: `"a\/b"`, want: "a/b"},
		{raw: `"\\u0041"`, want: `\u0041`},
		{raw: `abc`, bad: true},
		{raw: ``, bad: true},
		{raw: `"`, bad: true},
		{raw: `1`, bad: true},
		{raw: `null`, bad: true},
		{raw: `{"a":1}`, bad: true},
		{raw: `"\x"`, bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got, err := Unquote([]byte(tt.raw))
			if tt.bad {
				if err == nil {
					t.Errorf("Unquote(%q) = %q, want an error", tt.raw, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Unquote(%q) = %q, %v, want %q", tt.raw, got, err, tt.want)
			}
		})
	}
}

// jsonbSafe reports whether a document that encoding/json accepts must
// also be accepted by Scan: valid UTF-8, no \u0000, no unpaired
// surrogate escape, nesting of at most maxDepth and numbers well inside
// what PostgreSQL's numeric holds (short, with small exponents). doc must
// already be valid JSON.
func jsonbSafe(doc []byte) bool {
	if !utf8.Valid(doc) {
		return false
	}
	depth := 0
	for i := 0; i < len(doc); {
		switch c := doc[i]; {
		case c == '[' || c == '{':
			depth++
			if depth > MaxDepth {
				return false
			}
			i++
		case c == ']' || c == '}':
			depth--
			i++
		case c == '"':
			end, ok := stringJSONBSafe(doc, i)
			if !ok {
				return false
			}
			i = end
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < len(doc) && strings.IndexByte("+-.eE0123456789", doc[j]) >= 0 {
				j++
			}
			if !numberJSONBSafe(string(doc[i:j])) {
				return false
			}
			i = j
		default:
			i++
		}
	}
	return true
}

// stringJSONBSafe checks the string starting at doc[i] and returns the
// index after its closing quote.
func stringJSONBSafe(doc []byte, i int) (int, bool) {
	i++
	for doc[i] != '"' {
		if doc[i] != '\\' {
			i++
			continue
		}
		if doc[i+1] != 'u' {
			i += 2
			continue
		}
		r, _ := strconv.ParseUint(string(doc[i+2:i+6]), 16, 16)
		i += 6
		switch {
		case r == 0:
			return i, false
		case r >= 0xDC00 && r <= 0xDFFF:
			return i, false
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 > len(doc) || doc[i] != '\\' || doc[i+1] != 'u' {
				return i, false
			}
			lo, _ := strconv.ParseUint(string(doc[i+2:i+6]), 16, 16)
			if lo < 0xDC00 || lo > 0xDFFF {
				return i, false
			}
			i += 6
		}
	}
	return i + 1, true
}

var numberExpRe = regexp.MustCompile(`[eE][+-]?0*([0-9]+)$`)

func numberJSONBSafe(num string) bool {
	if len(num) > 1000 {
		return false
	}
	if m := numberExpRe.FindStringSubmatch(num); m != nil {
		if len(m[1]) > 4 {
			return false
		}
		if n, _ := strconv.Atoi(m[1]); n > 1000 {
			return false
		}
	}
	return true
}

// lookupJSON resolves pointer tokens with encoding/json, one level at a
// time: objects through map[string]json.RawMessage (so the last duplicate
// key wins), arrays through []json.RawMessage with RFC 6901 indexes.
func lookupJSON(doc []byte, tokens []string) (json.RawMessage, bool) {
	cur := json.RawMessage(doc)
	for _, tok := range tokens {
		var obj map[string]json.RawMessage
		var arr []json.RawMessage
		switch t := bytes.TrimLeft(cur, " \t\r\n"); {
		case len(t) > 0 && t[0] == '{':
			if err := json.Unmarshal(cur, &obj); err != nil {
				return nil, false
			}
			v, ok := obj[tok]
			if !ok {
				return nil, false
			}
			cur = v
		case len(t) > 0 && t[0] == '[':
			if err := json.Unmarshal(cur, &arr); err != nil {
				return nil, false
			}
			if tok != "0" && (tok == "" || tok[0] < '1' || tok[0] > '9' || strings.Trim(tok, "0123456789") != "") {
				return nil, false
			}
			n, err := strconv.Atoi(tok)
			if err != nil || n >= len(arr) {
				return nil, false
			}
			cur = arr[n]
		default:
			return nil, false
		}
	}
	return cur, true
}

func escapeToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func compact(t *testing.T, raw []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("compact %q: %v", raw, err)
	}
	return b.String()
}

// FuzzScan checks the scanner that reads event ids and times out of
// Kafka message values: it accepts exactly the documents encoding/json
// accepts (and jsonb can store), refuses the others with ErrInvalid, and
// finds at a pointer what a full decode finds there.
func FuzzScan(f *testing.F) {
	seeds := []struct {
		doc        string
		key1, key2 string
	}{
		{`{"a":1}`, "a", "b"},
		{`{"event_id":"e-1","event_time":"2026-10-05T09:15:00Z"}`, "event_id", "x"},
		{`{"a":{"b":[1,2,{"c":null}]}}`, "a", "b"},
		{`{"a":1,"a":{"b":2}}`, "a", "b"},
		{`{"a":{"b":2},"a":{"c":3}}`, "a", "b"},
		{`{"a\/b":{"~":true}}`, "a/b", "~"},
		{`{"\u0061":[10,20]}`, "a", "1"},
		{`[["x","y"],{"0":1}]`, "0", "1"},
		{`[10,20,30]`, "2", "0"},
		{`{"":{"":""}}`, "", ""},
		{` { "a" : [ 1 , 2 ] } `, "a", "0"},
		{`"\ud83d\ude00"`, "a", "b"},
		{`{"😀":"é","\u00e9":"\u20ac"}`, "é", "x"},
		{`[1e5,-0.5E-3,0,-0,1e100000]`, "4", "0"},
		{`{"a":"\u0000"}`, "a", "b"},
		{`{"a":"\ud800"}`, "a", "b"},
		{`{"a":"\udc00\ud800"}`, "a", "b"},
		{"{\"a\":\"\xff\"}", "a", "b"},
		{`{"a":01}`, "a", "b"},
		{`{"a":1}x`, "a", "b"},
		{`{"a":[1,2,]}`, "a", "b"},
		{`{"a":tru}`, "a", "b"},
		{`[1e131072]`, "0", "b"},
		{nest(256, `{"a":1}`), "0", "0"},
		{nest(257, ""), "0", "0"},
		{"", "a", "b"},
	}
	for _, s := range seeds {
		f.Add([]byte(s.doc), s.key1, s.key2)
	}
	f.Fuzz(func(t *testing.T, doc []byte, key1, key2 string) {
		p1 := "/" + escapeToken(key1)
		p2 := p1 + "/" + escapeToken(key2)
		ptrs := mustPointers(t, p1, p2)
		out := make([][]byte, 2)
		err := Scan(doc, ptrs, out)
		valid := json.Valid(doc)

		if err == nil && !valid {
			t.Fatalf("Scan accepts %q but encoding/json does not", doc)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Scan(%q) = %v, want an ErrInvalid error", doc, err)
			}
			if valid && jsonbSafe(doc) {
				t.Fatalf("Scan rejects %q, valid JSON that jsonb accepts: %v", doc, err)
			}
			return
		}
		// Accepted documents obey the jsonb rules (numbers aside).
		if !utf8.Valid(doc) {
			t.Fatalf("Scan accepts invalid UTF-8 in %q", doc)
		}
		if !jsonbSafe(doc) && !hasBigNumber(doc) {
			t.Fatalf("Scan accepts %q, which jsonb would reject", doc)
		}

		for k, tokens := range [][]string{{key1}, {key1, key2}} {
			want, ok := lookupJSON(doc, tokens)
			switch {
			case !ok && out[k] != nil:
				t.Fatalf("Scan(%q) %s = %q, encoding/json finds nothing", doc, ptrs[k], out[k])
			case ok && out[k] == nil:
				t.Fatalf("Scan(%q) %s = nothing, encoding/json finds %q", doc, ptrs[k], want)
			case ok && compact(t, out[k]) != compact(t, want):
				t.Fatalf("Scan(%q) %s = %q, encoding/json finds %q", doc, ptrs[k], out[k], want)
			}
		}
	})
}

// hasBigNumber reports whether a valid document holds a number that
// numberJSONBSafe refuses; those are judged by the exponent rules the
// table tests check, not by the fuzz property.
func hasBigNumber(doc []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if n, ok := tok.(json.Number); ok && !numberJSONBSafe(string(n)) {
			return true
		}
	}
}

// TestSpecial8: the eight-byte test agrees with a byte-by-byte one for
// every byte value in every position, among plain bytes and among bytes
// that are themselves special.
func TestSpecial8(t *testing.T) {
	special := func(c byte) bool { return c < 0x20 || c == '"' || c == '\\' || c >= 0x80 }
	for _, fill := range []byte{'a', ' ', '~', 0x7f, 0x21, 0x5b, 0x5d} {
		for pos := range 8 {
			for c := range 256 {
				var w [8]byte
				for i := range w {
					w[i] = fill
				}
				w[pos] = byte(c)
				want := special(byte(c))
				if got := special8(binary.LittleEndian.Uint64(w[:])); got != want {
					t.Fatalf("special8(%q) = %v, want %v", w, got, want)
				}
			}
		}
	}
	// Two bytes at once, where borrows between neighbours could mislead.
	for a := range 256 {
		for c := range 256 {
			w := [8]byte{'x', byte(a), byte(c), 'x', 'x', 'x', 'x', 'x'}
			if got, want := special8(binary.LittleEndian.Uint64(w[:])), special(byte(a)) || special(byte(c)); got != want {
				t.Fatalf("special8(%q) = %v, want %v", w, got, want)
			}
		}
	}
}

// TestScanNested: a value nested depth levels deep may itself be nested
// MaxDepth-depth levels, and is checked as Scan checks it otherwise.
func TestScanNested(t *testing.T) {
	nest := func(n int) []byte { return []byte(strings.Repeat("[", n) + strings.Repeat("]", n)) }
	tests := []struct {
		name  string
		doc   []byte
		depth int
		ok    bool
	}{
		{"MaxDepth at depth 0", nest(MaxDepth), 0, true},
		{"MaxDepth at depth 1", nest(MaxDepth), 1, false},
		{"MaxDepth-1 at depth 1", nest(MaxDepth - 1), 1, true},
		{"a scalar at depth MaxDepth", []byte(`"x"`), MaxDepth, true},
		{"an object at depth MaxDepth", []byte(`{}`), MaxDepth, false},
		{"trailing data", []byte(`{} 1`), 1, false},
		{"an escaped NUL", []byte(`{"a": "\u0000"}`), 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := ScanNested(tt.doc, tt.depth); (err == nil) != tt.ok {
				t.Errorf("ScanNested = %v, want ok %v", err, tt.ok)
			}
		})
	}
}
