package copytext

import (
	"context"
	"io"

	"github.com/jackc/pgx/v5/pgconn"
)

// readerChunk is how much COPY data a Reader encodes at a time.
const readerChunk = 1 << 20

// Reader is the COPY data of n rows, encoded as the server reads it, a
// chunk at a time, so that a COPY of many rows needs no buffer of its
// size: encode writes row i into w, ending it with End.
type Reader struct {
	w       *Rows
	n, next int
	encode  func(w *Rows, i int)
}

// NewReader returns the Reader of n rows that encode writes.
func NewReader(n int, encode func(w *Rows, i int)) *Reader {
	return &Reader{w: New(), n: n, encode: encode}
}

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if r.w.buf.Len() == 0 {
		if r.next == r.n {
			return 0, io.EOF
		}
		r.w.buf.Reset()
		for r.next < r.n && r.w.buf.Len() < readerChunk {
			r.encode(r.w, r.next)
			r.next++
		}
	}
	return r.w.buf.Read(p)
}

// CopyFrom sends the rows as the data of sql, a COPY ... FROM STDIN, on
// conn. As with Rows, a failed COPY's reader may still be read by pgconn,
// so it is never reused.
func (r *Reader) CopyFrom(ctx context.Context, conn *pgconn.PgConn, sql string) (pgconn.CommandTag, error) {
	tag, err := conn.CopyFrom(ctx, r, sql)
	if err != nil {
		r.w.lent = true
	}
	return tag, err
}

// Release returns the Reader's buffer for reuse; r is not used afterwards.
func (r *Reader) Release() { r.w.Release() }
