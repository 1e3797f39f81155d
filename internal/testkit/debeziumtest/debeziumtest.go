// Package debeziumtest builds streams of Debezium change events as the
// PostgreSQL and MySQL connectors write them to Kafka (the JSON converter,
// with or without schemas.enable, or the AvroConverter), following the
// envelopes of Debezium's documentation, together with the mirror they
// must leave: the table customers (id, name, bio, balance, and born with
// schemas), keyed by id.
package debeziumtest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Connectors.
const (
	PostgreSQL = "postgresql"
	MySQL      = "mysql"
)

// Row is a mirror row as the test reads it back: text of each column, nil
// for NULL.
type Row struct {
	Name, Bio, Balance, Born *string
	// DeletedAt is when the row was deleted or truncated, zero while it
	// is live.
	DeletedAt time.Time
}

// Stream is a stream of change events and what it must leave.
type Stream struct {
	Connector string
	Schemas   bool
	// Flattened writes the rows of ExtractNewRecordState
	// (delete.handling.mode rewrite, add.fields with the op, the position
	// and source.ts_ms) instead of envelopes; a truncate stays an
	// envelope.
	Flattened bool
	// Avro, when set, writes the keys and values as the AvroConverter
	// does (envelopes only); Schemas must be set too.
	Avro  *AvroEncoders
	Topic string
	Parts int32
	// Records are the Kafka records in the order the connector sends
	// them, each with its partition set (the key's id modulo Parts; a
	// truncate goes to partition 0).
	Records []*kgo.Record
	// Changes counts the row changes and truncates: the raw change rows
	// the stream must leave. Tombstones counts the tombstones.
	Changes, Tombstones int
	// Want is the mirror the stream must leave, by id.
	Want map[int64]*Row

	lsn, lastCommit int64 // PostgreSQL
	pos, row        int64 // MySQL: the transaction's binlog position and its next row
	at              time.Time
	snapshotAt      int64
}

// New starts an empty stream for topic; changes are committed from at on.
func New(connector string, schemas bool, topic string, parts int32, at time.Time) *Stream {
	return &Stream{Connector: connector, Schemas: schemas, Topic: topic, Parts: parts, Want: map[int64]*Row{},
		lsn: 24023128, lastCommit: 24023119, pos: 154, at: at.Truncate(time.Millisecond), snapshotAt: 24023128}
}

// Values are a row's values: Name and Bio text, Balance in cents, Born
// a day number (schemas only).
type Values struct {
	Name, Bio string
	Balance   int64
	Born      int32
}

// Snapshot adds snapshot reads of rows (op r), all at the position where
// streaming starts.
func (s *Stream) Snapshot(rows map[int64]Values, ids []int64) {
	for i, id := range ids {
		marker := "true"
		if i == len(ids)-1 {
			marker = "last"
		}
		s.add("r", id, rows[id], nil, marker)
	}
}

// Insert adds a create (op c) in the open transaction.
func (s *Stream) Insert(id int64, v Values) { s.add("c", id, v, nil, "false") }

// Update adds an update (op u); the columns in unavailable are sent as
// Debezium's placeholder for a value it did not have (PostgreSQL only).
func (s *Stream) Update(id int64, v Values, unavailable ...string) {
	s.add("u", id, v, unavailable, "false")
}

// Delete adds a delete (op d, with the key alone in before, as with
// REPLICA IDENTITY DEFAULT) and its tombstone.
func (s *Stream) Delete(id int64) { s.add("d", id, Values{}, nil, "false") }

// Truncate adds a truncate of the table (op t).
func (s *Stream) Truncate() { s.add("t", 0, Values{}, nil, "false") }

// Commit ends the open transaction: the next changes are of another one.
func (s *Stream) Commit() {
	s.lastCommit = s.lsn + 5
	s.lsn += 16
	s.pos += 1000
	s.row = 0
	s.at = s.at.Add(time.Second)
}

func (s *Stream) add(op string, id int64, v Values, unavailable []string, snapshot string) {
	s.Changes++
	at := s.at
	source := s.source(op, snapshot, at)
	if op != "r" {
		s.lsn += 8
		s.row++
	}
	var before, after any
	row := s.row0(id, v, unavailable)
	switch op {
	case "c", "r", "u":
		after = row
	case "d":
		before = s.row0(id, Values{}, nil) // the key, the rest null
		for k := range before.(map[string]any) {
			if k != "id" {
				before.(map[string]any)[k] = nil
			}
		}
	}
	value := map[string]any{"before": before, "after": after, "source": source, "op": op, "ts_ms": at.UnixMilli() + 250}
	rec := &kgo.Record{Topic: s.Topic, Value: s.wrap(value, envelopeSchema(s.Schemas)), Partition: int32(id % int64(s.Parts))}
	switch {
	case s.Avro != nil:
		rec.Value = s.Avro.Value(s.avroValue(op, id, v, unavailable, source, at))
	case s.Flattened && op != "t":
		rec.Value = s.flatten(op, after, before, source)
	}
	if op != "t" {
		rec.Key = s.key(id)
	}
	s.Records = append(s.Records, rec)
	s.model(op, id, v, unavailable, at)
	if op == "d" {
		s.Tombstones++
		s.Records = append(s.Records, &kgo.Record{Topic: s.Topic, Key: s.key(id), Partition: rec.Partition})
	}
}

// source is the source block of a change.
func (s *Stream) source(op, snapshot string, at time.Time) map[string]any {
	src := map[string]any{"version": "2.5.4.Final", "connector": s.Connector, "name": "dbserver1", "ts_ms": at.UnixMilli(),
		"snapshot": snapshot, "table": "customers"}
	switch s.Connector {
	case PostgreSQL:
		lsn, seq0 := s.lsn+8, s.lastCommit
		if op == "r" {
			lsn = s.snapshotAt
		}
		src["db"], src["schema"], src["txId"], src["xmin"] = "postgres", "public", 555+s.lastCommit%1000, nil
		src["lsn"], src["sequence"] = lsn, fmt.Sprintf(`["%d","%d"]`, seq0, lsn)
		if op == "r" {
			src["sequence"] = fmt.Sprintf(`[null,"%d"]`, lsn)
		}
	case MySQL:
		pos, row := s.pos, s.row+1
		if op == "r" {
			pos, row = 154, 0
		}
		src["db"], src["server_id"], src["gtid"], src["file"], src["pos"], src["row"], src["thread"], src["query"] =
			"inventory", 223344, nil, "mysql-bin.000003", pos, row, 7, nil
	}
	return src
}

// row0 is a row's values as the converter writes them.
func (s *Stream) row0(id int64, v Values, unavailable []string) map[string]any {
	row := map[string]any{"id": id, "name": v.Name, "bio": v.Bio}
	if s.Schemas {
		row["balance"] = DecimalBase64(v.Balance)
		row["born"] = v.Born
	} else {
		row["balance"] = cents(v.Balance) // decimal.handling.mode=string
	}
	for _, c := range unavailable {
		row[c] = "__debezium_unavailable_value"
	}
	return row
}

// flatten writes a change as ExtractNewRecordState does with
// delete.handling.mode rewrite and add.fields op, the position fields and
// source.ts_ms.
func (s *Stream) flatten(op string, after, before any, source map[string]any) []byte {
	row, deleted := after, "false"
	if op == "d" {
		row, deleted = before, "true"
	}
	flat := map[string]any{}
	for k, v := range row.(map[string]any) {
		flat[k] = v
	}
	flat["__op"], flat["__deleted"], flat["__source_ts_ms"] = op, deleted, source["ts_ms"]
	meta := []string{`{"type":"string","optional":true,"field":"__op"}`, `{"type":"string","optional":true,"field":"__deleted"}`,
		`{"type":"int64","optional":true,"field":"__source_ts_ms"}`}
	switch s.Connector {
	case PostgreSQL:
		flat["__lsn"], flat["__sequence"] = source["lsn"], source["sequence"]
		meta = append(meta, `{"type":"int64","optional":true,"field":"__lsn"}`, `{"type":"string","optional":true,"field":"__sequence"}`)
	case MySQL:
		flat["__file"], flat["__pos"], flat["__row"] = source["file"], source["pos"], source["row"]
		meta = append(meta, `{"type":"string","optional":true,"field":"__file"}`, `{"type":"int64","optional":true,"field":"__pos"}`,
			`{"type":"int32","optional":true,"field":"__row"}`)
	}
	schema := strings.Replace(fmt.Sprintf(rowSchema, "value"), `"field":"value",`, "", 1)
	schema = strings.TrimSuffix(schema, "]}") + "," + strings.Join(meta, ",") + "]}"
	return s.wrap(flat, schema)
}

// model applies a change to the expected mirror.
func (s *Stream) model(op string, id int64, v Values, unavailable []string, at time.Time) {
	switch op {
	case "t":
		for _, r := range s.Want {
			if r.DeletedAt.IsZero() {
				r.DeletedAt = at
			}
		}
	case "d":
		r := s.Want[id]
		if r == nil {
			r = &Row{}
			s.Want[id] = r
		}
		r.DeletedAt = at
	default:
		r := s.Want[id]
		if r == nil {
			r = &Row{}
			s.Want[id] = r
		}
		r.DeletedAt = time.Time{}
		name, bio, bal := v.Name, v.Bio, cents(v.Balance)
		r.Name, r.Balance = &name, &bal
		if !contains(unavailable, "bio") {
			r.Bio = &bio
		}
		if s.Schemas {
			born := time.Unix(0, 0).UTC().AddDate(0, 0, int(v.Born)).Format("2006-01-02")
			r.Born = &born
		}
	}
}

func contains(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}

// key is the record key of a row.
func (s *Stream) key(id int64) []byte {
	if s.Avro != nil {
		return s.Avro.Key(avroKey{ID: int32(id)})
	}
	return s.wrap(map[string]any{"id": id}, `{"type":"struct","optional":false,"name":"dbserver1.public.customers.Key","fields":[{"type":"int32","optional":false,"field":"id"}]}`)
}

// wrap writes a document as the JSON converter does: with schemas.enable,
// inside {"schema": ..., "payload": ...}.
func (s *Stream) wrap(payload any, schema string) []byte {
	b, err := json.Marshal(payload)
	if err != nil {
		panic(err)
	}
	if !s.Schemas {
		return b
	}
	return []byte(`{"schema":` + schema + `,"payload":` + string(b) + `}`)
}

// rowSchema is the Connect schema of a customers row.
const rowSchema = `{"type":"struct","optional":true,"name":"dbserver1.public.customers.Value","field":"%s","fields":[
{"type":"int32","optional":false,"field":"id"},
{"type":"string","optional":true,"field":"name"},
{"type":"string","optional":true,"field":"bio"},
{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"balance"},
{"type":"int32","optional":true,"name":"io.debezium.time.Date","field":"born"}]}`

func envelopeSchema(schemas bool) string {
	if !schemas {
		return ""
	}
	return `{"type":"struct","optional":false,"name":"dbserver1.public.customers.Envelope","fields":[` +
		fmt.Sprintf(rowSchema, "before") + "," + fmt.Sprintf(rowSchema, "after") + `,
{"type":"struct","optional":false,"name":"io.debezium.connector.source","field":"source","fields":[
{"type":"string","optional":false,"field":"connector"},{"type":"int64","optional":false,"field":"ts_ms"}]},
{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"}]}`
}

// DecimalBase64 is a number of cents as Connect's Decimal of scale 2
// sends it: the unscaled value's big-endian two's complement, base64.
func DecimalBase64(c int64) string {
	n := big.NewInt(c)
	var b []byte
	if c >= 0 {
		b = append([]byte{0}, n.Bytes()...)
	} else {
		// Two's complement of the smallest byte length that holds it.
		size := len(new(big.Int).Neg(n).Bytes()) + 1
		m := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), uint(8*size)), n)
		b = m.Bytes()
		for len(b) < size {
			b = append([]byte{0xff}, b...)
		}
	}
	return base64.StdEncoding.EncodeToString(b)
}

// cents formats a number of cents as numeric text.
func cents(c int64) string {
	sign := ""
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
}

// RandomValues returns random values for a row.
func RandomValues(rng *rand.Rand) Values {
	return Values{
		Name:    fmt.Sprintf("name-%d", rng.IntN(1e6)),
		Bio:     strings.Repeat(fmt.Sprintf("bio-%d ", rng.IntN(1e6)), 1+rng.IntN(20)),
		Balance: rng.Int64N(2e6) - 1e6,
		Born:    int32(rng.IntN(20000)),
	}
}

// Random builds a stream of n transactions of changes over keys ids (a
// snapshot of half of them first), with updates that leave out
// unavailable values (PostgreSQL), deletes, re-inserts and a truncate in
// the middle.
func Random(connector string, schemas bool, topic string, parts int32, at time.Time, seed uint64, keys, n int) *Stream {
	return RandomInto(New(connector, schemas, topic, parts, at), seed, keys, n)
}

// RandomInto is Random into the stream s, for a stream set up further
// (Flattened).
func RandomInto(s *Stream, seed uint64, keys, n int) *Stream {
	rng := rand.New(rand.NewPCG(seed, 1))
	connector := s.Connector
	snap := map[int64]Values{}
	var ids []int64
	for id := int64(1); id <= int64(keys/2); id++ {
		snap[id] = RandomValues(rng)
		ids = append(ids, id)
	}
	s.Snapshot(snap, ids)
	for i := 0; i < n; i++ {
		if i == n/2 {
			s.Truncate()
			s.Commit()
			continue
		}
		for range 1 + rng.IntN(3) {
			id := 1 + rng.Int64N(int64(keys))
			r := s.Want[id]
			switch live := r != nil && r.DeletedAt.IsZero(); {
			case !live:
				s.Insert(id, RandomValues(rng))
			case rng.IntN(4) == 0:
				s.Delete(id)
			case connector == PostgreSQL && rng.IntN(2) == 0:
				s.Update(id, RandomValues(rng), "bio")
			default:
				s.Update(id, RandomValues(rng))
			}
		}
		s.Commit()
	}
	return s
}

// Again returns copies of the stream's records, to produce them once more
// at new offsets, as a connector that restarts sends them again.
func (s *Stream) Again() []*kgo.Record {
	out := make([]*kgo.Record, len(s.Records))
	for i, r := range s.Records {
		out[i] = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Partition: r.Partition}
	}
	return out
}
