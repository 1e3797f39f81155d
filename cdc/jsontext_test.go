package cdc

import (
	"encoding/json"
	"testing"
)

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
