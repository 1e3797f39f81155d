package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/mirror"
)

// TestDebeziumTextOf: a value that textOf passes as text is written by
// the mirror writer as the same value (or the same failure) as it writes
// of the JSON row; the values it refuses (sent as JSON rows) are those
// where the two differ or might.
func TestDebeziumTextOf(t *testing.T) {
	tests := []struct {
		typ  string
		raw  string
		text bool // textOf passes it as text
		// differs: raw itself, as text, reads otherwise than from JSON
		// (why textOf refuses it).
		differs bool
	}{
		{"integer", `5`, true, false},
		{"integer", `null`, true, false},
		{"integer", `"7"`, true, false},
		{"integer", `1.5`, true, false}, // both refuse it
		{"integer", `-0`, false, false},
		{"integer", `1e2`, false, true}, // numeric prints 100, which integer takes
		{"bigint", `5000000000`, true, false},
		{"smallint", `70000`, true, false}, // both refuse it
		{"numeric(12,2)", `12.345`, true, false},
		{"numeric(12,2)", `1.50E1`, true, false},
		{"numeric", `-0`, true, false},
		{"numeric", `-0.000`, true, false},
		{"numeric", `1e-3`, true, false},
		{"numeric", `"3.14"`, true, false},
		{"double precision", `0.1`, true, false},
		{"double precision", `-0`, false, true}, // numeric has no negative zero: 0, where the text gives -0
		{"double precision", `-0.0`, false, true},
		{"double precision", `-1.5`, true, false},
		{"double precision", `1e300`, false, false},
		{"double precision", `5e-324`, false, false},
		{"real", `16777217`, true, false},
		{"text", `"a\"b\\c\nd\t/\/"`, true, false},
		{"text", `"x\u00e9"`, false, false},
		{"text", `"nul\u0000"`, false, false},
		{"text", `1e5`, false, true}, // numeric prints 100000
		{"text", `1.50`, true, false},
		{"text", `-0`, false, true}, // numeric prints 0
		{"text", `true`, true, false},
		{"text", `{"a":1}`, false, true},
		{"text", `[1,2]`, false, false},
		{"character varying(3)", `"abcd"`, true, false}, // both refuse it
		{"character(3)", `"ab"`, true, false},
		{"boolean", `true`, true, false},
		{"boolean", `1`, true, false},
		{"boolean", `"f"`, true, false},
		{"date", `"2026-12-07"`, true, false},
		{"timestamp without time zone", `"2026-12-07T10:00:00.123456Z"`, true, false},
		{"timestamp with time zone", `"2026-12-07T10:00:00Z"`, true, false},
		{"time without time zone", `"10:00:00.5"`, true, false},
		{"interval", `"3 microseconds"`, true, false},
		{"uuid", `"0e4e9d0c-4c55-4b8e-9d3a-2b8f3f1e2a11"`, true, false},
		{"bytea", `"\\x00ff"`, true, false},
		{"jsonb", `{"b": 1, "a": [1, 2.50, -0, 1e2], "a": "dup"}`, true, false},
		{"jsonb", `"str"`, true, false},
		{"jsonb", `-0`, true, false},
		{"json", `{"b": 1,  "a": 2}`, false, true}, // populate gives jsonb's text of it
		{"json", `"str"`, false, false},
		{"integer[]", `[1,2]`, false, true},
		{"text[]", `"{a,b}"`, false, false},
	}
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	for i, tt := range tests {
		t.Run(tt.typ+" "+tt.raw, func(t *testing.T) {
			// A table of its own: a statement prepared for another's row
			// type would not do.
			table := fmt.Sprintf("v%d", i)
			if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id integer PRIMARY KEY, c %s,
				loaded_at timestamptz NOT NULL, deleted_at timestamptz, pos bigint[])`, table, tt.typ)); err != nil {
				t.Fatal(err)
			}
			var typ string
			if err := pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'c'`, table).Scan(&typ); err != nil {
				t.Fatal(err)
			}
			text, ok := textOf(tt.raw, textKindOf(typ))
			if ok != tt.text {
				t.Fatalf("textOf(%s) into %s: ok %v, want %v", tt.raw, typ, ok, tt.text)
			}
			raw := tt.raw
			want := writeValue(t, pool, table, typ, true, &raw, false)
			if !ok {
				if tt.differs && writeValue(t, pool, table, typ, false, &raw, false) == want {
					t.Errorf("%s into %s: as text the same as from JSON (%s)", tt.raw, typ, want)
				}
				return
			}
			for _, insert := range []bool{false, true} {
				if got := writeValue(t, pool, table, typ, false, text, insert); got != want {
					t.Errorf("%s into %s: as text %s (insert %v), from JSON %s", tt.raw, typ, got, insert, want)
				}
			}
		})
	}
}

// writeValue writes, through the mirror writer, the row of id 1 with value
// v of column c (a JSON value with json, else text) into table, emptied
// first, and returns c's text, or "error" when the write fails. With
// insert the row is an insert, which the writer COPYs into the mirror;
// otherwise an update, which it stages.
func writeValue(t *testing.T, pool *pgxpool.Pool, table, typ string, json bool, v *string, insert bool) string {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `TRUNCATE `+table); err != nil {
		t.Fatal(err)
	}
	rel := &mirror.Relation{Name: table, Columns: []string{"id", "c"}, JSON: json, Position: "pos",
		Mirror: &mirror.Table{Target: pgx.Identifier{"public", table}, Key: []string{"id"}, LoadedColumn: "loaded_at", DeletedColumn: "deleted_at",
			Columns: []mirror.Column{{Name: "id", Type: "integer"}, {Name: "c", Type: typ}}}}
	id := "1"
	c := mirror.NewChanges(1)
	row, at := mirror.Row{"id": &id, "c": v}, mirror.At{Time: time.Now(), Position: []int64{1}}
	add := func() error { return c.Update(rel, nil, row, at) }
	if insert {
		add = func() error { return c.Insert(rel, row, at) }
	}
	if err := add(); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var w mirror.Writer
	if err := w.Begin(tx, time.Now()).Write(ctx, c); err != nil {
		return "error"
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var got *string
	if err := pool.QueryRow(ctx, `SELECT c::text FROM `+table).Scan(&got); err != nil {
		t.Fatal(err)
	}
	return show(got)
}

// show is a column's text, or NULL.
func show(s *string) string {
	if s == nil {
		return "NULL"
	}
	return fmt.Sprintf("%q", *s)
}
