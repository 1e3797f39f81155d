package copytext

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestReader: a Reader's data is that of the same rows built whole, in
// chunks of about readerChunk, for rows smaller and larger than a chunk.
func TestReader(t *testing.T) {
	for _, tc := range []struct {
		name string
		rows int
		size int
	}{
		{"no rows", 0, 10},
		{"small rows over several chunks", 50_000, 100},
		{"rows larger than a chunk", 3, 3 * readerChunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row := func(w *Rows, i int) {
				w.Text(fmt.Sprint(i))
				w.Text(strings.Repeat("a\tb\\", tc.size/4))
				w.Null()
				w.End()
			}
			whole := New()
			for i := range tc.rows {
				row(whole, i)
			}
			r := NewReader(tc.rows, row)
			var got bytes.Buffer
			buf := make([]byte, 64<<10)
			for {
				n, err := r.Read(buf)
				got.Write(buf[:n])
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if r.w.buf.Cap() > 2*readerChunk+tc.size*2 {
					t.Fatalf("the reader's buffer holds %d bytes", r.w.buf.Cap())
				}
			}
			if !bytes.Equal(got.Bytes(), whole.Data().Bytes()) {
				t.Errorf("the reader's data (%d bytes) differs from the rows' (%d bytes)", got.Len(), whole.Data().Len())
			}
		})
	}
}
