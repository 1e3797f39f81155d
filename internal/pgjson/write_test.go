package pgjson_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/pgjson"
)

func TestAppendString(t *testing.T) {
	for _, in := range []string{"", "plain", `q"uote`, `back\slash`, "tab\tnl\ncr\r", "\x01\x1f", "héllo ✓", "bad\xffutf8", "cut\xe3\x86short", "<&>", "\x00", "end\xf0"} {
		b := pgjson.AppendString([]byte("prefix "), in)
		if string(b[:7]) != "prefix " {
			t.Errorf("%q: the prefix was overwritten: %s", in, b)
			continue
		}
		var out string
		if err := json.Unmarshal(b[7:], &out); err != nil {
			t.Errorf("%q: %s is not JSON: %v", in, b[7:], err)
			continue
		}
		want := string([]rune(in)) // each invalid byte as U+FFFD
		if out != want {
			t.Errorf("%q: round trip gives %q, want %q", in, out, want)
		}
	}
	// Only what JSON requires is escaped, so valid text passes as it is.
	if got, want := string(pgjson.AppendString(nil, "<&> héllo ✓ /")), `"<&> héllo ✓ /"`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestAppendText: text jsonb can store is written as AppendString writes
// it; invalid UTF-8 and U+0000 are refused, wherever they stand.
func TestAppendText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"", nil}, {"plain", nil}, {"tab\tnl\n\x01", nil}, {"héllo ✓", nil}, {`q"uote\`, nil},
		{"bad\xffutf8", pgjson.ErrInvalidUTF8}, {"cut\xe3\x86", pgjson.ErrInvalidUTF8}, {"\xf0", pgjson.ErrInvalidUTF8},
		{"\x00", pgjson.ErrNUL}, {"a\x00b", pgjson.ErrNUL}, {"ü\x00", pgjson.ErrNUL},
	} {
		got, err := pgjson.AppendText([]byte("p"), tc.in)
		if !errors.Is(err, tc.want) || (tc.want != nil) != (err != nil) {
			t.Errorf("%q: error %v, want %v", tc.in, err, tc.want)
			continue
		}
		if want := string(pgjson.AppendString([]byte("p"), tc.in)); err == nil && string(got) != want {
			t.Errorf("%q: %s, want %s", tc.in, got, want)
		}
	}
}
