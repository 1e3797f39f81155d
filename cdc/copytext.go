package cdc

import (
	"bytes"
	"sync"
	"time"
	"unicode/utf8"
)

// copyRows builds the data of a COPY … FROM STDIN in PostgreSQL's text
// format. pgoutput sends column values in their text output form, which
// is exactly what COPY's text format takes, so values pass through
// without conversion.
type copyRows struct {
	buf   bytes.Buffer
	first bool // the next field starts a row
	// times caches the text of the last two times written: a chunk's
	// rows share their transaction's commit time and the load time.
	times [2]struct {
		t    time.Time
		text []byte
	}
}

// copyRowsPool keeps the buffers of written chunks: a chunk's COPY data
// runs to megabytes, and growing a new buffer for each is most of the
// cost of building it.
var copyRowsPool = sync.Pool{New: func() any { return new(copyRows) }}

func newCopyRows() *copyRows {
	w := copyRowsPool.Get().(*copyRows)
	w.buf.Reset()
	w.first = true
	return w
}

// release returns w to the pool; w is not used afterwards.
func (w *copyRows) release() { copyRowsPool.Put(w) }

// sep writes the separator before a field.
func (w *copyRows) sep() {
	if !w.first {
		w.buf.WriteByte('\t')
	}
	w.first = false
}

// text writes a text field.
func (w *copyRows) text(s string) {
	w.sep()
	copyEscape(&w.buf, s)
}

// value writes a column value: NULL for nil.
func (w *copyRows) value(v value) {
	if v == nil {
		w.null()
		return
	}
	w.text(*v)
}

// null writes a NULL field.
func (w *copyRows) null() {
	w.sep()
	w.buf.WriteString(`\N`)
}

// bytes writes a field from bytes, NULL for nil.
func (w *copyRows) bytes(b []byte) {
	if b == nil {
		w.null()
		return
	}
	w.sep()
	copyEscape(&w.buf, b)
}

// time writes a timestamptz field.
func (w *copyRows) time(t time.Time) {
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

// textArray writes a text[] field, NULL when names is empty.
func (w *copyRows) textArray(names []string) {
	if len(names) == 0 {
		w.null()
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
	w.bytes(a.Bytes())
}

// end ends a row.
func (w *copyRows) end() {
	w.buf.WriteByte('\n')
	w.first = true
}

// copyEscape writes s escaped for COPY's text format.
func copyEscape[T string | []byte](buf *bytes.Buffer, s T) {
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

// appendJSONString appends s as a JSON string. It escapes what JSON
// requires and nothing more; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
