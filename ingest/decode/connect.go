package decode

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// connectSchema is a Kafka Connect schema as the JSON converter writes it
// with schemas.enable: the "schema" beside a record's "payload".
type connectSchema struct {
	Type       string            `json:"type"`
	Name       string            `json:"name"`
	Optional   bool              `json:"optional"`
	Field      string            `json:"field"`
	Fields     []*connectSchema  `json:"fields"`
	Items      *connectSchema    `json:"items"`
	Parameters map[string]string `json:"parameters"`
	// cols are the columns of a struct schema, made before the schema
	// is shared (prepare); nil when not made.
	cols []Column
}

// prepare makes the columns of s and of its struct fields (an envelope's
// before and after), once, before s is shared between records.
func (s *connectSchema) prepare() *connectSchema {
	if s == nil {
		return nil
	}
	for _, f := range s.Fields {
		if f.Type == "struct" && f.cols == nil {
			f.cols = makeColumns(f)
		}
	}
	s.cols = makeColumns(s)
	return s
}

// field returns the schema of the struct field called name, or nil.
func (s *connectSchema) field(name string) *connectSchema {
	if s == nil {
		return nil
	}
	for _, f := range s.Fields {
		if f.Field == name {
			return f
		}
	}
	return nil
}

// Logical type names of Debezium and Kafka Connect that are decoded to
// their values.
const (
	dbzDate              = "io.debezium.time.Date"
	dbzTime              = "io.debezium.time.Time"
	dbzMicroTime         = "io.debezium.time.MicroTime"
	dbzNanoTime          = "io.debezium.time.NanoTime"
	dbzTimestamp         = "io.debezium.time.Timestamp"
	dbzMicroTimestamp    = "io.debezium.time.MicroTimestamp"
	dbzNanoTimestamp     = "io.debezium.time.NanoTimestamp"
	dbzZonedTimestamp    = "io.debezium.time.ZonedTimestamp"
	dbzZonedTime         = "io.debezium.time.ZonedTime"
	dbzMicroDuration     = "io.debezium.time.MicroDuration"
	dbzInterval          = "io.debezium.time.Interval"
	dbzVariableDecimal   = "io.debezium.data.VariableScaleDecimal"
	dbzJSON              = "io.debezium.data.Json"
	dbzUUID              = "io.debezium.data.Uuid"
	connectDecimal       = "org.apache.kafka.connect.data.Decimal"
	connectDate          = "org.apache.kafka.connect.data.Date"
	connectTime          = "org.apache.kafka.connect.data.Time"
	connectTimestamp     = "org.apache.kafka.connect.data.Timestamp"
	connectDecimalScale  = "scale"
	unavailablePlacehold = "__debezium_unavailable_value"
)

// unavailableBase64 is the placeholder as a bytes column carries it.
var unavailableBase64 = base64.StdEncoding.EncodeToString([]byte(unavailablePlacehold))

// isUnavailableValue reports whether raw is Debezium's placeholder for a value
// it did not have (an unchanged TOASTed value the replica identity does
// not hold): the placeholder text, its base64 form for bytes, or an array
// of one placeholder.
func isUnavailableValue(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0:
		return false
	case raw[0] == '"':
		return isString(raw, unavailablePlacehold) || isString(raw, unavailableBase64)
	case raw[0] == '[':
		items, err := arrayItems(raw)
		if err != nil || len(items) != 1 {
			return false
		}
		return isUnavailableValue(items[0])
	}
	return false
}

// convert returns raw, a value of schema s (nil: no schema), with its
// logical type decoded: dates, times and timestamps as ISO 8601 text,
// decimals as exact JSON numbers, bytes as PostgreSQL's hex text (\x...),
// JSON text as JSON. Values without a schema are returned as they are.
// The values it makes are spent from the record's budget b, and the
// structs and arrays it reads again taken from its work.
func convert(raw json.RawMessage, s *connectSchema, b *budget) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if s == nil || len(raw) == 0 || string(raw) == "null" || decoded(raw, s) {
		return raw, nil
	}
	if (s.Type == "struct" || s.Type == "array") && s.Name != dbzVariableDecimal {
		if err := b.takeWork(len(raw), "a "+s.Type+" read again"); err != nil {
			return nil, err
		}
		if s.Type == "struct" {
			return convertStruct(raw, s, b)
		}
		return convertArray(raw, s, b)
	}
	v, err := convertLeaf(raw, s)
	if err != nil {
		return nil, err
	}
	if err := b.spend(len(v)); err != nil {
		return nil, err
	}
	return v, nil
}

// convertLeaf converts a value whose schema is of a logical type, or of
// no struct or array.
func convertLeaf(raw json.RawMessage, s *connectSchema) (json.RawMessage, error) {
	switch s.Name {
	case dbzDate, connectDate:
		n, err := integer(raw)
		if err != nil {
			return nil, err
		}
		return jsonString(time.Unix(0, 0).UTC().AddDate(0, 0, int(n)).Format("2006-01-02")), nil
	case dbzTime, connectTime:
		return timeOfDay(raw, time.Millisecond)
	case dbzMicroTime:
		return timeOfDay(raw, time.Microsecond)
	case dbzNanoTime:
		return timeOfDay(raw, time.Nanosecond)
	case dbzTimestamp, connectTimestamp:
		return timestamp(raw, func(n int64) time.Time { return time.UnixMilli(n) })
	case dbzMicroTimestamp:
		return timestamp(raw, func(n int64) time.Time { return time.UnixMicro(n) })
	case dbzNanoTimestamp:
		return timestamp(raw, func(n int64) time.Time { return time.Unix(0, n) })
	case dbzMicroDuration:
		n, err := integer(raw)
		if err != nil {
			return nil, err
		}
		return jsonString(strconv.FormatInt(n, 10) + " microseconds"), nil
	case connectDecimal:
		scale, err := strconv.Atoi(s.Parameters[connectDecimalScale])
		if err != nil {
			return nil, fmt.Errorf("%s without an integer scale parameter", connectDecimal)
		}
		return decimal(raw, scale)
	case dbzVariableDecimal:
		var v struct {
			Scale *int   `json:"scale"`
			Value string `json:"value"`
		}
		if err := json.Unmarshal(raw, &v); err != nil || v.Scale == nil {
			return nil, fmt.Errorf("%s must be {scale, value}, got %s", dbzVariableDecimal, truncate(raw, 60))
		}
		return decimal(jsonString(v.Value), *v.Scale)
	case dbzJSON:
		var text string
		if json.Unmarshal(raw, &text) == nil && json.Valid([]byte(text)) && pgjson.Scan([]byte(text), nil, nil) == nil {
			return json.RawMessage(text), nil
		}
		return raw, nil
	}
	switch s.Type {
	case "bytes":
		text, err := stringValue(raw)
		if err != nil {
			return nil, fmt.Errorf("bytes must be a base64 string, got %s", truncate(raw, 40))
		}
		b, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return nil, fmt.Errorf("bytes must be base64: %w", err)
		}
		return jsonString(`\x` + hex.EncodeToString(b)), nil
	}
	return raw, nil
}

// convertArray converts each item of an array value by its schema. The
// items are copied into the array as they are converted, and the copies
// are spent from the budget as the items were: both are held until the
// array is done.
func convertArray(raw json.RawMessage, s *connectSchema, bud *budget) (json.RawMessage, error) {
	items, err := arrayItems(raw)
	if err != nil {
		return nil, fmt.Errorf("array expected, got %s", truncate(raw, 40))
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, it := range items {
		v, err := convert(it, s.Items, bud)
		if err != nil {
			return nil, err
		}
		if err := bud.spend(len(v) + 1); err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(v)
	}
	b.WriteByte(']')
	return b.Bytes(), nil
}

// decoded reports whether raw already holds the value of its logical type
// (a format that decodes records to JSON itself may have mapped it):
// text for a date, time, timestamp or duration, a number for a decimal.
func decoded(raw json.RawMessage, s *connectSchema) bool {
	switch s.Name {
	case dbzDate, connectDate, dbzTime, connectTime, dbzMicroTime, dbzNanoTime, dbzTimestamp, connectTimestamp,
		dbzMicroTimestamp, dbzNanoTimestamp, dbzMicroDuration:
		return raw[0] == '"'
	case connectDecimal, dbzVariableDecimal:
		return raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9'
	}
	return false
}

// convertStruct converts each field of a struct value by its schema;
// the struct it writes of them is spent from the budget too.
func convertStruct(raw json.RawMessage, s *connectSchema, b *budget) (json.RawMessage, error) {
	fields, err := objectFields(raw)
	if err != nil {
		return nil, err
	}
	for i := range fields {
		if fields[i].value, err = convert(fields[i].value, s.field(fields[i].name), b); err != nil {
			return nil, fmt.Errorf("%s: %w", fields[i].name, err)
		}
	}
	out := appendObject(nil, fields)
	if err := b.spend(len(out)); err != nil {
		return nil, err
	}
	return out, nil
}

func integer(raw json.RawMessage) (int64, error) {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("an integer expected, got %s", truncate(raw, 40))
	}
	return n, nil
}

// timeOfDay is a time of day of n units since midnight, truncated to
// the microseconds PostgreSQL keeps (rounding would make 23:59:59.9999996
// midnight).
func timeOfDay(raw json.RawMessage, unit time.Duration) (json.RawMessage, error) {
	n, err := integer(raw)
	if err != nil {
		return nil, err
	}
	if n < 0 || n > int64(24*time.Hour/unit) {
		return nil, fmt.Errorf("time of day %s out of range", raw)
	}
	d := (time.Duration(n) * unit).Truncate(time.Microsecond)
	h, m, sec, frac := d/time.Hour, d%time.Hour/time.Minute, d%time.Minute/time.Second, d%time.Second
	s := fmt.Sprintf("%02d:%02d:%02d", h, m, sec)
	if frac != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%09d", frac), "0")
	}
	return jsonString(s), nil
}

// timestamp is the time at gives of n, truncated to the microseconds
// PostgreSQL keeps, so that it stays on the day it names.
func timestamp(raw json.RawMessage, at func(int64) time.Time) (json.RawMessage, error) {
	n, err := integer(raw)
	if err != nil {
		return nil, err
	}
	t := at(n).UTC().Truncate(time.Microsecond)
	if t.Year() < -4712 || t.Year() > 9999 {
		return nil, fmt.Errorf("timestamp %s out of range", raw)
	}
	return jsonString(t.Format("2006-01-02T15:04:05.999999999Z")), nil
}

// decimal turns the base64 text of a big-endian two's-complement unscaled
// value (Connect's Decimal) into an exact JSON number.
func decimal(raw json.RawMessage, scale int) (json.RawMessage, error) {
	text, err := stringValue(raw)
	if err != nil {
		return nil, fmt.Errorf("decimal must be base64 text, got %s", truncate(raw, 40))
	}
	b, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(b) == 0 {
		return nil, errors.New("decimal must be base64 of at least one byte")
	}
	if scale < 0 || scale > 1000 {
		return nil, fmt.Errorf("decimal scale %d out of range", scale)
	}
	if b = trimSignExtension(b); len(b) > maxDecimalBytes {
		return nil, fmt.Errorf("a decimal of %d bytes has more digits than PostgreSQL's numeric holds", len(b))
	}
	return appendDecimal(make([]byte, 0, len(b)*241/100+scale+4), b, scale), nil
}

// jsonString is s as a JSON string.
func jsonString(s string) json.RawMessage {
	return appendJSONString(make([]byte, 0, len(s)+2), s)
}

// field is one member of a JSON object, in document order.
type field struct {
	name  string
	value json.RawMessage
}

// appendObjectAt appends fields as a JSON object and, unless at is nil,
// notes in at[i] (len(fields) long)
// the name of fields[i] and where its value is in the result.
func appendObjectAt(b []byte, fields []field, at []Value) []byte {
	n := 2
	for _, f := range fields {
		n += len(f.name) + len(f.value) + 4
	}
	b = slices.Grow(b, n)
	b = append(b, '{')
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, f.name)
		b = append(b, ':')
		start := len(b)
		b = append(b, f.value...)
		if at != nil {
			at[i] = Value{Name: f.name, Start: start, End: len(b)}
		}
	}
	return append(b, '}')
}

// appendObject appends fields as a JSON object.
func appendObject(b []byte, fields []field) []byte { return appendObjectAt(b, fields, nil) }

// Column is a column of a mirror as a Connect schema describes it.
type Column struct {
	Name    string
	Type    string // a PostgreSQL type
	NotNull bool
	// Precision and Scale are a decimal's (connect.decimal.precision and
	// scale), Length a string's length at the source
	// (__debezium.source.column.length, with the connector's
	// column.propagate.source.type); 0 when the schema does not say.
	Precision, Scale, Length int
}

// pgType is the PostgreSQL type of the column a Connect schema describes.
func pgType(s *connectSchema) string {
	switch s.Name {
	case dbzDate, connectDate:
		return "date"
	case dbzTime, dbzMicroTime, dbzNanoTime, connectTime:
		return "time"
	case dbzTimestamp, dbzMicroTimestamp, dbzNanoTimestamp, connectTimestamp:
		return "timestamp"
	case dbzZonedTimestamp:
		return "timestamptz"
	case dbzZonedTime:
		return "timetz"
	case dbzMicroDuration, dbzInterval:
		return "interval"
	case connectDecimal, dbzVariableDecimal:
		return "numeric"
	case dbzJSON:
		return "jsonb"
	case dbzUUID:
		return "uuid"
	}
	switch s.Type {
	case "int8", "int16":
		return "smallint"
	case "int32":
		return "integer"
	case "int64":
		return "bigint"
	case "float32":
		return "real"
	case "float64":
		return "double precision"
	case "boolean":
		return "boolean"
	case "bytes":
		return "bytea"
	case "array":
		if s.Items != nil && s.Items.Type != "array" && s.Items.Type != "struct" && s.Items.Type != "map" {
			return pgType(s.Items) + "[]"
		}
	case "string":
		return "text"
	}
	return "jsonb"
}

// columns lists the columns of a row schema. The list may be shared: it
// is not to be changed.
func columns(s *connectSchema) []Column {
	if s != nil && s.cols != nil {
		return s.cols
	}
	return makeColumns(s)
}

// makeColumns makes the list of the columns of a row schema.
func makeColumns(s *connectSchema) []Column {
	if s == nil || s.Type != "struct" {
		return nil
	}
	out := make([]Column, 0, len(s.Fields))
	for _, f := range s.Fields {
		c := Column{Name: f.Field, Type: pgType(f), NotNull: !f.Optional}
		param := func(name string) int {
			n, err := strconv.Atoi(f.Parameters[name])
			if err != nil || n < 0 {
				return 0
			}
			return n
		}
		switch c.Type {
		case "numeric":
			if f.Name == connectDecimal {
				c.Precision, c.Scale = param("connect.decimal.precision"), param("scale")
			}
		case "text":
			c.Length = param("__debezium.source.column.length")
		}
		out = append(out, c)
	}
	return out
}
