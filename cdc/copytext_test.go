package cdc

import (
	"encoding/json"
	"testing"
	"time"
)

func TestCopyRows(t *testing.T) {
	s := func(v string) value { return &v }
	w := newCopyRows()
	defer w.release()
	at := time.Date(2026, 10, 5, 9, 0, 0, 123456000, time.FixedZone("x", 3600))
	w.text("a\tb\nc\\d\re")
	w.value(nil)
	w.value(s(`\N`))
	w.time(at)
	w.time(at.Add(time.Second))
	w.time(at)
	w.textArray([]string{`big`, `we"ird\`})
	w.textArray(nil)
	w.end()
	want := `a\tb\nc\\d\re` + "\t" + `\N` + "\t" + `\\N` + "\t" +
		"2026-10-05 08:00:00.123456Z\t2026-10-05 08:00:01.123456Z\t2026-10-05 08:00:00.123456Z\t" +
		`{"big","we\\"ird\\\\"}` + "\t" + `\N` + "\n"
	if got := w.buf.String(); got != want {
		t.Errorf("COPY text\n got %q\nwant %q", got, want)
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, in := range []string{"", "plain", `q"uote`, `back\slash`, "tab\tnl\ncr\r", "\x01\x1f", "héllo ✓", "bad\xffutf8", "cut\xe3\x86short", "<&>"} {
		b := appendJSONString(nil, in)
		var out string
		if err := json.Unmarshal(b, &out); err != nil {
			t.Errorf("%q: %s is not JSON: %v", in, b, err)
			continue
		}
		want := string([]rune(in)) // each invalid byte as U+FFFD
		if out != want {
			t.Errorf("%q: round trip gives %q, want %q", in, out, want)
		}
	}
}
