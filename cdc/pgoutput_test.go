package cdc

import "testing"

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
