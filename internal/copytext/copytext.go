// Package copytext builds the data of a COPY … FROM STDIN in PostgreSQL's
// text format: fields separated by tabs, rows by newlines, \N for NULL,
// and backslash, tab, newline and carriage return escaped. Column values
// in their text output form pass through without conversion.
package copytext

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Rows is the data of one COPY, built field by field.
type Rows struct {
	buf   bytes.Buffer
	first bool // the next field starts a row
	// times caches the text of the last two times written: a chunk's
	// rows share their transaction's commit time and the load time.
	times [2]struct {
		t    time.Time
		text []byte
	}
	// lent is set when a COPY of the data failed: the connection's reader
	// of it may still be running, so the buffer is never reused.
	lent bool
}

// free keeps the Rows of finished COPYs for the next ones: a chunk's COPY
// data runs to megabytes, and growing a new buffer for each is most of the
// cost of building it. (A sync.Pool loses its buffers at every garbage
// collection, which a busy writer runs several times a second.) It keeps
// at most maxFree buffers of at most maxKept bytes each.
var free struct {
	sync.Mutex
	rows []*Rows
}

const (
	maxFree = 4
	maxKept = 16 << 20
)

// New returns empty Rows, reusing a released buffer when there is one.
func New() *Rows {
	free.Lock()
	var w *Rows
	if n := len(free.rows); n > 0 {
		w, free.rows = free.rows[n-1], free.rows[:n-1]
	}
	free.Unlock()
	if w == nil {
		w = new(Rows)
	}
	w.buf.Reset()
	w.first = true
	return w
}

// CopyFrom sends the rows as the data of sql, a COPY ... FROM STDIN, on
// conn. When it fails, pgconn may return before its goroutine that reads
// the data has stopped (a broken connection, an error from the server),
// so that goroutine may still read, and move, the buffer: w is then never
// reused, and Release lets it go.
func (w *Rows) CopyFrom(ctx context.Context, conn *pgconn.PgConn, sql string) (pgconn.CommandTag, error) {
	tag, err := conn.CopyFrom(ctx, &w.buf, sql)
	if err != nil {
		w.lent = true
	}
	return tag, err
}

// Release returns w for reuse; w is not used afterwards.
func (w *Rows) Release() {
	if w.lent || w.buf.Cap() > maxKept {
		return
	}
	free.Lock()
	if len(free.rows) < maxFree {
		free.rows = append(free.rows, w)
	}
	free.Unlock()
}

// Data is the COPY data written so far, to read without sending it (use
// CopyFrom to send it).
func (w *Rows) Data() *bytes.Buffer { return &w.buf }

// sep writes the separator before a field.
func (w *Rows) sep() {
	if !w.first {
		w.buf.WriteByte('\t')
	}
	w.first = false
}

// Text writes a text field.
func (w *Rows) Text(s string) {
	w.sep()
	escape(&w.buf, s)
}

// Value writes a column value: NULL for nil.
func (w *Rows) Value(v *string) {
	if v == nil {
		w.Null()
		return
	}
	w.Text(*v)
}

// Null writes a NULL field.
func (w *Rows) Null() {
	w.sep()
	w.buf.WriteString(`\N`)
}

// Bytes writes a field from bytes, NULL for nil.
func (w *Rows) Bytes(b []byte) {
	if b == nil {
		w.Null()
		return
	}
	w.sep()
	escape(&w.buf, b)
}

// Time writes a timestamptz field.
func (w *Rows) Time(t time.Time) {
	w.sep()
	for i := range w.times {
		if c := &w.times[i]; c.text != nil && c.t.Equal(t) {
			w.buf.Write(c.text)
			return
		}
	}
	w.times[1] = w.times[0]
	w.times[0].t = t
	w.times[0].text = t.UTC().AppendFormat(make([]byte, 0, 40), "2006-01-02 15:04:05.999999Z07:00")
	w.buf.Write(w.times[0].text)
}

// TextArray writes a text[] field, NULL when names is empty.
func (w *Rows) TextArray(names []string) {
	if len(names) == 0 {
		w.Null()
		return
	}
	var a bytes.Buffer
	a.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			a.WriteByte(',')
		}
		a.WriteByte('"')
		for _, r := range []byte(n) {
			if r == '"' || r == '\\' {
				a.WriteByte('\\')
			}
			a.WriteByte(r)
		}
		a.WriteByte('"')
	}
	a.WriteByte('}')
	w.Bytes(a.Bytes())
}

// End ends a row.
func (w *Rows) End() {
	w.buf.WriteByte('\n')
	w.first = true
}

// escape writes s escaped for COPY's text format.
func escape[T string | []byte](buf *bytes.Buffer, s T) {
	start := 0
	for i := 0; i < len(s); i++ {
		var esc string
		switch s[i] {
		case '\\':
			esc = `\\`
		case '\t':
			esc = `\t`
		case '\n':
			esc = `\n`
		case '\r':
			esc = `\r`
		default:
			continue
		}
		buf.Write([]byte(s[start:i]))
		buf.WriteString(esc)
		start = i + 1
	}
	buf.Write([]byte(s[start:]))
}
