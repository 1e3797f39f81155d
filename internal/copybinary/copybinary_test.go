package copybinary

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"io"
	"strings"
	"testing"
	"time"
)

// TestReaderStreamsRows: whatever the sizes of the reads and of the rows
// (none, small, larger than a chunk), the stream is the header, every row
// once and in order, then the trailer.
func TestReaderStreamsRows(t *testing.T) {
	big := strings.Repeat("x", 3*Chunk/2)
	for _, tc := range []struct {
		name string
		rows []string
		read int
	}{
		{"no rows", nil, 7},
		{"one row, reads of one byte", []string{"a"}, 1},
		{"rows across chunks", repeat("row-", 20000), 4096},
		{"a row larger than a chunk", []string{"a", big, "b", big}, 1000},
		{"reads larger than a chunk", append(repeat("r", 5000), big), 4 * Chunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(len(tc.rows), func(b []byte, i int) []byte {
				return Text(Fields(b, 1), tc.rows[i])
			})
			got := readAll(t, r, tc.read)
			want := []byte(header)
			for _, s := range tc.rows {
				want = Text(Fields(want, 1), s)
			}
			want = binary.BigEndian.AppendUint16(want, 0xffff)
			if !bytes.Equal(got, want) {
				t.Fatalf("stream of %d bytes, want %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
			}
		})
	}
}

// readAll reads r to its end, n bytes at a time.
func readAll(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	var out []byte
	p := make([]byte, n)
	for {
		k, err := r.Read(p)
		out = append(out, p[:k]...)
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			t.Fatal("a read of nothing without io.EOF")
		}
	}
}

func repeat(prefix string, n int) []string {
	rows := make([]string, n)
	for i := range rows {
		rows[i] = prefix + strings.Repeat("y", i%37)
	}
	return rows
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestFields: each field is its length and its value in the type's
// binary form, as PostgreSQL's send functions write it.
func TestFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{"null", Null(nil), "ffffffff"},
		{"text", Text(nil, "é"), "00000002c3a9"},
		{"int32", Int32(nil, -2), "00000004fffffffe"},
		{"int64", Int64(nil, 1), "000000080000000000000001"},
		{"timestamptz at the epoch", Time(nil, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)), "000000080000000000000000"},
		{"timestamptz, nanoseconds truncated", Time(nil, time.Date(2000, 1, 1, 1, 0, 0, 1999, time.FixedZone("x", 3600))), "000000080000000000000001"},
		{"timestamptz before the epoch", Time(nil, time.Date(1999, 12, 31, 23, 59, 59, 999999000, time.UTC)), "00000008ffffffffffffffff"},
		{"jsonb", JSONB(nil, []byte(`{}`)), "00000003017b7d"},
		{"jsonb nil", JSONB(nil, nil), "ffffffff"},
		{"pg_lsn", LSN(nil, 0x16B3748), "0000000800000000016b3748"},
		{"a field appended in place", func() []byte {
			b, at := Open([]byte{9})
			return Close(append(b, "abc"...), at)
		}(), "0900000003616263"},
	} {
		if got := hex.EncodeToString(tc.got); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
