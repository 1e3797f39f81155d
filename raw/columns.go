package raw

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark-dev/tidemark/internal/copybinary"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// A Column is a column of a raw table that tidemark's writers fill: its
// name, the definition tidemark creates it with, and the OID of its type,
// which the binary COPY encoders write.
type Column struct {
	Name string
	Def  string
	OID  uint32
}

// Columns are the columns a raw table's writers fill, in the order they
// fill them. Every raw table also has load_xid, which takes its default.
type Columns []Column

// pgLSNOID is the OID of the type pg_lsn, which pgtype does not name.
const pgLSNOID = 3220

// EventColumns are the columns of the raw table of a Kafka source of
// events, which the ingester writes.
var EventColumns = Columns{
	{"event_id", `text COLLATE "C" NOT NULL`, pgtype.TextOID},
	{"event_time", "timestamptz NOT NULL", pgtype.TimestamptzOID},
	{"ingested_at", "timestamptz NOT NULL", pgtype.TimestamptzOID},
	{"payload", "jsonb NOT NULL", pgtype.JSONBOID},
	{"kafka_topic", "text", pgtype.TextOID},
	{"kafka_partition", "integer", pgtype.Int4OID},
	{"kafka_offset", "bigint", pgtype.Int8OID},
}

// ChangeColumns are the columns of the raw table of a source of row
// changes (poll, CDC and Debezium sources; see createChangeTableSQL).
var ChangeColumns = Columns{
	{"event_id", `text COLLATE "C" NOT NULL`, pgtype.TextOID},
	{"event_time", "timestamptz NOT NULL", pgtype.TimestamptzOID},
	{"ingested_at", "timestamptz NOT NULL", pgtype.TimestamptzOID},
	{"op", "text NOT NULL CHECK (op IN ('insert', 'update', 'delete', 'truncate', 'snapshot'))", pgtype.TextOID},
	{"source_table", "text NOT NULL", pgtype.TextOID},
	{"payload", "jsonb NOT NULL", pgtype.JSONBOID},
	{"row_key", "text", pgtype.TextOID},
	{"old_row", "jsonb", pgtype.JSONBOID},
	{"commit_lsn", "pg_lsn", pgLSNOID},
}

// Names are the columns' names.
func (c Columns) Names() []string {
	n := make([]string, len(c))
	for i, col := range c {
		n[i] = col.Name
	}
	return n
}

// OIDs are the OIDs of the columns' types.
func (c Columns) OIDs() []uint32 {
	o := make([]uint32, len(c))
	for i, col := range c {
		o[i] = col.OID
	}
	return o
}

// List is the columns' names, quoted and joined with commas, for the
// column list of an INSERT or a COPY.
func (c Columns) List() string { return pgquote.Idents(c.Names()) }

// Without is c without the named columns, for a writer that leaves them
// NULL.
func (c Columns) Without(names ...string) Columns {
	return slices.DeleteFunc(slices.Clone(c), func(col Column) bool { return slices.Contains(names, col.Name) })
}

// CopySQL is the COPY of the columns into table (quoted) from the
// client: in binary, when binary, as the encoders of package copybinary
// write it, else as text.
func (c Columns) CopySQL(table string, binary bool) string {
	s := "COPY " + table + " (" + c.List() + ") FROM STDIN"
	if binary {
		s += " (FORMAT binary)"
	}
	return s
}

// InsertSQL is an INSERT of one row of the columns into table (quoted),
// its values the parameters $1 to $n, each cast to the column's type
// from text when the column is not text, timestamptz or an integer.
func (c Columns) InsertSQL(table string) string {
	params := make([]string, len(c))
	for i, col := range c {
		params[i] = fmt.Sprintf("$%d", i+1)
		switch col.OID {
		case pgtype.JSONBOID:
			params[i] += "::text::jsonb"
		case pgLSNOID:
			params[i] += "::text::pg_lsn"
		}
	}
	return "INSERT INTO " + table + " (" + c.List() + ")\nVALUES (" + strings.Join(params, ", ") + ")"
}

// BinaryCopyFits reports whether table (quoted) has the columns with the
// types tidemark creates them with, so that CopySQL(table, true) with the
// copybinary encoders writes it. A raw table made some other way is
// written as text, or through pgx's CopyFrom, which encodes for whatever
// types it has.
func (c Columns) BinaryCopyFits(ctx context.Context, q copybinary.Querier, table string) (bool, error) {
	return copybinary.TypesMatch(ctx, q, table, c.Names(), c.OIDs())
}

// define is the columns' part of a CREATE TABLE.
func (c Columns) define() string {
	var b strings.Builder
	for _, col := range c {
		fmt.Fprintf(&b, "    %-15s %s,\n", col.Name, col.Def)
	}
	return b.String()
}
