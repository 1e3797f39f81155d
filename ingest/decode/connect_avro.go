package decode

import (
	"fmt"
	"strconv"

	"github.com/hamba/avro/v2"
)

// Kafka Connect's annotations of the Avro schemas that Confluent's
// AvroConverter writes: the Connect schema's name and parameters, and the
// Connect type where Avro has none of its own (int8, int16).
const (
	avroConnectName   = "connect.name"
	avroConnectParams = "connect.parameters"
	avroConnectType   = "connect.type"
)

// connectOfAvro is the Connect schema that an Avro schema written by
// Confluent's AvroConverter describes: types from the Avro types, names
// and parameters of logical types from the connect.* annotations (and
// from Avro's own logical types when they are missing), a ["null", T]
// union as an optional T. Debezium change events decoded to JSON by
// their Avro schema are then read as those of the JSON converter with
// schemas.enable.
func connectOfAvro(s avro.Schema) *connectSchema {
	b := connectBuilder{open: map[string]bool{}, done: map[string]*connectSchema{}}
	return b.of(s)
}

// connectBuilder makes the Connect schema of an Avro schema. A record is
// made once, however many fields name it (a schema that names a record
// twice in each of 30 nested records would otherwise take 2^30 steps),
// and each use takes a copy, whose Field and Optional it sets.
type connectBuilder struct {
	open map[string]bool           // the records under way
	done map[string]*connectSchema // the records made
}

func (b *connectBuilder) of(s avro.Schema) *connectSchema {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	if u, ok := s.(*avro.UnionSchema); ok {
		if !u.Nullable() {
			return &connectSchema{} // no Connect type: values are kept as decoded
		}
		_, i := u.Indices()
		c := b.of(u.Types()[i])
		c.Optional = true
		return c
	}
	if r, ok := s.(*avro.RecordSchema); ok && b.done[r.FullName()] != nil {
		c := *b.done[r.FullName()]
		return &c
	}
	c := &connectSchema{}
	if p, ok := s.(avro.PropertySchema); ok {
		c.Name, _ = p.Prop(avroConnectName).(string)
		if params, ok := p.Prop(avroConnectParams).(map[string]any); ok {
			c.Parameters = map[string]string{}
			for k, v := range params {
				c.Parameters[k] = fmt.Sprint(v)
			}
		}
	}
	switch s := s.(type) {
	case *avro.PrimitiveSchema:
		c.Type = primitiveConnectType(s)
		logicalConnectName(c, s.Logical())
	case *avro.FixedSchema:
		c.Type = "bytes"
		logicalConnectName(c, s.Logical())
	case *avro.RecordSchema:
		c.Type = "struct"
		if b.open[s.FullName()] {
			return c // a recursive type: its values are kept as decoded
		}
		b.open[s.FullName()] = true
		defer delete(b.open, s.FullName())
		for _, f := range s.Fields() {
			fc := b.of(f.Type())
			fc.Field = f.Name()
			c.Fields = append(c.Fields, fc)
		}
		made := *c
		b.done[s.FullName()] = &made
	case *avro.ArraySchema:
		c.Type, c.Items = "array", b.of(s.Items())
	case *avro.MapSchema:
		c.Type = "map"
	case *avro.EnumSchema:
		c.Type = "string"
	}
	return c
}

// primitiveConnectType is the Connect type of an Avro primitive type.
func primitiveConnectType(s *avro.PrimitiveSchema) string {
	switch s.Type() {
	case avro.Int:
		if t, ok := s.Prop(avroConnectType).(string); ok && (t == "int8" || t == "int16") {
			return t
		}
		return "int32"
	case avro.Long:
		return "int64"
	case avro.Float:
		return "float32"
	case avro.Double:
		return "float64"
	case avro.Boolean:
		return "boolean"
	case avro.Bytes:
		return "bytes"
	case avro.String:
		return "string"
	}
	return ""
}

// logicalConnectName names the Connect logical type of an Avro logical
// type when the schema has no connect.name: Connect's Decimal (with its
// scale), Date, Time and Timestamp.
func logicalConnectName(c *connectSchema, l avro.LogicalSchema) {
	if c.Name != "" || l == nil {
		return
	}
	switch l.Type() {
	case avro.Decimal:
		c.Name = connectDecimal
		if d, ok := l.(*avro.DecimalLogicalSchema); ok {
			c.Parameters = map[string]string{connectDecimalScale: strconv.Itoa(d.Scale())}
		}
	case avro.Date:
		c.Name = connectDate
	case avro.TimeMillis:
		c.Name = connectTime
	case avro.TimestampMillis:
		c.Name = connectTimestamp
	}
}
