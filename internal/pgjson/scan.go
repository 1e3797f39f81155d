package pgjson

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxDepth bounds the object and array nesting that Scan takes.
const MaxDepth = 256

// Pointer is a compiled JSON pointer (RFC 6901).
type Pointer struct {
	text   string
	tokens []string
	index  []int // array index for each token, or -1
}

// ParsePointer compiles a JSON pointer such as /event_id or /meta/ts.
func ParsePointer(p string) (Pointer, error) {
	if !strings.HasPrefix(p, "/") {
		return Pointer{}, fmt.Errorf("JSON pointer %q must start with /", p)
	}
	parts := strings.Split(p[1:], "/")
	ptr := Pointer{text: p, tokens: make([]string, len(parts)), index: make([]int, len(parts))}
	for i, raw := range parts {
		for j := 0; j < len(raw); j++ {
			if raw[j] == '~' && (j+1 >= len(raw) || (raw[j+1] != '0' && raw[j+1] != '1')) {
				return Pointer{}, fmt.Errorf("JSON pointer %q: ~ must be followed by 0 or 1", p)
			}
		}
		tok := strings.ReplaceAll(strings.ReplaceAll(raw, "~1", "/"), "~0", "~")
		ptr.tokens[i] = tok
		ptr.index[i] = -1
		if isArrayIndex(tok) {
			if n, err := strconv.Atoi(tok); err == nil {
				ptr.index[i] = n
			}
		}
	}
	return ptr, nil
}

// isArrayIndex reports whether tok is an RFC 6901 array index: "0" or a
// decimal number without leading zeros or sign.
func isArrayIndex(tok string) bool {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return false
		}
	}
	return true
}

// String returns the pointer text.
func (p Pointer) String() string { return p.text }

// ErrInvalid marks a document that is not valid JSON or that jsonb would
// reject.
var ErrInvalid = errors.New("invalid JSON")

// Scan checks that doc is one JSON value that PostgreSQL's jsonb
// accepts (valid UTF-8, no \u0000, paired surrogates, bounded nesting and
// exponents) and stores in out[k] the raw bytes of the value that ptrs[k]
// names, or nil when the document has no such value. Like jsonb, it lets
// the last of duplicate object keys win. One pass, no allocation on the
// common path.
func Scan(doc []byte, ptrs []Pointer, out [][]byte) error {
	if len(ptrs) > 64 {
		return errors.New("pgjson.Scan: too many pointers")
	}
	for k := range out {
		out[k] = nil
	}
	s := scanner{b: doc, ptrs: ptrs, out: out, maxDepth: MaxDepth}
	var alive uint64
	for k := range ptrs {
		alive |= 1 << k
	}
	return s.document(alive)
}

// ScanNested is Scan without pointers of doc as a value nested depth
// levels deep in a document: its own nesting is bounded by MaxDepth less
// depth. A document made of values that pass it at their depths and of
// valid JSON around them passes Scan.
func ScanNested(doc []byte, depth int) error {
	s := scanner{b: doc, maxDepth: MaxDepth, depth: depth}
	return s.document(0)
}

// document scans the whole of s.b as one JSON value.
func (s *scanner) document(alive uint64) error {
	if err := s.value(0, alive); err != nil {
		return err
	}
	s.ws()
	if s.i != len(s.b) {
		return s.fail("unexpected data after the JSON value")
	}
	return nil
}

type scanner struct {
	b     []byte
	i     int
	depth int
	// maxDepth bounds the nesting; below zero it is not bounded.
	maxDepth int
	ptrs     []Pointer
	out      [][]byte
}

func (s *scanner) fail(format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", ErrInvalid, s.i, fmt.Sprintf(format, args...))
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value parses one value at pointer depth level; alive has a bit for each
// pointer whose first level tokens match the path to this value.
func (s *scanner) value(level int, alive uint64) error {
	s.ws()
	if s.i >= len(s.b) {
		return s.fail("unexpected end of input")
	}
	start := s.i
	var err error
	switch c := s.b[s.i]; {
	case c == '{':
		err = s.object(level, alive)
	case c == '[':
		err = s.array(level, alive)
	case c == '"':
		_, err = s.str()
	case c == 't':
		err = s.literal("true")
	case c == 'f':
		err = s.literal("false")
	case c == 'n':
		err = s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		err = s.number()
	default:
		return s.fail("unexpected character %q", c)
	}
	if err != nil {
		return err
	}
	for k := 0; alive != 0; k++ {
		if alive&(1<<k) != 0 {
			alive &^= 1 << k
			if len(s.ptrs[k].tokens) == level {
				s.out[k] = s.b[start:s.i]
			}
		}
	}
	return nil
}

func (s *scanner) enter() error {
	s.depth++
	if s.maxDepth >= 0 && s.depth > s.maxDepth {
		return s.fail("nesting deeper than %d", s.maxDepth)
	}
	s.i++
	return nil
}

func (s *scanner) object(level int, alive uint64) error {
	if err := s.enter(); err != nil {
		return err
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return nil
	}
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return s.fail("expected an object key")
		}
		keyStart := s.i + 1
		escaped, err := s.str()
		if err != nil {
			return err
		}
		key := s.b[keyStart : s.i-1]
		var child uint64
		for k := range s.ptrs {
			if alive&(1<<k) == 0 || len(s.ptrs[k].tokens) <= level {
				continue
			}
			if keyEquals(key, escaped, s.ptrs[k].tokens[level]) {
				child |= 1 << k
				s.out[k] = nil // a later duplicate key replaces an earlier one
			}
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return s.fail("expected ':' after an object key")
		}
		s.i++
		if err := s.value(level+1, child); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return s.fail("unexpected end of input in an object")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return nil
		default:
			return s.fail("expected ',' or '}' in an object")
		}
	}
}

func (s *scanner) array(level int, alive uint64) error {
	if err := s.enter(); err != nil {
		return err
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		s.depth--
		return nil
	}
	for idx := 0; ; idx++ {
		var child uint64
		for k := range s.ptrs {
			if alive&(1<<k) != 0 && len(s.ptrs[k].tokens) > level && s.ptrs[k].index[level] == idx {
				child |= 1 << k
			}
		}
		if err := s.value(level+1, child); err != nil {
			return err
		}
		s.ws()
		if s.i >= len(s.b) {
			return s.fail("unexpected end of input in an array")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			s.depth--
			return nil
		default:
			return s.fail("expected ',' or ']' in an array")
		}
	}
}

func (s *scanner) literal(word string) error {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		return s.fail("invalid literal")
	}
	s.i += len(word)
	return nil
}

// str parses a string starting at the opening quote and reports whether it
// contained escapes.
func (s *scanner) str() (escaped bool, err error) {
	s.i++ // opening quote
	for s.i < len(s.b) {
		// Eight plain bytes at a time: most of a document is in strings.
		for s.i+8 <= len(s.b) && !special8(binary.LittleEndian.Uint64(s.b[s.i:])) {
			s.i += 8
		}
		if s.i >= len(s.b) {
			break
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return escaped, nil
		case c == '\\':
			escaped = true
			if err := s.escape(); err != nil {
				return escaped, err
			}
		case c < 0x20:
			return escaped, s.fail("control character in a string")
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, size := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && size <= 1 {
				return escaped, s.fail("invalid UTF-8")
			}
			s.i += size
		}
	}
	return escaped, s.fail("unterminated string")
}

// special8 reports whether any of the eight bytes in v needs a look of
// its own inside a string: a control character, a quote, a backslash or
// a byte of a multi-byte UTF-8 sequence. (x - 0x01…*n) &^ x has a byte's
// high bit set for some byte exactly when x has a byte below n (n <= 128),
// and a byte equal to c is a zero byte of x ^ 0x01…*c.
func special8(v uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	quote, backslash := v^(ones*'"'), v^(ones*'\\')
	return (v|(v-ones*0x20)&^v|(quote-ones)&^quote|(backslash-ones)&^backslash)&highs != 0
}

func (s *scanner) escape() error {
	if s.i+1 >= len(s.b) {
		return s.fail("unterminated escape")
	}
	switch s.b[s.i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.i += 2
		return nil
	case 'u':
	default:
		return s.fail("invalid escape")
	}
	r, ok := hex4(s.b[s.i+2:])
	if !ok {
		return s.fail("invalid \\u escape")
	}
	switch {
	case r == 0:
		return s.fail("\\u0000 is not allowed (PostgreSQL jsonb rejects it)")
	case r >= 0xDC00 && r <= 0xDFFF:
		return s.fail("unpaired low surrogate")
	case r >= 0xD800 && r <= 0xDBFF:
		rest := s.b[s.i+6:]
		if len(rest) < 6 || rest[0] != '\\' || rest[1] != 'u' {
			return s.fail("unpaired high surrogate")
		}
		lo, ok := hex4(rest[2:])
		if !ok || lo < 0xDC00 || lo > 0xDFFF {
			return s.fail("unpaired high surrogate")
		}
		s.i += 12
		return nil
	}
	s.i += 6
	return nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// number parses a JSON number and checks that PostgreSQL's numeric type
// can hold it: numeric_in scales the digits by the exponent and fails with
// "value overflows numeric format" when the weight of the first
// significant digit or the number of digits after the point is too large.
func (s *scanner) number() error {
	if s.b[s.i] == '-' {
		s.i++
	}
	intStart := s.i
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case s.i < len(s.b) && s.b[s.i] >= '1' && s.b[s.i] <= '9':
		s.digits()
	default:
		return s.fail("invalid number")
	}
	intPart := s.b[intStart:s.i]
	var fracPart []byte
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		start := s.i
		if s.digits() == 0 {
			return s.fail("invalid number: digits must follow '.'")
		}
		fracPart = s.b[start:s.i]
	}
	exp := 0
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		neg := false
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			neg = s.b[s.i] == '-'
			s.i++
		}
		start := s.i
		if s.digits() == 0 {
			return s.fail("invalid number: digits must follow the exponent")
		}
		for start < s.i-1 && s.b[start] == '0' {
			start++
		}
		if s.i-start > 10 {
			return s.fail("number out of range for PostgreSQL")
		}
		e := 0
		for _, c := range s.b[start:s.i] {
			e = e*10 + int(c-'0')
		}
		if e >= maxExponent {
			return s.fail("number out of range for PostgreSQL")
		}
		exp = e
		if neg {
			exp = -e
		}
	}
	if len(fracPart)-exp > maxDscale {
		return s.fail("number has more digits after the point than PostgreSQL can store")
	}
	// The decimal exponent of the first digit that is not zero gives the
	// weight, in base-10000 digits; zero has weight 0 whatever its
	// exponent.
	pos, zero := 0, true
	if intPart[0] != '0' {
		pos, zero = len(intPart)-1, false
	} else {
		for i, c := range fracPart {
			if c != '0' {
				pos, zero = -(i + 1), false
				break
			}
		}
	}
	if zero {
		return nil
	}
	pos += exp
	weight := pos / 4
	if pos < 0 && pos%4 != 0 {
		weight--
	}
	if weight > maxWeight || weight < minWeight {
		return s.fail("number too large for PostgreSQL")
	}
	return nil
}

func (s *scanner) digits() int {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i - start
}

func keyEquals(raw []byte, escaped bool, token string) bool {
	if !escaped {
		return string(raw) == token
	}
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	var k string
	if err := json.Unmarshal(quoted, &k); err != nil {
		return false
	}
	return k == token
}

// Unquote returns the text of a raw JSON string token, such as a value
// Scan found.
func Unquote(raw []byte) (string, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", errors.New("not a string")
	}
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", err
	}
	return v, nil
}
