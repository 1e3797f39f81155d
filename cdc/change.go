package cdc

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
	"github.com/tidemark-dev/tidemark/mirror"
)

// Change operations, as recorded in raw change rows.
const (
	opInsert   = "insert"
	opUpdate   = "update"
	opDelete   = "delete"
	opTruncate = "truncate"
)

// value is one column value in text form; nil is SQL NULL.
type value = *string

// row is a decoded tuple: the columns that were sent, by name. A column
// absent from the map was not sent (an unchanged TOASTed value, or a
// column outside the key of an old key tuple).
type row = mirror.Row

// change is one decoded row change of a source transaction.
type change struct {
	op    string
	table *table
	// seq is the change's position in its source transaction.
	seq        int
	commitLSN  pglogrepl.LSN
	commitTime time.Time
	newRow     row // insert, update
	oldRow     row // update with a key change or FULL identity; delete
	// resync is the generation of the resync of the table under way when
	// the change was read, 0 when none was: its key is kept by the sweep.
	resync int64
}

// bytes estimates the memory of a change, for the buffer bound.
func (c *change) bytes() int {
	n := 64
	for _, r := range []row{c.newRow, c.oldRow} {
		for k, v := range r {
			n += len(k) + 16
			if v != nil {
				n += len(*v)
			}
		}
	}
	return n
}

// table is a source table as the replication stream describes it, with its
// mirror.
type table struct {
	relID   uint32
	name    string // schema.table at the source
	columns []column
	mirror  *mirror.Table
	// rel is the table as the mirror writer sees it: its columns are
	// columns' names (setColumns).
	rel mirror.Relation
}

// column is one column of a relation message.
type column struct {
	name string
	oid  uint32
	mod  int32
}

// JSON and JSONB type OIDs: their text values are embedded as JSON, not as
// strings; a json value that jsonb refuses is embedded as a string of its
// text.
const (
	jsonOID  = 114
	jsonbOID = 3802
)

// decodeTuple turns a tuple of the stream (the bytes of a TupleData, as
// parseChange checked them; nil for none) into a row, by the relation's
// columns cols. Unchanged TOAST values ('u') are left out, so that
// applying the row keeps the stored value.
func (t *table) decodeTuple(cols []column, td []byte) (row, error) {
	if td == nil {
		return nil, nil
	}
	n := int(binary.BigEndian.Uint16(td))
	if n != len(cols) {
		return nil, fmt.Errorf("cdc: %s: tuple has %d columns, the relation %d", t.name, n, len(cols))
	}
	// One scan finds each value's kind and place, one copy puts the text
	// values into one string, and the row's values are slices of it:
	// three allocations a tuple, not two a column.
	type span struct {
		kind     byte
		from, to int
	}
	var small [16]span
	spans := small[:0]
	off, size := 2, 0
	for i := range n {
		kind := td[off]
		off++
		sp := span{kind: kind, from: off, to: off}
		switch kind {
		case 't', 'b':
			l := int(binary.BigEndian.Uint32(td[off:]))
			sp.from, sp.to = off+4, off+4+l
			off = sp.to
			if kind == 'b' {
				return nil, fmt.Errorf("cdc: %s: column %s arrived in format %q; only text is supported", t.name, cols[i].name, 'b')
			}
			size += l
		}
		spans = append(spans, sp)
	}
	var all strings.Builder
	all.Grow(size)
	for _, sp := range spans {
		all.Write(td[sp.from:sp.to])
	}
	text := all.String()
	r := make(row, n)
	vals := make([]string, n)
	off = 0
	for i, sp := range spans {
		switch sp.kind {
		case 'n':
			r[cols[i].name] = nil
		case 't':
			vals[i] = text[off : off+sp.to-sp.from]
			off += sp.to - sp.from
			r[cols[i].name] = &vals[i]
		}
		// 'u', an unchanged TOASTed value, is not sent: what is stored
		// stays.
	}
	return r, nil
}

// keyOf returns the mirror key of a row as text (mirror.Table.KeyOf).
func (t *table) keyOf(r row) (string, bool) { return t.mirror.KeyOf(r) }

// setColumns sets the columns of the table's rows.
func (t *table) setColumns(cols []column) {
	t.columns = cols
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.name
	}
	t.rel.Columns = names
}

// json renders a row as a JSON object: text values as strings (the
// warehouse converts them with each column's input function), json and
// jsonb values as JSON, NULL as null. Columns not sent are absent. A json
// value that jsonb refuses (a \u0000 escape, a lone surrogate, a number
// numeric cannot hold) becomes a string of its text, so that the object
// stays a valid jsonb without losing the value.
func (t *table) json(r row) []byte {
	if r == nil {
		return nil
	}
	return t.appendJSON(make([]byte, 0, 256), r)
}

// appendJSON appends r rendered as json renders it.
func (t *table) appendJSON(b []byte, r row) []byte {
	b = append(b, '{')
	first := true
	for _, c := range t.columns {
		v, ok := r[c.name]
		if !ok {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = pgjson.AppendString(b, c.name)
		b = append(b, ':')
		switch {
		case v == nil:
			b = append(b, "null"...)
		case c.oid == jsonbOID, c.oid == jsonOID && pgjson.JSONBTakes(*v):
			b = append(b, *v...)
		default:
			b = pgjson.AppendString(b, *v)
		}
	}
	return append(b, '}')
}
