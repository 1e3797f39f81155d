package cdc

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark-dev/tidemark/internal/copybinary"
	"github.com/tidemark-dev/tidemark/internal/copytext"
	"github.com/tidemark-dev/tidemark/raw"
)

// writeRaw writes one raw change row per change with COPY.
func (a *applier) writeRaw(ctx context.Context, g *group, changes []change) error {
	var err error
	if a.rawBinary {
		_, err = g.tx.Conn().PgConn().CopyFrom(ctx, rawRows(g, changes), raw.ChangeColumns.CopySQL(a.raw.Ident(), true))
	} else {
		w := rawText(g, changes)
		defer w.Release()
		_, err = w.CopyFrom(ctx, g.tx.Conn().PgConn(), raw.ChangeColumns.CopySQL(a.raw.Ident(), false))
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", a.raw.Ident(), err)
	}
	return nil
}

// rawRows encodes the change rows of changes in binary, as the server
// reads them. A row's payload is the row after the change, or what the
// source sent of the old row, or {}; old_row the old row or key sent.
func rawRows(g *group, changes []change) *copybinary.Reader {
	at := copybinary.Micros(g.ingestedAt)
	var (
		lsn     pglogrepl.LSN
		lsnText string
	)
	jsonb := func(b []byte, t *table, r row) []byte {
		b, f := copybinary.OpenJSONB(b)
		return copybinary.Close(t.appendJSON(b, r), f)
	}
	return copybinary.NewReader(len(changes), func(b []byte, i int) []byte {
		c := &changes[i]
		if lsnText == "" || c.commitLSN != lsn {
			lsn, lsnText = c.commitLSN, c.commitLSN.String()
		}
		b = copybinary.Fields(b, len(raw.ChangeColumns))
		b, f := copybinary.Open(b)
		b = append(append(b, lsnText...), '/')
		b = copybinary.Close(strconv.AppendInt(b, int64(c.seq), 10), f)
		b = copybinary.Time(b, c.commitTime)
		b = copybinary.Int64(b, at)
		b = copybinary.Text(b, c.op)
		b = copybinary.Text(b, c.table.name)
		r := c.newRow
		if r == nil {
			r = c.oldRow
		}
		if r != nil {
			b = jsonb(b, c.table, r)
		} else {
			b = copybinary.JSONB(b, []byte("{}"))
		}
		if k, ok := c.table.keyOf(r); ok {
			b = copybinary.Text(b, k)
		} else {
			b = copybinary.Null(b)
		}
		if c.oldRow != nil {
			b = jsonb(b, c.table, c.oldRow)
		} else {
			b = copybinary.Null(b)
		}
		return copybinary.LSN(b, uint64(c.commitLSN))
	})
}

// rawText encodes the change rows of changes as COPY text, with the
// values rawRows encodes.
func rawText(g *group, changes []change) *copytext.Rows {
	w := copytext.New()
	var (
		lsn     pglogrepl.LSN
		lsnText string
	)
	for i := range changes {
		c := &changes[i]
		if lsnText == "" || c.commitLSN != lsn {
			lsn, lsnText = c.commitLSN, c.commitLSN.String()
		}
		payload, old := c.table.json(c.newRow), c.table.json(c.oldRow)
		if payload == nil {
			payload = old
		}
		if payload == nil {
			payload = []byte("{}")
		}
		w.Text(lsnText + "/" + strconv.Itoa(c.seq))
		w.Time(c.commitTime)
		w.Time(g.ingestedAt)
		w.Text(c.op)
		w.Text(c.table.name)
		w.Bytes(payload)
		r := c.newRow
		if r == nil {
			r = c.oldRow
		}
		if k, ok := c.table.keyOf(r); ok {
			w.Text(k)
		} else {
			w.Null()
		}
		w.Bytes(old)
		w.Text(lsnText)
		w.End()
	}
	return w
}
