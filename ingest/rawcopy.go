package ingest

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark-dev/tidemark/mirror"
)

// rawColumnTypes are the types rawColumns have in a raw table tidemark
// created, in the same order; rawCopy encodes exactly these.
var rawColumnTypes = []uint32{pgtype.TextOID, pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.JSONBOID,
	pgtype.TextOID, pgtype.Int4OID, pgtype.Int8OID}

// columnTypesSQL returns the type of each column named in $2 of table $1,
// in the order given (0 for a column the table lacks).
const columnTypesSQL = `
SELECT coalesce(a.atttypid, 0)::int8
FROM unnest($2::text[]) WITH ORDINALITY AS c (name, n)
LEFT JOIN pg_attribute a ON a.attrelid = $1::regclass AND a.attname = c.name AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.n`

// copyRawSQL is the COPY of rawColumns in binary format; %s is the quoted
// raw table.
var copyRawSQL = "COPY %s (" + mirror.QuoteAll(rawColumns) + ") FROM STDIN (FORMAT binary)"

// rawTypesMatch reports whether the raw table of src has the column types
// rawCopy encodes. A raw table made some other way (created beforehand
// with other types) is written through pgx's CopyFrom, which encodes for
// whatever types the columns have.
func rawTypesMatch(ctx context.Context, tx pgx.Tx, src *source) (bool, error) {
	rows, err := tx.Query(ctx, columnTypesSQL, src.raw.Ident(), rawColumns)
	if err != nil {
		return false, fmt.Errorf("column types of %s: %w", src.raw.Ident(), err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return false, fmt.Errorf("column types of %s: %w", src.raw.Ident(), err)
	}
	return slices.EqualFunc(got, rawColumnTypes, func(g int64, w uint32) bool { return g == int64(w) }), nil
}

// rawCopy is the binary COPY stream of rows into a raw table, encoded as
// PostgreSQL reads it and as pgx would encode the same values (times to
// the microsecond, truncated; jsonb as version 1 and the JSON text). It
// is an io.Reader for pgconn's CopyFrom, which reads it from the goroutine
// that writes to the server: rows are encoded as the server asks for
// them, without the per-value type lookups and boxing of pgx's CopyFrom
// (half of the ingester's CPU for writing rows).
type rawCopy struct {
	rows       []*row
	ingestedAt int64 // microseconds since 2000-01-01 UTC
	next       int   // the next row to encode
	buf        []byte
	off        int // how much of buf was read
	trailer    bool
}

// copyHeader starts a binary COPY stream: the signature, no flags and no
// header extension.
const copyHeader = "PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00"

// copyChunk is how many bytes rawCopy encodes at a time.
const copyChunk = 64 << 10

func newRawCopy(rows []*row, ingestedAt time.Time) *rawCopy {
	c := &rawCopy{rows: rows, ingestedAt: pgMicros(ingestedAt), buf: make([]byte, 0, copyChunk+4096)}
	c.buf = append(c.buf, copyHeader...)
	return c
}

// Read fills p from the encoded rows, encoding more as needed.
func (c *rawCopy) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if c.off == len(c.buf) {
			if !c.fill() {
				break
			}
		}
		k := copy(p[n:], c.buf[c.off:])
		c.off += k
		n += k
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// fill encodes the next chunk of rows, or the trailer after the last; it
// returns false when everything was encoded and read.
func (c *rawCopy) fill() bool {
	c.buf, c.off = c.buf[:0], 0
	for c.next < len(c.rows) && len(c.buf) < copyChunk {
		c.buf = c.appendRow(c.buf, c.rows[c.next])
		c.next++
	}
	if c.next == len(c.rows) && !c.trailer && len(c.buf) < copyChunk {
		c.buf = binary.BigEndian.AppendUint16(c.buf, 0xffff) // -1: no more tuples
		c.trailer = true
	}
	return len(c.buf) > 0
}

func (c *rawCopy) appendRow(b []byte, r *row) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(rawColumns)))
	b = appendText(b, r.ev.ID)
	b = appendInt64(b, pgMicros(r.ev.Time))
	b = appendInt64(b, c.ingestedAt)
	if r.ev.Payload == nil {
		b = binary.BigEndian.AppendUint32(b, 0xffffffff) // NULL, as pgx sends a nil []byte
	} else {
		b = binary.BigEndian.AppendUint32(b, uint32(1+len(r.ev.Payload)))
		b = append(b, 1) // jsonb's binary format version
		b = append(b, r.ev.Payload...)
	}
	b = appendText(b, r.rec.Topic)
	b = binary.BigEndian.AppendUint32(b, 4)
	b = binary.BigEndian.AppendUint32(b, uint32(r.rec.Partition))
	return appendInt64(b, r.rec.Offset)
}

func appendText(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func appendInt64(b []byte, v int64) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, uint64(v))
}

// pgEpochMicros is 2000-01-01 UTC, PostgreSQL's epoch, in Unix
// microseconds.
const pgEpochMicros = 946_684_800 * 1_000_000

// pgMicros is t as a timestamptz's binary value: microseconds since
// PostgreSQL's epoch, the nanoseconds truncated as pgx does.
func pgMicros(t time.Time) int64 {
	return t.Unix()*1_000_000 + int64(t.Nanosecond())/1000 - pgEpochMicros
}
