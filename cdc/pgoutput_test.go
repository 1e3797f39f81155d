package cdc

import (
	"errors"
	"testing"
)

// TestParseChange: inserts, updates and deletes are read part by part,
// and every count and length is checked against the message; a message
// that declares more than it holds is an error (pglogrepl would allocate
// what it declares, up to 4 GiB a value, which lengthsFit refuses).
func TestParseChange(t *testing.T) {
	const rel = "\x00\x00\x40\x00"
	tuple := "\x00\x02t\x00\x00\x00\x0242n"
	huge := "\x00\x01t\xff\xff\xff\xf0"
	for _, tc := range []struct {
		name     string
		msg      string
		inStream bool
		want     changeMessage
		err      bool
	}{
		{name: "insert", msg: "I" + rel + "N" + tuple, want: changeMessage{op: opInsert, rel: 0x4000, newT: []byte(tuple)}},
		{name: "insert in a stream", msg: "I\x00\x00\x00\x07" + rel + "N" + tuple, inStream: true,
			want: changeMessage{op: opInsert, xid: 7, rel: 0x4000, newT: []byte(tuple)}},
		{name: "update", msg: "U" + rel + "N" + tuple, want: changeMessage{op: opUpdate, rel: 0x4000, newT: []byte(tuple)}},
		{name: "update of a key", msg: "U" + rel + "K\x00\x01u" + "N" + tuple,
			want: changeMessage{op: opUpdate, rel: 0x4000, oldT: []byte("\x00\x01u"), newT: []byte(tuple)}},
		{name: "delete", msg: "D" + rel + "O" + tuple, want: changeMessage{op: opDelete, rel: 0x4000, oldT: []byte(tuple)}},
		{name: "empty tuple", msg: "I" + rel + "N\x00\x00", want: changeMessage{op: opInsert, rel: 0x4000, newT: []byte("\x00\x00")}},
		{name: "insert with an old tuple", msg: "I" + rel + "K" + tuple, err: true},
		{name: "delete without an old tuple", msg: "D" + rel + "N" + tuple, err: true},
		{name: "update's new tuple not tagged N", msg: "U" + rel + "K\x00\x00" + "x" + tuple, err: true},
		{name: "update without its new tuple", msg: "U" + rel + "K\x00\x00", err: true},
		{name: "no relation", msg: "I\x00\x00", err: true},
		{name: "no xid in a stream", msg: "I\x00\x00", inStream: true, err: true},
		{name: "a column of an unknown kind", msg: "I" + rel + "N\x00\x01x", err: true},
		{name: "fewer columns than counted", msg: "I" + rel + "N\x00\x03n", err: true},
		{name: "a value longer than the message", msg: "I" + rel + "N" + huge + "ab", err: true},
		{name: "a length cut short", msg: "I" + rel + "N\x00\x01t\x00\x00", err: true},
		{name: "a new tuple's value longer than the message", msg: "U" + rel + "K\x00\x00" + "N" + huge, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseChange([]byte(tc.msg), tc.inStream)
			if tc.err {
				if !errors.Is(err, errMalformed) {
					t.Fatalf("parseChange = %+v, %v; want a malformed message", got, err)
				}
				return
			}
			if err != nil || got.op != tc.want.op || got.xid != tc.want.xid || got.rel != tc.want.rel ||
				string(got.newT) != string(tc.want.newT) || string(got.oldT) != string(tc.want.oldT) ||
				(got.newT == nil) != (tc.want.newT == nil) || (got.oldT == nil) != (tc.want.oldT == nil) {
				t.Fatalf("parseChange = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestLengthsFit: a message whose counts or lengths run past its end is
// refused before pglogrepl allocates them, also in an update's new tuple
// behind a tag that pglogrepl skips unread.
func TestLengthsFit(t *testing.T) {
	const rel = "\x00\x00\x40\x00"
	huge := "\x00\x01t\xff\xff\xff\xf0"
	for _, tc := range []struct {
		name string
		msg  string
		want bool
	}{
		{"insert", "I" + rel + "N\x00\x01t\x00\x00\x00\x0142", true},
		{"insert, a value past the end", "I" + rel + "N" + huge, false},
		{"update, the new tuple's value past the end", "U" + rel + "K\x00\x00N" + huge, false},
		{"update, behind a tag other than N", "U" + rel + "K\x00\x00x" + huge, false},
		{"delete, the old tuple's value past the end", "D" + rel + "O" + huge, false},
		{"truncate of more relations than sent", "T\x00\x00\x10\x00\x00\x00\x00\x00\x01", false},
		{"truncate", "T\x00\x00\x00\x01\x00\x00\x00\x00\x01", true},
	} {
		if got := lengthsFit([]byte(tc.msg), false); got != tc.want {
			t.Errorf("%s: lengthsFit = %v, want %v", tc.name, got, tc.want)
		}
	}
}
