// Package copybinary encodes the data of a COPY … FROM STDIN (FORMAT
// binary) for tables whose column types are known: a header, then per row
// its field count and each field as a length and the value in the type's
// binary form, then a trailer. The server reads such rows without parsing
// text (times, numbers, escapes), which makes a COPY of many rows
// markedly cheaper for it than the text format.
//
// A Reader encodes rows as the server asks for them, a chunk at a time,
// so that a large COPY needs no buffer of its own size.
package copybinary

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// header starts a binary COPY stream: the signature, no flags and no
// header extension.
const header = "PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00"

// Chunk is how many bytes a Reader encodes at a time.
const Chunk = 64 << 10

// Reader is the binary COPY stream of n rows, each encoded by a function
// when the server asks for it. It is an io.Reader for pgconn's CopyFrom,
// which reads it from the goroutine that writes to the server.
type Reader struct {
	n       int
	encode  func(b []byte, i int) []byte
	next    int // the next row to encode
	buf     []byte
	off     int // how much of buf was read
	trailer bool
}

// NewReader returns the stream of n rows: encode appends row i to b,
// starting with Fields, and returns the extended slice.
func NewReader(n int, encode func(b []byte, i int) []byte) *Reader {
	r := &Reader{n: n, encode: encode, buf: make([]byte, 0, Chunk+4096)}
	r.buf = append(r.buf, header...)
	return r
}

// Read fills p from the encoded rows, encoding more as needed.
func (r *Reader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if r.off == len(r.buf) {
			if !r.fill() {
				break
			}
		}
		k := copy(p[n:], r.buf[r.off:])
		r.off += k
		n += k
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// fill encodes the next chunk of rows, or the trailer after the last; it
// returns false when everything was encoded and read.
func (r *Reader) fill() bool {
	r.buf, r.off = r.buf[:0], 0
	for r.next < r.n && len(r.buf) < Chunk {
		r.buf = r.encode(r.buf, r.next)
		r.next++
	}
	if r.next == r.n && !r.trailer && len(r.buf) < Chunk {
		r.buf = binary.BigEndian.AppendUint16(r.buf, 0xffff) // -1: no more tuples
		r.trailer = true
	}
	return len(r.buf) > 0
}

// Fields starts a row of n fields.
func Fields(b []byte, n int) []byte { return binary.BigEndian.AppendUint16(b, uint16(n)) }

// Null appends a NULL field.
func Null(b []byte) []byte { return binary.BigEndian.AppendUint32(b, 0xffffffff) }

// Text appends a text field.
func Text(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// Open starts a field whose value the caller appends to the returned
// slice; Close, given the returned offset, then sets the field's length.
func Open(b []byte) ([]byte, int) { return append(b, 0, 0, 0, 0), len(b) }

// Close ends the field Open started at offset at.
func Close(b []byte, at int) []byte {
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b
}

// Int32 appends an integer field.
func Int32(b []byte, v int32) []byte {
	b = binary.BigEndian.AppendUint32(b, 4)
	return binary.BigEndian.AppendUint32(b, uint32(v))
}

// Int64 appends a bigint field.
func Int64(b []byte, v int64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, uint64(v))
}

// Time appends a timestamptz field: microseconds since PostgreSQL's epoch,
// the nanoseconds truncated as pgx does.
func Time(b []byte, t time.Time) []byte { return Int64(b, Micros(t)) }

// JSONB appends a jsonb field holding JSON text, NULL for nil.
func JSONB(b []byte, json []byte) []byte {
	if json == nil {
		return Null(b)
	}
	b, at := OpenJSONB(b)
	return Close(append(b, json...), at)
}

// OpenJSONB starts a jsonb field whose JSON text the caller appends to
// the returned slice, to be ended with Close.
func OpenJSONB(b []byte) ([]byte, int) {
	b, at := Open(b)
	return append(b, 1), at // jsonb's binary format version
}

// LSN appends a pg_lsn field.
func LSN(b []byte, lsn uint64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, lsn)
}

// epochMicros is 2000-01-01 UTC, PostgreSQL's epoch, in Unix
// microseconds.
const epochMicros = 946_684_800 * 1_000_000

// Micros is t as a timestamptz's binary value: microseconds since
// PostgreSQL's epoch, the nanoseconds truncated as pgx does.
func Micros(t time.Time) int64 {
	return t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - epochMicros
}

// columnTypesSQL returns the type of each column named in $2 of table $1,
// in the order given (0 for a column the table lacks).
const columnTypesSQL = `
SELECT coalesce(a.atttypid, 0)::int8
FROM unnest($2::text[]) WITH ORDINALITY AS c (name, n)
LEFT JOIN pg_attribute a ON a.attrelid = $1::regclass AND a.attname = c.name AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.n`

// Querier runs a query: a connection, a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// TypesMatch reports whether the columns of table (quoted) have exactly
// the types (OIDs) an encoder writes: a table made some other way, say
// created beforehand with other types, needs another encoding.
func TypesMatch(ctx context.Context, q Querier, table string, columns []string, types []uint32) (bool, error) {
	rows, err := q.Query(ctx, columnTypesSQL, table, columns)
	if err != nil {
		return false, fmt.Errorf("column types of %s: %w", table, err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return false, fmt.Errorf("column types of %s: %w", table, err)
	}
	return slices.EqualFunc(got, types, func(g int64, w uint32) bool { return g == int64(w) }), nil
}
