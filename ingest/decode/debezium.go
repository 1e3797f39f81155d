package decode

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

// Dead-letter reasons of Debezium sources.
const (
	// ReasonInvalidEnvelope: not a Debezium change event tidemark can
	// apply: no op, row, source position or commit time, a connector
	// whose positions it cannot order, or a value that does not match
	// its Connect schema.
	ReasonInvalidEnvelope = "invalid_envelope"
	// ReasonMissingKey: a row change whose record key or row lacks a
	// value of the mirror's key.
	ReasonMissingKey = "missing_key"
	// ReasonWrongTable: a change of a table other than the one the
	// source mirrors.
	ReasonWrongTable = "wrong_table"
)

// SkipTombstone is why a tombstone (a record without a value, which
// Debezium sends after a delete for log compaction) is skipped: it is
// counted, not stored; the delete before it carries the change.
const SkipTombstone = "tombstone"

// Raw change operations of a Debezium change.
const (
	OpInsert   = "insert"
	OpUpdate   = "update"
	OpDelete   = "delete"
	OpTruncate = "truncate"
)

// Change is a row change of a Debezium change event, decoded.
type Change struct {
	// Op is the raw change row's op; a snapshot read is an insert.
	Op string
	// Snapshot marks a snapshot read (op r).
	Snapshot bool
	// Table is the source table: schema.table (PostgreSQL), db.table
	// (MySQL), or the topic when the event does not say (TableUnnamed:
	// ExtractNewRecordState's rows without the table among their fields).
	Table        string
	TableUnnamed bool
	// Position orders the changes of one source, element by element:
	// see position.
	Position []int64
	// LSN is the change's PostgreSQL LSN as pg_lsn text, "" for others.
	LSN string
	// Key is the record key's fields as a JSON object; nil for a
	// truncate. RowKey is it as text: the value of one field, or a JSON
	// array of the values of several as text.
	Key    []byte
	RowKey string
	// Row is the row after the change, or for a delete before it (or
	// only its key), with the key's fields, logical types decoded and
	// values Debezium did not have left out; nil for a truncate.
	Row []byte
	// Values are the members of Row, in order: each column's JSON value
	// is Row[Start:End].
	Values []Value
	// Old is the row before an update or delete, when sent.
	Old []byte
	// Unavailable lists the columns whose value Debezium did not have
	// (unchanged TOASTed values): the mirror keeps what it holds.
	Unavailable []string
	// Columns are the row's columns as its Connect schema gives them,
	// nil without one; KeyColumns the key's fields in order.
	Columns    []Column
	KeyColumns []string
}

// Value is a member of a change's Row: its column, and where its JSON
// value is in the Row.
type Value struct {
	Name       string
	Start, End int
}

// debezium is what a Decoder of a Debezium source holds.
type debezium struct {
	// mirrorKey is the mirror's key, once known: a row change lacking
	// one of its values is a missing_key dead letter.
	mirrorKey atomic.Pointer[[]string]
	// schemas are the Connect schemas of the JSON converter's records
	// parsed, by their text: each record carries its schema, mostly one
	// of a few.
	schemas schemaCache
}

// Bounds of a Debezium decoder's schemaCache: the schemas it keeps, and
// the bytes of their text. A schema longer than maxCachedSchema is
// parsed with each record.
const (
	maxCachedSchemas     = 64
	maxCachedSchemaBytes = 4 << 20
	maxCachedSchema      = 256 << 10
)

// schemaCache holds parsed Connect schemas by their JSON text, within
// maxCachedSchemas and maxCachedSchemaBytes: when a new schema would pass
// either, the cache is emptied first. Its schemas are shared between
// records and never changed.
//
// It also remembers, for keys and for values, the last schema that a
// checked document of the JSON converter carried: a document that
// carries it again, byte for byte, need not have it checked and parsed
// again (known).
type schemaCache struct {
	mu     sync.Mutex
	byText map[string]*connectSchema
	bytes  int
	recent [2]atomic.Pointer[recentSchema]
}

// parse returns the Connect schema of the JSON text raw, from the cache
// or parsed (and then kept).
func (c *schemaCache) parse(raw []byte) (*connectSchema, error) {
	c.mu.Lock()
	s := c.byText[string(raw)]
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s = &connectSchema{}
	if err := json.Unmarshal(raw, s); err != nil {
		return nil, err
	}
	s.prepare()
	if len(raw) > maxCachedSchema {
		return s, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byText) >= maxCachedSchemas || c.bytes+len(raw) > maxCachedSchemaBytes {
		c.byText, c.bytes = nil, 0
	}
	if c.byText == nil {
		c.byText = map[string]*connectSchema{}
	}
	c.byText[string(raw)] = s
	c.bytes += len(raw)
	return s, nil
}

// SetMirrorKey tells a Debezium decoder the key columns of its mirror.
func (d *Decoder) SetMirrorKey(cols []string) {
	if d.dbz != nil {
		c := slices.Clone(cols)
		d.dbz.mirrorKey.Store(&c)
	}
}

// decodeDebezium decodes a record of a Debezium topic: its value and key
// are JSON (the JSON converter), or in the Confluent wire format (the
// AvroConverter, read through the registry with the schemas in s).
func (d *Decoder) decodeDebezium(r *kgo.Record, s Schemas) (Event, *Rejection) {
	if len(bytes.TrimSpace(r.Value)) == 0 || string(bytes.TrimSpace(r.Value)) == "null" {
		return Event{Skip: SkipTombstone}, nil
	}
	// One budget for the key and the value, which are decoded alike.
	b := newBudget(d.limits, len(r.Value)+len(r.Key))
	value, rej := d.changeDoc(r.Value, s, "", b)
	if rej != nil {
		return Event{}, rej
	}
	var key *changeDoc
	if len(bytes.TrimSpace(r.Key)) > 0 {
		k, rej := d.changeDoc(r.Key, s, "record key: ", b)
		if rej != nil {
			return Event{}, rej
		}
		key = &k
	}
	return d.decodeChange(r.Topic, key, value, b)
}

// changeDoc reads a record's value or key (what says which in a
// rejection's detail) as a document of a change event, within the
// record's budget b.
func (d *Decoder) changeDoc(v []byte, s Schemas, what string, b *budget) (changeDoc, *Rejection) {
	id, payload, ok := wireID(v)
	if len(v) > 0 && v[0] == 0 && !ok {
		return changeDoc{}, &Rejection{ReasonWrongFormat, what + "a value that begins with the byte 0 is neither JSON nor in the Confluent wire format: " + hexPrefix(v, wireHeader)}
	}
	if !ok {
		slot := slotOf(what)
		if payload, schema := d.dbz.schemas.known(slot, v); schema != nil {
			return changeDoc{doc: payload, schema: schema, decoded: true}, nil
		}
		if err := pgjson.Scan(v, nil, nil); err != nil {
			return changeDoc{}, &Rejection{ReasonInvalidJSON, what + err.Error()}
		}
		return changeDoc{doc: v, slot: slot}, nil
	}
	if d.reg == nil {
		return changeDoc{}, &Rejection{ReasonWrongFormat, fmt.Sprintf("%sin the Confluent wire format (schema id %d), as the AvroConverter writes it: reading it needs schema_registry configured", what, id)}
	}
	e, rej := d.entry(id, s, config.FormatAvro, "a Debezium source reads the JSON converter, or Avro through the schema registry")
	if rej != nil {
		return changeDoc{}, &Rejection{rej.Reason, what + rej.Detail}
	}
	js, err := e.codec.toJSON(payload, b)
	if err != nil {
		return changeDoc{}, decodeRejection(fmt.Sprintf("%sschema id %d: ", what, id), err)
	}
	var cs *connectSchema
	if ac, ok := e.codec.(*avroCodec); ok {
		cs = ac.connect
	}
	return changeDoc{doc: js, schema: cs, decoded: true}, nil
}

// changeDoc is a record value or key of a change event: JSON as the
// JSON converter wrote it (with schemas.enable, {"schema": ..., "payload":
// ...}), or a document that a registry format decoded, with the Connect
// schema its schema describes.
type changeDoc struct {
	doc     json.RawMessage
	schema  *connectSchema
	decoded bool
	// slot is the schemaCache's slot of the document's kind, key or
	// value (slotOf).
	slot int
}

// slotOf is the schemaCache slot of a record's value (what "") or key.
func slotOf(what string) int {
	if what == "" {
		return 0
	}
	return 1
}

// unwrap returns the document's payload and its Connect schema, parsed
// through cache.
func (c *changeDoc) unwrap(cache *schemaCache) (json.RawMessage, *connectSchema, error) {
	if c.decoded {
		return c.doc, c.schema, nil
	}
	return unwrap(c.doc, cache, c.slot)
}

// DecodeChange decodes a Debezium change event given as JSON documents:
// key is the record key (nil for none), value the record value, each as
// the JSON converter writes it, with or without schemas.enable. topic
// names the table when the event does not. (Records of the AvroConverter
// are decoded by DecodeWith: their documents come with the Connect schema
// of their Avro schema's connect.* annotations, and values the Avro
// decoding mapped already, text for a date, a number for a decimal, are
// kept.)
func (d *Decoder) DecodeChange(topic string, key, value []byte) (Event, *Rejection) {
	// As a record's documents are, they are checked before they are read.
	if err := pgjson.Scan(value, nil, nil); err != nil {
		return Event{}, &Rejection{ReasonInvalidEnvelope, err.Error()}
	}
	var k *changeDoc
	if key != nil {
		if err := pgjson.Scan(key, nil, nil); err != nil {
			return Event{}, &Rejection{ReasonMissingKey, "record key: " + err.Error()}
		}
		k = &changeDoc{doc: key, slot: slotOf("record key: ")}
	}
	return d.decodeChange(topic, k, changeDoc{doc: value}, newBudget(d.limits, len(key)+len(value)))
}

// decodeChange decodes a change event of record key key (nil for none)
// and value value, within the record's budget b.
func (d *Decoder) decodeChange(topic string, key *changeDoc, value changeDoc, b *budget) (Event, *Rejection) {
	doc, schema, err := value.unwrap(&d.dbz.schemas)
	if err != nil {
		return Event{}, &Rejection{ReasonInvalidEnvelope, err.Error()}
	}
	if string(doc) == "null" {
		return Event{Skip: SkipTombstone}, nil
	}
	fields, err := objectFields(doc)
	if err != nil {
		return Event{}, &Rejection{ReasonInvalidEnvelope, "value: " + err.Error()}
	}
	var ev envelope
	if isEnvelope(fields) {
		err = ev.read(fields, schema)
	} else {
		err = ev.readFlattened(fields, schema)
	}
	if err != nil {
		return Event{}, &Rejection{ReasonInvalidEnvelope, err.Error()}
	}
	return d.change(topic, key, &ev, b)
}

// unwrap returns the payload of a document the JSON converter wrote with
// schemas.enable ({"schema": ..., "payload": ...}) and its schema, or the
// document itself and no schema.
func unwrap(doc []byte, cache *schemaCache, slot int) (json.RawMessage, *connectSchema, error) {
	fields, err := objectFields(doc)
	if err != nil {
		return nil, nil, err
	}
	if len(fields) != 2 || !hasField(fields, "schema") || !hasField(fields, "payload") {
		return doc, nil, nil
	}
	var s *connectSchema
	if raw := get(fields, "schema"); string(raw) != "null" {
		if s, err = cache.parse(raw); err != nil {
			return nil, nil, fmt.Errorf("schema: %w", err)
		}
		cache.remember(slot, doc, raw, s)
	}
	return bytes.TrimSpace(get(fields, "payload")), s, nil
}

func hasField(fields []field, name string) bool {
	return slices.ContainsFunc(fields, func(f field) bool { return f.name == name })
}

// get returns the value of the member name, nil when there is none.
func get(fields []field, name string) json.RawMessage {
	for _, f := range fields {
		if f.name == name {
			return f.value
		}
	}
	return nil
}

// isEnvelope reports whether an object is Debezium's envelope (op and
// source) rather than the flattened row of ExtractNewRecordState.
func isEnvelope(fields []field) bool {
	op, src := get(fields, "op"), bytes.TrimSpace(get(fields, "source"))
	return len(op) > 0 && op[0] == '"' && len(src) > 0 && src[0] == '{'
}

// envelope is a change event read from either form.
type envelope struct {
	op          string // c, u, d, r, t
	row, before json.RawMessage
	rowSchema   *connectSchema
	source      []field
	snapshot    bool
}

// read reads the envelope {before, after, source, op, ts_ms}.
func (e *envelope) read(fields []field, schema *connectSchema) error {
	var err error
	if e.op, err = stringValue(get(fields, "op")); err != nil {
		return fmt.Errorf("op: %w", err)
	}
	src, err := objectFields(get(fields, "source"))
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	e.source = src
	after, before := nullable(get(fields, "after")), nullable(get(fields, "before"))
	e.rowSchema = schema.field("after")
	if e.rowSchema == nil {
		e.rowSchema = schema.field("before")
	}
	switch e.op {
	case "c", "r", "u":
		if after == nil {
			return fmt.Errorf("op %q without after", e.op)
		}
		e.row, e.before = after, before
	case "d":
		e.row, e.before = before, before
	case "t":
	default:
		return fmt.Errorf("op %q is not a row change (c, u, d, r or t)", e.op)
	}
	e.snapshot = e.op == "r" || snapshotFlag(get(src, "snapshot"))
	return nil
}

// readFlattened reads a row of ExtractNewRecordState: the row's fields
// plus fields it added, prefixed "__": __op, __deleted (delete.handling.mode
// rewrite), and the source's fields (add.fields) as __<name> or
// __source_<name>.
func (e *envelope) readFlattened(fields []field, schema *connectSchema) error {
	var row []field
	var deleted bool
	for _, f := range fields {
		name, ok := strings.CutPrefix(f.name, "__")
		switch {
		case !ok:
			row = append(row, f)
		case name == "op":
			op, err := stringValue(f.value)
			if err != nil {
				return fmt.Errorf("__op: %w", err)
			}
			e.op = op
		case name == "deleted":
			deleted = snapshotFlag(f.value) // "true" or true
		default:
			e.source = append(e.source, field{strings.TrimPrefix(name, "source_"), f.value})
		}
	}
	switch {
	case deleted:
		e.op = "d"
	case e.op == "":
		e.op = "u"
	}
	if e.op == "t" {
		return nil
	}
	if !slices.Contains([]string{"c", "r", "u", "d"}, e.op) {
		return fmt.Errorf("__op %q is not a row change (c, u, d, r or t)", e.op)
	}
	e.row = appendObject(nil, row)
	if e.op == "d" {
		e.before = e.row
	}
	if schema != nil {
		rs := *schema
		rs.Fields = slices.DeleteFunc(slices.Clone(schema.Fields), func(f *connectSchema) bool { return strings.HasPrefix(f.Field, "__") })
		rs.cols = nil // the envelope's columns have the added fields
		e.rowSchema = &rs
	}
	e.snapshot = e.op == "r" || snapshotFlag(get(e.source, "snapshot"))
	return nil
}

// nullable returns raw, or nil when it is null or absent.
func nullable(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// snapshotFlag reads source.snapshot (or __deleted): true, "true", and
// the snapshot markers "first", "last", "first_in_data_collection",
// "last_in_data_collection" and "incremental" mean a snapshot read.
func snapshotFlag(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	switch {
	case string(raw) == "true":
		return true
	case len(raw) > 0 && raw[0] == '"':
		v, err := stringValue(raw)
		return err == nil && v != "" && v != "false"
	}
	return false
}

// change builds the event of a decoded envelope.
func (d *Decoder) change(topic string, key *changeDoc, e *envelope, b *budget) (Event, *Rejection) {
	c := &Change{Snapshot: e.snapshot, Table: tableName(e.source, topic)}
	c.TableUnnamed = len(nullable(get(e.source, "table"))) == 0
	var err error
	if c.Position, c.LSN, err = position(e.source, e.snapshot); err != nil {
		return Event{}, &Rejection{ReasonInvalidEnvelope, err.Error()}
	}
	at, err := commitTime(e.source)
	if err != nil {
		return Event{}, &Rejection{ReasonInvalidEnvelope, err.Error()}
	}
	switch e.op {
	case "c", "r":
		c.Op = OpInsert
	case "u":
		c.Op = OpUpdate
	case "d":
		c.Op = OpDelete
	case "t":
		c.Op = OpTruncate
	}
	ev := Event{Time: at, Change: c, Payload: []byte("{}")}
	if c.Op != OpTruncate {
		if rej := d.rowChange(c, key, e, b); rej != nil {
			return Event{}, rej
		}
		ev.Payload = c.Row
	}
	ev.ID = changeID(c)
	return ev, nil
}

// rowChange fills the key and rows of a row change, within the record's
// budget b.
func (d *Decoder) rowChange(c *Change, key *changeDoc, e *envelope, b *budget) *Rejection {
	if key == nil {
		return &Rejection{ReasonMissingKey, "a row change without a record key (a table without a primary key needs message.key.columns)"}
	}
	kdoc, kschema, err := key.unwrap(&d.dbz.schemas)
	if err != nil {
		return &Rejection{ReasonMissingKey, "record key: " + err.Error()}
	}
	kfields, err := objectFields(kdoc)
	if err != nil || len(kfields) == 0 {
		return &Rejection{ReasonMissingKey, "the record key is not an object of the key's fields"}
	}
	for i := range kfields {
		if kfields[i].value, err = convert(kfields[i].value, kschema.field(kfields[i].name), b); err != nil {
			return envelopeRejection(fmt.Sprintf("key field %s: ", kfields[i].name), err)
		}
		c.KeyColumns = append(c.KeyColumns, kfields[i].name)
	}
	c.Key = appendObject(nil, kfields)
	c.RowKey = rowKey(kfields)
	row, absent, err := decodeRow(e.row, e.rowSchema, b)
	if err != nil {
		return envelopeRejection("", err)
	}
	for _, k := range kfields {
		if !hasField(row, k.name) {
			row = append(row, k)
		}
	}
	c.Values = make([]Value, len(row))
	c.Row, c.Unavailable, c.Columns = appendObjectAt(nil, row, c.Values), absent, columns(e.rowSchema)
	if e.before != nil && c.Op != OpInsert {
		old, _, err := decodeRow(e.before, e.rowSchema, b)
		if err != nil {
			return envelopeRejection("before: ", err)
		}
		c.Old = appendObject(nil, old)
	}
	if p := d.dbz.mirrorKey.Load(); p != nil {
		for _, k := range *p {
			if v := nullable(get(row, k)); v == nil {
				return &Rejection{ReasonMissingKey, fmt.Sprintf("no value of the mirror's key column %s in the record key or row", k)}
			}
		}
	}
	return nil
}

// envelopeRejection is the rejection of a change whose values do not
// convert: an invalid_envelope, or a decode_limit when converting them
// would cost more than the record's budget.
func envelopeRejection(prefix string, err error) *Rejection {
	if errors.Is(err, errLimit) {
		return &Rejection{ReasonDecodeLimit, prefix + err.Error()}
	}
	return &Rejection{ReasonInvalidEnvelope, prefix + err.Error()}
}

// decodeRow converts a row's values by its schema, within the record's
// budget b, and leaves out those Debezium did not have, which it lists.
func decodeRow(raw json.RawMessage, s *connectSchema, b *budget) ([]field, []string, error) {
	if raw == nil {
		return nil, nil, nil
	}
	fields, err := objectFields(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("row: %w", err)
	}
	out := fields[:0]
	var absent []string
	for _, f := range fields {
		if isUnavailableValue(f.value) {
			absent = append(absent, f.name)
			continue
		}
		if f.value, err = convert(f.value, s.field(f.name), b); err != nil {
			return nil, nil, fmt.Errorf("column %s: %w", f.name, err)
		}
		out = append(out, f)
	}
	return out, absent, nil
}

// rowKey is the key as text: one field's value (a string unquoted), or a
// JSON array of several fields' values as text.
func rowKey(fields []field) string {
	texts := make([]string, len(fields))
	for i, f := range fields {
		if s, ok := textOf(f.value); ok {
			texts[i] = s
		} else {
			texts[i] = string(f.value)
		}
	}
	if len(texts) == 1 {
		return texts[0]
	}
	b, _ := json.Marshal(texts)
	return string(b)
}

// tableName is the source table an event names, or the topic.
func tableName(src []field, topic string) string {
	var schema, db, table string
	schema, _ = textOf(get(src, "schema"))
	db, _ = textOf(get(src, "db"))
	table, _ = textOf(get(src, "table"))
	switch {
	case table == "":
		return topic
	case schema != "":
		return schema + "." + table
	case db != "":
		return db + "." + table
	}
	return table
}

// commitTime is source.ts_ms: when the change was committed at the source
// (for a snapshot read, when it was read).
func commitTime(src []field) (time.Time, error) {
	raw := nullable(get(src, "ts_ms"))
	if raw == nil {
		return time.Time{}, errors.New("no source.ts_ms (the commit time; a flattened event needs add.fields=source.ts_ms)")
	}
	ms, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || ms < -62135596800000 || ms > 253402300799999 {
		return time.Time{}, fmt.Errorf("source.ts_ms %s is not a time in milliseconds", truncate(raw, 40))
	}
	return time.UnixMilli(ms).UTC(), nil
}

// changeID identifies a change by its source position, op, table and key,
// so that a change the connector sends again is the same raw row.
func changeID(c *Change) string {
	pos := make([]string, len(c.Position))
	for i, p := range c.Position {
		pos[i] = strconv.FormatInt(p, 10)
	}
	id := strings.Join(pos, ".") + "/" + c.Op + "/" + c.Table
	if c.Op == OpTruncate {
		return id
	}
	if len(id)+1+len(c.RowKey) > MaxIDBytes {
		sum := sha256.Sum256([]byte(c.RowKey))
		return id + "/sha256:" + hex.EncodeToString(sum[:])
	}
	return id + "/" + c.RowKey
}
