package kafka

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/copybinary"
	"github.com/tidemark-dev/tidemark/raw"
)

// rawTypesMatch reports whether the raw table of src has the column types
// newRawCopy encodes (raw.EventColumns). A raw table made some other way
// (created beforehand with other types) is written through pgx's
// CopyFrom, which encodes for whatever types the columns have.
func rawTypesMatch(ctx context.Context, tx pgx.Tx, src *source) (bool, error) {
	return raw.EventColumns.BinaryCopyFits(ctx, tx, src.raw.Ident())
}

// newRawCopy is the binary COPY stream of rows into a raw table, encoded
// as PostgreSQL reads it and as pgx would encode the same values (times
// to the microsecond, truncated; jsonb as version 1 and the JSON text).
// Rows are encoded as the server asks for them, without the per-value
// type lookups and boxing of pgx's CopyFrom (half of the ingester's CPU
// for writing rows).
func newRawCopy(rows []*row, ingestedAt time.Time) *copybinary.Reader {
	at := copybinary.Micros(ingestedAt)
	return copybinary.NewReader(len(rows), func(b []byte, i int) []byte {
		r := rows[i]
		b = copybinary.Fields(b, len(raw.EventColumns))
		b = copybinary.Text(b, r.ev.ID)
		b = copybinary.Time(b, r.ev.Time)
		b = copybinary.Int64(b, at)
		b = copybinary.JSONB(b, r.ev.Payload) // NULL for nil, as pgx sends a nil []byte
		b = copybinary.Text(b, r.rec.Topic)
		b = copybinary.Int32(b, r.rec.Partition)
		return copybinary.Int64(b, r.rec.Offset)
	})
}
