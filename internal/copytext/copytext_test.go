package copytext

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

func TestCopyRows(t *testing.T) {
	s := func(v string) *string { return &v }
	w := New()
	defer w.Release()
	at := time.Date(2026, 10, 5, 9, 0, 0, 123456000, time.FixedZone("x", 3600))
	w.Text("a\tb\nc\\d\re")
	w.Value(nil)
	w.Value(s(`\N`))
	w.Time(at)
	w.Time(at.Add(time.Second))
	w.Time(at)
	w.TextArray([]string{`big`, `we"ird\`})
	w.TextArray(nil)
	w.End()
	want := `a\tb\nc\\d\re` + "\t" + `\N` + "\t" + `\\N` + "\t" +
		"2026-10-05 08:00:00.123456Z\t2026-10-05 08:00:01.123456Z\t2026-10-05 08:00:00.123456Z\t" +
		`{"big","we\\"ird\\\\"}` + "\t" + `\N` + "\n"
	if got := w.Data().String(); got != want {
		t.Errorf("COPY text\n got %q\nwant %q", got, want)
	}
}

// TestFailedCopyNotReused: the Rows of a COPY that succeeded are reused
// after Release; those of one that failed are not, since the connection's
// reader of the data may outlive the failed call and move the buffer
// under the next COPY that would reuse it.
func TestFailedCopyNotReused(t *testing.T) {
	ctx := context.Background()
	conn := pgtest.Conn(t, pgtest.NewDatabase(t))
	if _, err := conn.Exec(ctx, "CREATE TABLE t (n integer)"); err != nil {
		t.Fatal(err)
	}
	copyRows := func(text string) (*Rows, error) {
		w := New()
		w.Text(text)
		w.End()
		_, err := w.CopyFrom(ctx, conn.PgConn(), "COPY t (n) FROM STDIN")
		w.Release()
		return w, err
	}
	ok, err := copyRows("1")
	if err != nil {
		t.Fatal(err)
	}
	if again := New(); again != ok {
		t.Error("the Rows of a COPY that succeeded were not reused")
	} else {
		again.Release()
	}
	failed, err := copyRows("not a number")
	if err == nil {
		t.Fatal("a COPY of text into an integer column succeeded")
	}
	for range maxFree + 1 {
		w := New()
		defer w.Release()
		if w == failed {
			t.Fatal("the Rows of a failed COPY were reused")
		}
	}
}
