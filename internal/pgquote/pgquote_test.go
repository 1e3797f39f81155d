package pgquote_test

import (
	"context"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestQuoting: every hostile name and string reads back as itself through
// a real server, with standard_conforming_strings on and off.
func TestQuoting(t *testing.T) {
	ctx := context.Background()
	conn := pgtest.Conn(t, pgtest.NewDatabase(t))
	values := []string{"plain", "it's", `back\slash`, `\'`, `'\`, `"double"`, "new\nline", "ünï", "a.b", "", `\\''\\`}
	for _, scs := range []string{"on", "off"} {
		if _, err := conn.Exec(ctx, "SET standard_conforming_strings = "+scs); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			var got string
			if err := conn.QueryRow(ctx, "SELECT "+pgquote.Literal(v)).Scan(&got); err != nil || got != v {
				t.Errorf("standard_conforming_strings %s: Literal(%q) = %s read back as %q (%v)", scs, v, pgquote.Literal(v), got, err)
			}
			if v == "" {
				continue // no identifier is empty
			}
			if err := conn.QueryRow(ctx, "SELECT 1 AS "+pgquote.Ident(v)+"").Scan(new(int)); err != nil {
				t.Errorf("Ident(%q) = %s: %v", v, pgquote.Ident(v), err)
			}
			rows, err := conn.Query(ctx, "SELECT 1 AS "+pgquote.Ident(v))
			if err != nil {
				t.Fatal(err)
			}
			if name := rows.FieldDescriptions()[0].Name; name != v {
				t.Errorf("Ident(%q) = %s names the column %q", v, pgquote.Ident(v), name)
			}
			rows.Close()
		}
	}
}

// TestIdents: a qualified name and a column list.
func TestIdents(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{pgquote.Ident("raw", "app events"), `"raw"."app events"`},
		{pgquote.Idents([]string{"a", `b"c`}), `"a", "b""c"`},
		{pgquote.Idents(nil), ""},
		{pgquote.CommandLiteral(`pub'\x`), `'pub''\x'`},
	} {
		if tt.got != tt.want {
			t.Errorf("got %s, want %s", tt.got, tt.want)
		}
	}
}
