package decode

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// avroKind is what an avroNode decodes.
type avroKind uint8

const (
	avroNull avroKind = iota
	avroBoolean
	avroInt
	avroLong
	avroFloat
	avroDouble
	avroBytes
	avroString
	avroRecord
	avroEnum
	avroArray
	avroMap
	avroUnion
	avroFixed
	avroDate
	avroTimeMillis
	avroTimeMicros
	avroTimestampMillis
	avroTimestampMicros
	avroDecimalBytes
	avroDecimalFixed
	avroDuration
)

// avroNode is one type of a compiled Avro schema, ready to turn binary
// values into JSON.
type avroNode struct {
	kind     avroKind
	branch   string      // its name as a branch of a union ("long", "com.example.Order")
	fields   []avroField // record
	symbols  []string    // enum, as quoted JSON strings
	items    *avroNode   // array items, map values
	branches []*avroNode // union
	nullable int         // union of null and one other type: the index of null; -1 otherwise
	size     int         // fixed
	scale    int         // decimal
	// minSize is the fewest bytes a value takes: 0 for null, a record
	// of such fields or an empty fixed, whose items an array may hold
	// any number of in no bytes.
	minSize int
}

type avroField struct {
	key  string // the quoted name and a colon, with a leading comma after the first
	name string
	node *avroNode
}

// avroCodec decodes the Avro binary encoding of one schema (the writer's
// schema: the one the record's id names) into JSON. connect is the
// Connect schema its annotations describe, for Debezium change events.
type avroCodec struct {
	root    *avroNode
	connect *connectSchema
}

// compileAvro parses an Avro schema, given the schemas it references
// (named types, dependencies first), into its codec.
func compileAvro(schema string, refs []schemaRef) (codec, error) {
	cache := &avro.SchemaCache{}
	for _, r := range refs {
		if _, err := avro.ParseWithCache(r.Schema, "", cache); err != nil {
			return nil, fmt.Errorf("referenced schema %s: %w", r.Name, err)
		}
	}
	s, err := avro.ParseWithCache(schema, "", cache)
	if err != nil {
		return nil, err
	}
	b := avroBuilder{named: map[string]*avroNode{}}
	root, err := b.node(s)
	if err != nil {
		return nil, err
	}
	minSize(root, map[*avroNode]bool{})
	return &avroCodec{root: root, connect: connectOfAvro(s).prepare()}, nil
}

// minSize sets n.minSize and those of the types it holds, once each:
// done says whether a node's is set (false while it is under way: a
// record that holds itself does so through a union or an array, which
// take a byte).
func minSize(n *avroNode, done map[*avroNode]bool) int {
	if set, seen := done[n]; seen {
		if !set {
			return 1
		}
		return n.minSize
	}
	done[n] = false
	defer func() { done[n] = true }()
	switch n.kind {
	case avroNull:
		n.minSize = 0
	case avroRecord:
		size := 0
		for _, f := range n.fields {
			size += minSize(f.node, done)
		}
		n.minSize = size
	case avroFixed, avroDecimalFixed, avroDuration:
		n.minSize = n.size
	case avroArray, avroMap:
		minSize(n.items, done)
		n.minSize = 1
	case avroUnion:
		for _, b := range n.branches {
			minSize(b, done)
		}
		n.minSize = 1
	default:
		n.minSize = 1
	}
	return n.minSize
}

type avroBuilder struct{ named map[string]*avroNode }

func (b *avroBuilder) node(s avro.Schema) (*avroNode, error) {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		if done := b.named[n.FullName()]; done != nil {
			return done, nil // recursive types share their node
		}
	}
	n := &avroNode{branch: string(s.Type()), nullable: -1}
	switch s := s.(type) {
	case *avro.NullSchema:
		n.kind = avroNull
	case *avro.PrimitiveSchema:
		n.kind = primitiveKind(s)
		if d, ok := s.Logical().(*avro.DecimalLogicalSchema); ok && s.Type() == avro.Bytes {
			if err := checkScale(d); err != nil {
				return nil, err
			}
			n.kind, n.scale = avroDecimalBytes, d.Scale()
		}
	case *avro.RecordSchema:
		n.kind, n.branch = avroRecord, s.FullName()
		b.named[s.FullName()] = n
		for i, f := range s.Fields() {
			fn, err := b.node(f.Type())
			if err != nil {
				return nil, err
			}
			key := string(pgjson.AppendString(nil, f.Name())) + ":"
			if i > 0 {
				key = "," + key
			}
			n.fields = append(n.fields, avroField{key: key, name: f.Name(), node: fn})
		}
	case *avro.EnumSchema:
		n.kind, n.branch = avroEnum, s.FullName()
		for _, sym := range s.Symbols() {
			n.symbols = append(n.symbols, string(pgjson.AppendString(nil, sym)))
		}
	case *avro.ArraySchema:
		items, err := b.node(s.Items())
		if err != nil {
			return nil, err
		}
		n.kind, n.items = avroArray, items
	case *avro.MapSchema:
		values, err := b.node(s.Values())
		if err != nil {
			return nil, err
		}
		n.kind, n.items = avroMap, values
	case *avro.UnionSchema:
		n.kind = avroUnion
		for _, t := range s.Types() {
			bn, err := b.node(t)
			if err != nil {
				return nil, err
			}
			n.branches = append(n.branches, bn)
		}
		if len(n.branches) == 2 && s.Nullable() {
			n.nullable, _ = s.Indices()
		}
	case *avro.FixedSchema:
		n.kind, n.branch, n.size = avroFixed, s.FullName(), s.Size()
		switch l := s.Logical().(type) {
		case *avro.DecimalLogicalSchema:
			if err := checkScale(l); err != nil {
				return nil, err
			}
			n.kind, n.scale = avroDecimalFixed, l.Scale()
		case avro.LogicalSchema:
			if l.Type() == avro.Duration {
				n.kind = avroDuration
			}
		}
	default:
		return nil, fmt.Errorf("unsupported Avro type %s", s.Type())
	}
	return n, nil
}

// checkScale refuses a decimal whose values no jsonb number can hold:
// one of more digits after the point than PostgreSQL's numeric has.
func checkScale(d *avro.DecimalLogicalSchema) error {
	if d.Scale() > maxNumericScale {
		return fmt.Errorf("decimal scale %d: PostgreSQL's numeric, which a jsonb number is, holds at most %d digits after the point",
			d.Scale(), maxNumericScale)
	}
	return nil
}

func primitiveKind(s *avro.PrimitiveSchema) avroKind {
	if l := s.Logical(); l != nil {
		switch l.Type() {
		case avro.Date:
			return avroDate
		case avro.TimeMillis:
			return avroTimeMillis
		case avro.TimeMicros:
			return avroTimeMicros
		case avro.TimestampMillis, avro.LocalTimestampMillis:
			return avroTimestampMillis
		case avro.TimestampMicros, avro.LocalTimestampMicros:
			return avroTimestampMicros
		}
	}
	switch s.Type() {
	case avro.Boolean:
		return avroBoolean
	case avro.Int:
		return avroInt
	case avro.Long:
		return avroLong
	case avro.Float:
		return avroFloat
	case avro.Double:
		return avroDouble
	case avro.Bytes:
		return avroBytes
	}
	return avroString // uuid is a string too
}

// avroError is where and why bytes do not match their schema, or (limit)
// why decoding them would cost more than the record's budget.
type avroError struct {
	path  []string // innermost last
	msg   string
	limit bool
}

func (e *avroError) Error() string {
	if len(e.path) == 0 {
		return e.msg
	}
	return "at /" + strings.Join(e.path, "/") + ": " + e.msg
}

// Unwrap makes an error over the budget errLimit.
func (e *avroError) Unwrap() error {
	if e.limit {
		return errLimit
	}
	return nil
}

// avroLimit is err, an error of the budget, as an avroError that takes
// the path it happened at.
func avroLimit(err error) error {
	return &avroError{msg: err.Error(), limit: true}
}

// in adds an outer step to err's path.
func in(err error, step string) error {
	var ae *avroError
	if errors.As(err, &ae) {
		ae.path = append([]string{step}, ae.path...)
	}
	return err
}

func mismatch(format string, args ...any) error {
	return &avroError{msg: fmt.Sprintf(format, args...)}
}

const errTruncated = "truncated: the value ends early"

func (c *avroCodec) toJSON(payload []byte, b *budget) ([]byte, error) {
	r := avroReader{b: payload, bud: b}
	out, err := r.value(make([]byte, 0, min(len(payload)*2+16, b.limit)), c.root, 0)
	if err != nil {
		return nil, err
	}
	if r.i != len(r.b) {
		return nil, mismatch("%d bytes after the value", len(r.b)-r.i)
	}
	if err := b.spend(len(out)); err != nil {
		return nil, avroLimit(err)
	}
	return out, nil
}

// avroReader decodes one value. The JSON it writes nests at most
// maxDepth levels, which bounds its recursion too: a union, the one type
// that may add a level of recursion without one of JSON, holds no union.
type avroReader struct {
	b   []byte
	i   int
	bud *budget
}

// openLevel checks that a JSON object or array may open inside depth
// others.
func openLevel(depth int) error {
	if depth >= maxDepth {
		return avroLimit(errDepth())
	}
	return nil
}

func (r *avroReader) long() (int64, error) {
	var u uint64
	for shift := uint(0); shift < 70; shift += 7 {
		if r.i >= len(r.b) {
			return 0, mismatch(errTruncated)
		}
		c := r.b[r.i]
		r.i++
		u |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return int64(u>>1) ^ -int64(u&1), nil
		}
	}
	return 0, mismatch("a variable-length integer is longer than 10 bytes")
}

func (r *avroReader) int() (int32, error) {
	v, err := r.long()
	if err == nil && (v < math.MinInt32 || v > math.MaxInt32) {
		err = mismatch("int %d out of range", v)
	}
	return int32(v), err
}

func (r *avroReader) take(n int64) ([]byte, error) {
	if n < 0 {
		return nil, mismatch("negative length %d", n)
	}
	if n > int64(len(r.b)-r.i) {
		return nil, mismatch(errTruncated)
	}
	b := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	return b, nil
}

func (r *avroReader) lengthPrefixed() ([]byte, error) {
	n, err := r.long()
	if err != nil {
		return nil, err
	}
	return r.take(n)
}

// value appends the JSON of one value of n to out, inside depth JSON
// objects and arrays.
func (r *avroReader) value(out []byte, n *avroNode, depth int) ([]byte, error) {
	// Each value writes at most a few times the bytes it takes (a
	// string, a decimal checks its own), so checking before each keeps
	// the JSON near its budget.
	if !r.bud.fits(len(out), 0) {
		return nil, avroLimit(r.bud.overBytes())
	}
	out = r.bud.grow(out, 64)
	switch n.kind {
	case avroNull:
		return append(out, "null"...), nil
	case avroBoolean:
		b, err := r.take(1)
		switch {
		case err != nil:
			return nil, err
		case b[0] > 1:
			return nil, mismatch("boolean byte %d", b[0])
		}
		return strconv.AppendBool(out, b[0] == 1), nil
	case avroInt, avroLong:
		v, err := r.long()
		if err == nil && n.kind == avroInt && (v < math.MinInt32 || v > math.MaxInt32) {
			err = mismatch("int %d out of range", v)
		}
		return strconv.AppendInt(out, v, 10), err
	case avroFloat:
		b, err := r.take(4)
		if err != nil {
			return nil, err
		}
		return appendFloat(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(b))), 32), nil
	case avroDouble:
		b, err := r.take(8)
		if err != nil {
			return nil, err
		}
		return appendFloat(out, math.Float64frombits(binary.LittleEndian.Uint64(b)), 64), nil
	case avroBytes, avroFixed:
		b, err := r.bytesOf(n)
		if err != nil {
			return nil, err
		}
		out = append(out, '"')
		return append(base64.StdEncoding.AppendEncode(out, b), '"'), nil
	case avroString:
		b, err := r.lengthPrefixed()
		if err != nil {
			return nil, err
		}
		return appendUTF8(out, b)
	case avroRecord:
		return r.record(out, n, depth)
	case avroEnum:
		i, err := r.int()
		if err != nil {
			return nil, err
		}
		if i < 0 || int(i) >= len(n.symbols) {
			return nil, mismatch("enum index %d of %d symbols", i, len(n.symbols))
		}
		return append(out, n.symbols[i]...), nil
	case avroArray, avroMap:
		return r.blocks(out, n, depth)
	case avroUnion:
		return r.union(out, n, depth)
	}
	return r.logical(out, n, depth)
}

func (r *avroReader) bytesOf(n *avroNode) ([]byte, error) {
	if n.kind == avroFixed || n.kind == avroDecimalFixed || n.kind == avroDuration {
		return r.take(int64(n.size))
	}
	return r.lengthPrefixed()
}

func (r *avroReader) record(out []byte, n *avroNode, depth int) ([]byte, error) {
	if err := openLevel(depth); err != nil {
		return nil, err
	}
	out = append(out, '{')
	for _, f := range n.fields {
		out = append(out, f.key...)
		var err error
		if out, err = r.value(out, f.node, depth+1); err != nil {
			return nil, in(err, f.name)
		}
	}
	return append(out, '}'), nil
}

func (r *avroReader) union(out []byte, n *avroNode, depth int) ([]byte, error) {
	i, err := r.long()
	if err != nil {
		return nil, err
	}
	if i < 0 || i >= int64(len(n.branches)) {
		return nil, mismatch("union branch %d of %d", i, len(n.branches))
	}
	b := n.branches[i]
	if n.nullable >= 0 || b.kind == avroNull {
		return r.value(out, b, depth)
	}
	if err := openLevel(depth); err != nil {
		return nil, err
	}
	out = append(out, '{')
	out = pgjson.AppendString(out, b.branch)
	out = append(out, ':')
	if out, err = r.value(out, b, depth+1); err != nil {
		return nil, err
	}
	return append(out, '}'), nil
}

// blocks decodes an array or a map: blocks of items, each a count (when
// negative, its absolute value, followed by the block's size in bytes),
// ending with a count of 0.
func (r *avroReader) blocks(out []byte, n *avroNode, depth int) ([]byte, error) {
	if err := openLevel(depth); err != nil {
		return nil, err
	}
	start, end := byte('['), byte(']')
	if n.kind == avroMap {
		start, end = '{', '}'
	}
	out = append(out, start)
	first := true
	for idx := 0; ; {
		count, err := r.long()
		if err != nil {
			return nil, err
		}
		if count == 0 {
			return append(out, end), nil
		}
		if count < 0 {
			if count == math.MinInt64 {
				return nil, mismatch("block count out of range")
			}
			count = -count
			if _, err := r.long(); err != nil {
				return nil, err
			}
		}
		// A count that the remaining bytes cannot hold is a corrupt
		// value. Items of no bytes (nulls, records of nulls) can be any
		// number: the budget bounds those, as it does all.
		size := int64(n.items.minSize)
		if n.kind == avroMap {
			size++ // the key's length
		}
		if size > 0 && count > int64(len(r.b)-r.i)/size {
			return nil, mismatch("a block of %d items in %d bytes", count, len(r.b)-r.i)
		}
		if err := r.bud.takeItems(count); err != nil {
			return nil, avroLimit(err)
		}
		for range count {
			if !first {
				out = append(out, ',')
			}
			first = false
			var key []byte // a map's key, the path step of its value
			if n.kind == avroMap {
				if key, err = r.lengthPrefixed(); err == nil {
					out, err = appendUTF8(out, key)
				}
				if err != nil {
					return nil, in(err, strconv.Itoa(idx))
				}
				out = append(out, ':')
			}
			if out, err = r.value(out, n.items, depth+1); err != nil {
				if key != nil {
					return nil, in(err, string(key))
				}
				return nil, in(err, strconv.Itoa(idx))
			}
			idx++
		}
	}
}

// logical decodes the logical types.
func (r *avroReader) logical(out []byte, n *avroNode, depth int) ([]byte, error) {
	switch n.kind {
	case avroDecimalBytes, avroDecimalFixed:
		b, err := r.bytesOf(n)
		if err != nil {
			return nil, err
		}
		b = trimSignExtension(b)
		if len(b) > maxDecimalBytes {
			return nil, mismatch("a decimal of %d bytes has more digits than PostgreSQL's numeric holds", len(b))
		}
		// 2.41 digits a byte, the point, a sign, the zeros before a
		// small value's digits.
		if !r.bud.fits(len(out), max(len(b)*241/100+1, n.scale+1)+2) {
			return nil, avroLimit(r.bud.overBytes())
		}
		return appendDecimal(out, b, n.scale), nil
	case avroDuration:
		if err := openLevel(depth); err != nil {
			return nil, err
		}
		b, err := r.take(12)
		if err != nil {
			return nil, err
		}
		out = append(out, `{"months":`...)
		out = strconv.AppendUint(out, uint64(binary.LittleEndian.Uint32(b)), 10)
		out = append(out, `,"days":`...)
		out = strconv.AppendUint(out, uint64(binary.LittleEndian.Uint32(b[4:])), 10)
		out = append(out, `,"milliseconds":`...)
		out = strconv.AppendUint(out, uint64(binary.LittleEndian.Uint32(b[8:])), 10)
		return append(out, '}'), nil
	}
	v, err := r.long()
	if err != nil {
		return nil, err
	}
	var t time.Time
	layout := time.RFC3339Nano
	switch n.kind {
	case avroDate:
		if v < math.MinInt32 || v > math.MaxInt32 {
			return nil, mismatch("date %d out of range", v)
		}
		t, layout = time.Unix(v*86400, 0), time.DateOnly
	case avroTimeMillis, avroTimeMicros:
		unit := int64(time.Millisecond)
		if n.kind == avroTimeMicros {
			unit = int64(time.Microsecond)
		}
		if v < 0 || v >= int64(24*time.Hour)/unit {
			return nil, mismatch("time of day %d out of range", v)
		}
		t, layout = time.Unix(0, v*unit), "15:04:05.999999"
	case avroTimestampMillis:
		t = time.UnixMilli(v)
	case avroTimestampMicros:
		t = time.UnixMicro(v)
	}
	out = append(out, '"')
	out = t.UTC().AppendFormat(out, layout)
	return append(out, '"'), nil
}

// trimSignExtension drops the leading bytes of a two's-complement
// big-endian number that only extend its sign.
func trimSignExtension(b []byte) []byte {
	for len(b) > 1 && (b[0] == 0 && b[1]&0x80 == 0 || b[0] == 0xff && b[1]&0x80 != 0) {
		b = b[1:]
	}
	return b
}

// appendDecimal appends the two's-complement big-endian unscaled value b
// with scale fractional digits, as a JSON number.
func appendDecimal(out, b []byte, scale int) []byte {
	var digits string
	if len(b) <= 8 {
		// The common case, without big.Int: sign-extend into an int64.
		var v int64
		if len(b) > 0 && b[0]&0x80 != 0 {
			v = -1
		}
		for _, c := range b {
			v = v<<8 | int64(c)
		}
		u := uint64(v)
		if v < 0 {
			out = append(out, '-')
			u = -u
		}
		var buf [20]byte
		digits = string(strconv.AppendUint(buf[:0], u, 10))
	} else {
		v := new(big.Int).SetBytes(b)
		if b[0]&0x80 != 0 {
			v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
		}
		if v.Sign() < 0 {
			out = append(out, '-')
			v.Neg(v)
		}
		digits = v.String()
	}
	if scale <= 0 {
		return append(out, digits...)
	}
	if len(digits) <= scale {
		out = append(out, '0', '.')
		for range scale - len(digits) {
			out = append(out, '0')
		}
		return append(out, digits...)
	}
	out = append(out, digits[:len(digits)-scale]...)
	out = append(out, '.')
	return append(out, digits[len(digits)-scale:]...)
}

// appendFloat appends f as a JSON number, or NaN and the infinities as
// the strings "NaN", "Infinity" and "-Infinity".
func appendFloat(out []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(out, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(out, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(out, `"-Infinity"`...)
	}
	return strconv.AppendFloat(out, f, 'g', -1, bits)
}

// appendUTF8 appends b as a JSON string. Text jsonb cannot store (invalid
// UTF-8, the character U+0000) is an error.
func appendUTF8(out, b []byte) ([]byte, error) {
	out, err := pgjson.AppendText(out, string(b))
	switch {
	case errors.Is(err, pgjson.ErrInvalidUTF8):
		return nil, mismatch("a string is not valid UTF-8")
	case err != nil:
		return nil, mismatch("a string holds %v", err)
	}
	return out, nil
}
