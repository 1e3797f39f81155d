package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// The documents of a change event are split here without encoding/json,
// which costs most of a change's decoding. They are JSON already checked:
// the JSON converter's documents by pgjson.Scan before they are read, and
// the documents of a registry format by construction. The splitting still
// checks what it walks through and never reads past a document's end, so
// a document that was not checked is an error, not a crash, though one
// not valid JSON may be split where encoding/json would refuse it.

// errJSONEnd is the error of a document that ends inside a value.
var errJSONEnd = errors.New("unexpected end of JSON input")

// skipSpace returns the index of the first byte at or after i of b that
// is not JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string that begins at
// b[i] (a quote), and whether it holds escapes.
func stringEnd(b []byte, i int) (int, bool, error) {
	escaped := false
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped, nil
		}
	}
	return 0, false, errJSONEnd
}

// valueEnd returns the index just past the JSON value that begins at
// b[i].
func valueEnd(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errJSONEnd
	}
	switch b[i] {
	case '"':
		end, _, err := stringEnd(b, i)
		return end, err
	case '{', '[':
		return containerEnd(b, i)
	}
	j := i
	for j < len(b) && !isDelimiter(b[j]) {
		j++
	}
	if j == i {
		return 0, fmt.Errorf("a value expected at %q", truncate(b[i:], 20))
	}
	return j, nil
}

// isDelimiter reports whether c ends a number or a literal.
func isDelimiter(c byte) bool {
	switch c {
	case ',', '}', ']', ':', ' ', '\t', '\n', '\r', '"', '{', '[':
		return true
	}
	return false
}

// containerEnd returns the index just past the object or array that
// begins at b[i], whose brackets must match.
func containerEnd(b []byte, i int) (int, error) {
	var stack [32]byte
	open := stack[:0]
	for j := i; j < len(b); j++ {
		switch c := b[j]; c {
		case '"':
			end, _, err := stringEnd(b, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case '{', '[':
			if len(open) >= maxDepth {
				return 0, errDepth()
			}
			open = append(open, c+2) // '{'+2 is '}', '['+2 is ']'
		case '}', ']':
			if len(open) == 0 || open[len(open)-1] != c {
				return 0, fmt.Errorf("mismatched %q", c)
			}
			if open = open[:len(open)-1]; len(open) == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, errJSONEnd
}

// fieldName is the text of the object member name raw (quoted).
func fieldName(raw []byte, escaped bool) (string, error) {
	if !escaped {
		return string(raw[1 : len(raw)-1]), nil
	}
	return pgjson.Unquote(raw)
}

// objectFields parses a JSON object into its members in document order; a
// name given twice keeps its last value, as jsonb does. The values are
// slices of raw, without the whitespace around them.
func objectFields(raw json.RawMessage) ([]field, error) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return nil, fmt.Errorf("an object expected, got %s", truncate(raw, 40))
	}
	out := make([]field, 0, 8)
	var at map[string]int // the index of each name, once there are many
	if i = skipSpace(raw, i+1); i < len(raw) && raw[i] == '}' {
		return out, nil
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return nil, fmt.Errorf("an object member's name expected in %s", truncate(raw, 40))
		}
		end, escaped, err := stringEnd(raw, i)
		if err != nil {
			return nil, err
		}
		name, err := fieldName(raw[i:end], escaped)
		if err != nil {
			return nil, err
		}
		if i = skipSpace(raw, end); i >= len(raw) || raw[i] != ':' {
			return nil, fmt.Errorf("a colon expected after the member name %q", name)
		}
		i = skipSpace(raw, i+1)
		if end, err = valueEnd(raw, i); err != nil {
			return nil, err
		}
		out, at = putField(out, at, field{name, raw[i:end]})
		switch i = skipSpace(raw, end); {
		case i < len(raw) && raw[i] == ',':
			i = skipSpace(raw, i+1)
		case i < len(raw) && raw[i] == '}':
			return out, nil
		default:
			return nil, fmt.Errorf("a comma or the object's end expected in %s", truncate(raw, 40))
		}
	}
}

// putField adds f to out, or sets the value of the member of its name;
// at indexes the names of out once there are more than a few.
func putField(out []field, at map[string]int, f field) ([]field, map[string]int) {
	const linear = 16
	if at == nil {
		for k := range out {
			if out[k].name == f.name {
				out[k].value = f.value
				return out, nil
			}
		}
		if len(out) < linear {
			return append(out, f), nil
		}
		at = make(map[string]int, 2*linear)
		for k := range out {
			at[out[k].name] = k
		}
	}
	if k, ok := at[f.name]; ok {
		out[k].value = f.value
		return out, at
	}
	at[f.name] = len(out)
	return append(out, f), at
}

// arrayItems parses a JSON array into its items, slices of raw.
func arrayItems(raw json.RawMessage) ([]json.RawMessage, error) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, fmt.Errorf("array expected, got %s", truncate(raw, 40))
	}
	var out []json.RawMessage
	if i = skipSpace(raw, i+1); i < len(raw) && raw[i] == ']' {
		return out, nil
	}
	for {
		end, err := valueEnd(raw, i)
		if err != nil {
			return nil, err
		}
		out = append(out, raw[i:end])
		switch i = skipSpace(raw, end); {
		case i < len(raw) && raw[i] == ',':
			i = skipSpace(raw, i+1)
		case i < len(raw) && raw[i] == ']':
			return out, nil
		default:
			return nil, fmt.Errorf("a comma or the array's end expected in %s", truncate(raw, 40))
		}
	}
}

// stringValue returns the text of raw, a JSON string, as json.Unmarshal
// into a string does: "" and no error for null, an error for any other
// value.
func stringValue(raw json.RawMessage) (string, error) {
	if s, ok := textOf(raw); ok {
		return s, nil
	}
	var s string
	if err := json.Unmarshal(bytes.Trim(raw, jsonSpace), &s); err != nil {
		return "", err
	}
	return s, nil
}

// textOf is stringValue without the error: false for what is neither a
// JSON string nor null.
func textOf(raw json.RawMessage) (string, bool) {
	raw = bytes.Trim(raw, jsonSpace)
	switch {
	case string(raw) == "null":
		return "", true
	case len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"':
		return "", false
	}
	inner := raw[1 : len(raw)-1]
	for i, c := range inner {
		if c == '\\' || c == '"' || c < 0x20 || c >= utf8.RuneSelf {
			if !utf8.Valid(inner[i:]) {
				return unquoteJSON(raw)
			}
			return unescape(inner, i)
		}
	}
	return string(inner), true
}

// unescape is the text of inner, the inside of a JSON string of valid
// UTF-8 whose first i bytes need no unescaping.
func unescape(inner []byte, i int) (string, bool) {
	out := make([]byte, i, len(inner))
	copy(out, inner[:i])
	for ; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '"' || c < 0x20:
			return "", false
		case c != '\\':
			out = append(out, c)
			continue
		}
		if i++; i >= len(inner) {
			return "", false
		}
		switch e := inner[i]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default: // \u escapes, or not JSON
			quoted := make([]byte, 0, len(inner)+2)
			return unquoteJSON(append(append(append(quoted, '"'), inner...), '"'))
		}
	}
	return string(out), true
}

// unquoteJSON unquotes a JSON string with encoding/json.
func unquoteJSON(raw []byte) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// isString reports whether raw is a JSON string whose text is s.
func isString(raw json.RawMessage, s string) bool {
	raw = bytes.Trim(raw, jsonSpace)
	if len(raw) < 2 || raw[0] != '"' {
		return false
	}
	if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 {
		return raw[len(raw)-1] == '"' && string(inner) == s
	}
	text, ok := textOf(raw)
	return ok && text == s
}

// appendJSONString appends s as json.Marshal writes it.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			m, _ := json.Marshal(s)
			return append(b, m...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
