package debeziumtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AssertMirror checks that the mirror table (schema.name) is the stream's
// expected table: every row, live or flagged deleted, with its values and
// deletion time, each with a source position.
func AssertMirror(tb testing.TB, pool *pgxpool.Pool, table string, s *Stream) {
	tb.Helper()
	born := "NULL::text"
	if s.Schemas {
		born = "born::text"
	}
	rows, err := pool.Query(context.Background(), fmt.Sprintf(`
SELECT id, name, bio, balance::text, %s, deleted_at, source_position IS NOT NULL FROM %s ORDER BY id`, born, table))
	if err != nil {
		tb.Fatalf("read the mirror: %v", err)
	}
	got := map[int64]*Row{}
	for rows.Next() {
		var id int64
		var r Row
		var deleted *time.Time
		var positioned bool
		if err := rows.Scan(&id, &r.Name, &r.Bio, &r.Balance, &r.Born, &deleted, &positioned); err != nil {
			tb.Fatal(err)
		}
		if deleted != nil {
			r.DeletedAt = deleted.UTC()
		}
		if !positioned {
			tb.Errorf("row %d has no source position", id)
		}
		got[id] = &r
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	bad := 0
	for id, want := range s.Want {
		if g := show(got[id]); g != show(want) {
			bad++
			if bad <= 5 {
				tb.Errorf("mirror row %d:\n got  %s\n want %s", id, g, show(want))
			}
		}
	}
	for id := range got {
		if s.Want[id] == nil {
			tb.Errorf("mirror row %d should not exist: %s", id, show(got[id]))
		}
	}
	if bad > 0 {
		tb.Errorf("%d of %d mirror rows differ", bad, len(s.Want))
	}
}

func show(r *Row) string {
	if r == nil {
		return "no row"
	}
	str := func(p *string) string {
		if p == nil {
			return "NULL"
		}
		return fmt.Sprintf("%.20q", *p)
	}
	return fmt.Sprintf("name %s bio %s balance %s born %s deleted %s", str(r.Name), str(r.Bio), str(r.Balance), str(r.Born), r.DeletedAt.Format(time.RFC3339Nano))
}

// AssertChanges checks that raw.<source> holds one change row per change
// of the stream, with distinct event ids, that the ledger counts them, and
// that there are no dead letters.
func AssertChanges(tb testing.TB, pool *pgxpool.Pool, source string, s *Stream) {
	tb.Helper()
	scalar := func(sql string) int64 {
		var n int64
		if err := pool.QueryRow(context.Background(), sql, source).Scan(&n); err != nil {
			tb.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	if n := scalar(`SELECT count(DISTINCT event_id) FROM raw.` + source + ` WHERE $1 <> ''`); n != int64(s.Changes) {
		tb.Errorf("raw.%s holds %d distinct change rows, want %d", source, n, s.Changes)
	}
	if n := scalar(`SELECT count(*) FROM raw.` + source + ` WHERE $1 <> ''`); n != int64(s.Changes) {
		tb.Errorf("raw.%s holds %d change rows, want %d", source, n, s.Changes)
	}
	if n := scalar(`SELECT coalesce(sum(rows), 0)::bigint FROM tidemark.ingest_ledger WHERE source = $1`); n != int64(s.Changes) {
		tb.Errorf("the ledger counts %d rows, want %d", n, s.Changes)
	}
	if n := scalar(`SELECT count(*) FROM tidemark.dead_letters WHERE source = $1`); n != 0 {
		tb.Errorf("%d dead letters, want none", n)
	}
}
