package copytext

import (
	"testing"
	"time"
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
