package cdc

import (
	"reflect"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark-dev/tidemark/mirror"
)

// TestBufferKeepsWhatWasSent: a streamed transaction's items read back
// the same from memory and from the spill file: NULLs stay NULL, a column
// not sent (an unchanged TOASTed value) stays absent, relation messages
// keep their place and columns, and a rolled-back subtransaction's items
// are dropped.
func TestBufferKeepsWhatWasSent(t *testing.T) {
	tb := &table{relID: 7, name: "public.t", columns: []column{{name: "id", oid: 20}, {name: "note", oid: 25}, {name: "big", oid: 25}}, mirror: &mirror.Table{Key: []string{"id"}}}
	str := func(s string) *string { return &s }
	rel := &pglogrepl.RelationMessage{RelationID: 7, Namespace: "public", RelationName: "t", Columns: []*pglogrepl.RelationMessageColumn{
		{Name: "id", DataType: 20, TypeModifier: -1}, {Name: "note", DataType: 25, TypeModifier: -1}, {Name: "big", DataType: 25, TypeModifier: -1}, {Name: "extra", DataType: 1700, TypeModifier: 786438}}}
	changes := []change{
		{op: opInsert, table: tb, newRow: row{"id": str("1"), "note": nil, "big": str("x")}},
		{op: opUpdate, table: tb, newRow: row{"id": str("1"), "note": str("")}, oldRow: row{"id": str("1")}},
		{op: opDelete, table: tb, oldRow: row{"id": str("2")}},
	}
	want := []entry{
		{Xid: 10, Op: opInsert, Rel: 7, New: changes[0].newRow},
		{Xid: 10, Rel: 7, Relation: rel},
		{Xid: 10, Op: opUpdate, Rel: 7, New: changes[1].newRow, Old: changes[1].oldRow},
		{Xid: 12, Op: opDelete, Rel: 7, Old: changes[2].oldRow},
	}
	for _, tc := range []struct {
		name  string
		limit int
	}{{"memory", 1 << 20}, {"spilled at once", 0}, {"spilled later", 200}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBuffer(tc.limit)
			defer b.close()
			if err := b.add(10, changes[0]); err != nil {
				t.Fatal(err)
			}
			if err := b.relation(10, rel); err != nil {
				t.Fatal(err)
			}
			if got := b.columns(7, tb); len(got) != 4 || got[3] != (column{name: "extra", oid: 1700, mod: 786438}) {
				t.Errorf("columns after the transaction's relation message: %v", got)
			}
			if got := b.columns(8, tb); !reflect.DeepEqual(got, tb.columns) {
				t.Errorf("columns of a relation the transaction did not describe: %v, want the table's", got)
			}
			for i, c := range changes[1:] {
				if err := b.add(10+uint32(i)*2, c); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.add(11, change{op: opInsert, table: tb, newRow: row{"id": str("3")}}); err != nil {
				t.Fatal(err)
			}
			b.abort(11)
			var got []entry
			if err := b.each(func(e entry) error { got = append(got, e); return nil }); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("read back:\n%+v\nwant\n%+v", got, want)
			}
			if (b.file != nil) != (tc.limit < 1<<20) {
				t.Errorf("spilled: %v, want %v", b.file != nil, tc.limit < 1<<20)
			}
		})
	}
}
