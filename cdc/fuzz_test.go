package cdc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
	"github.com/tidemark-dev/tidemark/mirror"
)

// fuzzColumns are the columns of the relation FuzzDecode decodes tuples
// with when its first message is not a relation message.
var fuzzColumns = []column{{name: "id", oid: 23, mod: -1}, {name: "name", oid: 25, mod: -1},
	{name: "doc", oid: jsonbOID, mod: -1}, {name: "note", oid: 1043, mod: 24}}

// FuzzDecode checks what tidemark decodes of pgoutput. Two messages are
// parsed from arbitrary bytes (in or out of a streamed transaction): a
// relation message, by parseMessage, whose columns then decode the tuples
// of the second, an insert, update or delete, which parseChange reads as
// the stream does. Property: nothing panics (a message that cannot be
// decoded is an error); parseChange reads exactly the bytes of its
// message's parts, and what pglogrepl reads of the same message, refusing
// only what pgoutput never sends (a column of another kind than n, u, t
// or b, an update's new tuple tagged other than N); decodeTuple fails exactly on a column count that does not match
// the relation and on a format other than text, null and unchanged TOAST,
// and otherwise keeps every sent value as it arrived, NULL as nil, and
// leaves unchanged TOAST values out; the row's JSON is valid JSON holding
// each sent column (text as the string, each byte of invalid UTF-8 as
// U+FFFD; a json value that jsonb refuses as a string of its text),
// whenever the json and jsonb values in it are; the key of a row is its
// one key value or a JSON array of its key values, so that two rows of
// valid UTF-8 have the same key exactly when their key values are equal;
// and a streamed transaction's buffer gives back what it was given, also
// after spilling it to a file.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, rel, msg []byte, inStream bool) {
		cols := fuzzColumns
		var relMsg *pglogrepl.RelationMessage
		if m, err := parseMessage(rel, inStream); err == nil {
			switch m := m.(type) {
			case *pglogrepl.RelationMessageV2:
				relMsg = &m.RelationMessage
			case *pglogrepl.RelationMessage:
				relMsg = m
			}
		}
		if relMsg != nil {
			info := newRelationInfo(relMsg)
			if info.ID != relMsg.RelationID || len(info.Columns) != len(relMsg.Columns) {
				t.Fatalf("relation info %+v of %+v", info, relMsg)
			}
			for i, c := range relMsg.Columns {
				if got := info.Columns[i]; got != (column{name: c.Name, oid: c.DataType, mod: c.TypeModifier}) {
					t.Fatalf("column %d: %+v of %+v", i, got, c)
				}
			}
			cols = info.Columns
		}
		if len(msg) == 0 || (msg[0] != 'I' && msg[0] != 'U' && msg[0] != 'D') {
			return
		}
		m, err := parseChange(msg, inStream)
		ref, refErr := parseMessage(msg, inStream)
		op, newT, oldT, xid, relID := refChange(ref)
		if err != nil {
			if refErr == nil && !irregular(msg, inStream, ref) {
				t.Fatalf("parseChange: %v; pglogrepl reads %+v", err, ref)
			}
			return
		}
		if enc := encodeChange(m, inStream, msg); !bytes.HasPrefix(msg, enc) {
			t.Fatalf("parseChange reads %+v, which is % x, from % x", m, enc, msg)
		}
		if refErr != nil {
			// pglogrepl refuses a message shorter than one with a
			// column would be, such as an insert into a table without
			// columns, which PostgreSQL allows.
			if len(msg) > 13 {
				t.Fatalf("parseChange reads %+v; pglogrepl: %v", m, refErr)
			}
			return
		}
		if m.op != op || m.rel != relID || (inStream && m.xid != xid) ||
			!bytes.Equal(m.newT, encodeTuple(newT)) || !bytes.Equal(m.oldT, encodeTuple(oldT)) {
			t.Fatalf("parseChange reads %+v; pglogrepl %+v", m, ref)
		}
		tab := fuzzTable(cols)
		c := change{op: op, table: tab}
		c.newRow = checkDecode(t, tab, cols, m.newT, newT)
		c.oldRow = checkDecode(t, tab, cols, m.oldT, oldT)
		tab.columns = cols
		for _, r := range []row{c.newRow, c.oldRow} {
			checkJSON(t, tab, r)
			checkKey(t, tab, r)
		}
		checkBuffer(t, c, relMsg)
	})
}

// fuzzTable is a table with the columns cols, keyed by its first column,
// or its first two when it has more than two.
func fuzzTable(cols []column) *table {
	m := &mirror.Table{Name: "fuzz"}
	for _, c := range cols {
		m.Columns = append(m.Columns, mirror.Column{Name: c.name, Type: "text"})
	}
	switch {
	case len(cols) > 2:
		m.Key = []string{cols[0].name, cols[1].name}
	case len(cols) > 0:
		m.Key = []string{cols[0].name}
	}
	return &table{relID: 1, name: "public.fuzz", columns: cols, mirror: m}
}

// refChange returns what pglogrepl read of an insert, update or delete.
func refChange(m pglogrepl.Message) (op string, newT, oldT *pglogrepl.TupleData, xid, rel uint32) {
	switch m := m.(type) {
	case *pglogrepl.InsertMessageV2:
		return opInsert, m.Tuple, nil, m.Xid, m.RelationID
	case *pglogrepl.UpdateMessageV2:
		return opUpdate, m.NewTuple, m.OldTuple, m.Xid, m.RelationID
	case *pglogrepl.DeleteMessageV2:
		return opDelete, nil, m.OldTuple, m.Xid, m.RelationID
	}
	return "", nil, nil, 0, 0
}

// encodeChange is the message m was read from (up to the end of its last
// tuple), the tag of its old tuple, K or O, taken from msg.
func encodeChange(m changeMessage, inStream bool, msg []byte) []byte {
	b := []byte{map[string]byte{opInsert: 'I', opUpdate: 'U', opDelete: 'D'}[m.op]}
	if inStream {
		b = binary.BigEndian.AppendUint32(b, m.xid)
	}
	b = binary.BigEndian.AppendUint32(b, m.rel)
	if m.oldT != nil {
		tag := byte('?')
		if len(msg) > len(b) && (msg[len(b)] == 'K' || msg[len(b)] == 'O') {
			tag = msg[len(b)]
		}
		b = append(append(b, tag), m.oldT...)
	}
	if m.newT != nil {
		b = append(append(b, 'N'), m.newT...)
	}
	return b
}

// encodeTuple is the TupleData td was read from, nil for none.
func encodeTuple(td *pglogrepl.TupleData) []byte {
	if td == nil {
		return nil
	}
	b := binary.BigEndian.AppendUint16(nil, td.ColumnNum)
	for _, c := range td.Columns {
		b = append(b, c.DataType)
		if c.DataType == pglogrepl.TupleDataTypeText || c.DataType == pglogrepl.TupleDataTypeBinary {
			b = binary.BigEndian.AppendUint32(b, uint32(len(c.Data)))
			b = append(b, c.Data...)
		}
	}
	return b
}

// irregular reports whether a message that pglogrepl read is one that
// parseChange refuses, and rightly: a column of a kind pgoutput does not
// send (pglogrepl reads it as holding no bytes), or an update whose new
// tuple is not tagged N (pglogrepl skips the tag unread).
func irregular(msg []byte, inStream bool, ref pglogrepl.Message) bool {
	_, newT, oldT, _, _ := refChange(ref)
	for _, td := range []*pglogrepl.TupleData{newT, oldT} {
		if td == nil {
			continue
		}
		for _, c := range td.Columns {
			if !strings.ContainsRune("nutb", rune(c.DataType)) {
				return true
			}
		}
	}
	if u, ok := ref.(*pglogrepl.UpdateMessageV2); ok && u.OldTuple != nil {
		at := 1 + 4 + 1 + len(encodeTuple(u.OldTuple))
		if inStream {
			at += 4
		}
		return at >= len(msg) || msg[at] != 'N'
	}
	return false
}

// checkDecode decodes the tuple raw and checks the row against what
// pglogrepl read of it, td.
func checkDecode(t *testing.T, tab *table, cols []column, raw []byte, td *pglogrepl.TupleData) row {
	t.Helper()
	r, err := tab.decodeTuple(cols, raw)
	if td == nil {
		if r != nil || err != nil {
			t.Fatalf("no tuple decodes to %v, %v", r, err)
		}
		return nil
	}
	wantErr := len(td.Columns) != len(cols)
	want := row{}
	for i, c := range td.Columns {
		if wantErr {
			break
		}
		switch c.DataType {
		case pglogrepl.TupleDataTypeNull:
			want[cols[i].name] = nil
		case pglogrepl.TupleDataTypeToast:
		case pglogrepl.TupleDataTypeText:
			v := string(c.Data)
			want[cols[i].name] = &v
		default:
			wantErr = true
		}
	}
	if wantErr {
		if err == nil {
			t.Fatalf("tuple %+v with columns %+v decodes without an error to %v", td, cols, r)
		}
		return nil
	}
	if err != nil {
		t.Fatalf("tuple %+v with columns %+v: %v", td, cols, err)
	}
	if !sameRow(r, want) {
		t.Fatalf("tuple %+v decodes to %v, want %v", td, show(r), show(want))
	}
	return r
}

// checkJSON checks the JSON of a row.
func checkJSON(t *testing.T, tab *table, r row) {
	t.Helper()
	b := tab.json(r)
	if r == nil {
		if b != nil {
			t.Fatalf("no row gives JSON %s", b)
		}
		return
	}
	want := map[string]any{}
	embedded := true
	for _, c := range tab.columns {
		v, ok := r[c.name]
		switch {
		case !ok:
		case v == nil:
			want[c.name] = nil
		case c.oid == jsonOID && !pgjson.JSONBTakes(*v):
			want[c.name] = replaceInvalid(*v)
		case c.oid == jsonOID || c.oid == jsonbOID:
			var x any
			if err := json.Unmarshal([]byte(*v), &x); err != nil {
				embedded = false
			}
			want[c.name] = x
		default:
			want[c.name] = replaceInvalid(*v)
		}
	}
	if !embedded {
		return // the warehouse rejects the row
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("row %v gives invalid JSON %q: %v", show(r), b, err)
	}
	wantKeys := map[string]any{}
	for k, v := range want {
		wantKeys[replaceInvalid(k)] = v
	}
	if !reflect.DeepEqual(got, wantKeys) {
		t.Fatalf("row %v gives JSON %s = %v, want %v", show(r), b, got, wantKeys)
	}
}

// checkKey checks the key of a row.
func checkKey(t *testing.T, tab *table, r row) {
	t.Helper()
	key, ok := tab.keyOf(r)
	var vals []string
	complete := len(tab.mirror.Key) > 0
	for _, k := range tab.mirror.Key {
		v, sent := r[k]
		if !sent || v == nil {
			complete = false
			break
		}
		vals = append(vals, *v)
	}
	if ok != complete {
		t.Fatalf("keyOf(%v) = %q, %v; want a key: %v", show(r), key, ok, complete)
	}
	if !ok {
		return
	}
	if len(vals) == 1 {
		if key != vals[0] {
			t.Fatalf("keyOf(%v) = %q, want %q", show(r), key, vals[0])
		}
		return
	}
	var back []string
	if err := json.Unmarshal([]byte(key), &back); err != nil {
		t.Fatalf("keyOf(%v) = %q is not a JSON array: %v", show(r), key, err)
	}
	// Decoding gives back the values (valid UTF-8 unchanged), so that
	// different values of valid UTF-8 have different keys.
	for i, v := range vals {
		vals[i] = replaceInvalid(v)
	}
	if !reflect.DeepEqual(back, vals) {
		t.Fatalf("keyOf(%v) = %q, want the values %q", show(r), key, vals)
	}
}

// checkBuffer passes the change, and the relation message when there is
// one, through a buffer in memory and one spilled to a file.
func checkBuffer(t *testing.T, c change, rel *pglogrepl.RelationMessage) {
	t.Helper()
	for _, limit := range []int{1 << 20, 0} {
		b := newBuffer(limit)
		if rel != nil {
			if err := b.relation(7, rel); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.add(7, c); err != nil {
			t.Fatal(err)
		}
		var got []entry
		if err := b.each(func(e entry) error { got = append(got, e); return nil }); err != nil {
			b.close()
			t.Fatalf("buffer (limit %d): %v", limit, err)
		}
		b.close()
		want := 1
		if rel != nil {
			want = 2
			if got[0].Relation == nil || !reflect.DeepEqual(newRelationInfo(got[0].Relation), newRelationInfo(rel)) ||
				got[0].Xid != 7 || got[0].Rel != rel.RelationID {
				t.Fatalf("buffer (limit %d) gives relation %+v, want %+v", limit, got[0].Relation, rel)
			}
		}
		if len(got) != want {
			t.Fatalf("buffer (limit %d) gives %d entries, want %d", limit, len(got), want)
		}
		e := got[len(got)-1]
		if e.Xid != 7 || e.Op != c.op || e.Rel != c.table.relID || !sameRow(e.New, c.newRow) || !sameRow(e.Old, c.oldRow) {
			t.Fatalf("buffer (limit %d) gives %+v new %v old %v, want op %s new %v old %v",
				limit, e, show(e.New), show(e.Old), c.op, show(c.newRow), show(c.oldRow))
		}
	}
}

// sameRow reports whether two rows hold the same columns and values. A
// row without columns equals no row: no key can be found in either.
func sameRow(a, b row) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	return maps.EqualFunc(a, b, func(x, y value) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) })
}

// replaceInvalid replaces each byte of s that is not part of valid UTF-8
// with U+FFFD, as pgjson.AppendString and encoding/json do (unlike
// strings.ToValidUTF8, which replaces a run of such bytes with one).
func replaceInvalid(s string) string { return string([]rune(s)) }

// show renders a row for a failure message.
func show(r row) string {
	if r == nil {
		return "<nil>"
	}
	parts := make([]string, 0, len(r))
	for k, v := range r {
		if v == nil {
			parts = append(parts, k+"=NULL")
		} else {
			parts = append(parts, k+"="+*v)
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
