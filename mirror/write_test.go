package mirror_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/mirror"
)

// change is one change of a writer test: i(nsert), u(pdate) or d(elete)
// of a row given as "column=value" pairs (value "null" is NULL; a column
// not named is not sent), with the old key for a key change.
type change struct {
	op       byte
	row      string
	old      string
	pos      int64     // the change's position, for a positioned relation
	truncate time.Time // a later truncate's time, or zero
}

// writerRelation is the relation of the writer tests: m (id integer key,
// name and note text) with its loaded and deleted columns and pos.
func writerRelation(json, hard bool, position string) *mirror.Relation {
	return &mirror.Relation{Name: "public.m", Columns: []string{"id", "name", "note"}, JSON: json, Position: position,
		Mirror: &mirror.Table{Target: pgx.Identifier{"public", "m"}, Key: []string{"id"}, LoadedColumn: "loaded_at", DeletedColumn: "deleted_at", Hard: hard,
			Columns: []mirror.Column{{Name: "id", Type: "integer"}, {Name: "name", Type: "text"}, {Name: "note", Type: "text"}}}}
}

// parseRow turns "id=1 name=a" into a row; with json, values are JSON.
func parseRow(t *testing.T, s string, json bool) mirror.Row {
	t.Helper()
	if s == "" {
		return nil
	}
	r := mirror.Row{}
	for _, kv := range strings.Fields(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("bad pair %q", kv)
		}
		if v == "null" {
			r[k] = nil
			continue
		}
		if json && k != "id" {
			v = fmt.Sprintf("%q", v)
		}
		r[k] = &v
	}
	return r
}

// writeRun folds and writes one run of changes in its own transaction.
func writeRun(t *testing.T, pool *pgxpool.Pool, w *mirror.Writer, rel *mirror.Relation, run []change) {
	t.Helper()
	ctx := context.Background()
	c := mirror.NewChanges(len(run))
	for _, ch := range run {
		at := mirror.At{Time: time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)}
		if !ch.truncate.IsZero() {
			at.Truncated = &ch.truncate
		}
		if rel.Position != "" {
			at.Position = []int64{ch.pos}
		}
		var err error
		switch ch.op {
		case 'i':
			err = c.Insert(rel, parseRow(t, ch.row, rel.JSON), at)
		case 'u':
			err = c.Update(rel, parseRow(t, ch.old, rel.JSON), parseRow(t, ch.row, rel.JSON), at)
		case 'd':
			err = c.Delete(rel, parseRow(t, ch.row, rel.JSON), at)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := w.Begin(tx, time.Now()).Write(ctx, c); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// mirrorRows reads m as "id name note [deleted] [pos]" lines.
func mirrorRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return pgtest.Rows(t, pool, `SELECT concat_ws(' ', id, coalesce(name, '-'), coalesce(note, '-'),
		CASE WHEN deleted_at IS NOT NULL THEN 'deleted' END, pos::text) FROM m ORDER BY id`)
}

// TestWriter applies runs of changes through the one mirror writer, for
// each kind of relation, and compares the mirror with what it must hold.
func TestWriter(t *testing.T) {
	truncated := time.Date(2026, 10, 2, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		json     bool
		hard     bool
		position string
		runs     [][]change
		want     []string
	}{
		{name: "text/upsert and soft delete", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x"}, {op: 'i', row: "id=2 name=b note=y"}, {op: 'u', row: "id=1 name=c note=x"}},
			{{op: 'u', row: "id=2 name=d note=y"}, {op: 'd', row: "id=2"}, {op: 'i', row: "id=3 name=e note=null"}},
		}, want: []string{"1 c x", "2 d y deleted", "3 e -"}},
		{name: "text/unsent values keep the stored ones", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x"}},
			{{op: 'u', row: "id=1 name=b"}, {op: 'u', row: "id=1 name=c"}},
		}, want: []string{"1 c x"}},
		{name: "text/key change takes the old key's unsent values", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x"}},
			{{op: 'u', old: "id=1", row: "id=3 name=b"}},
		}, want: []string{"1 a x deleted", "3 b x"}},
		{name: "text/hard deletes remove", hard: true, runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x"}, {op: 'i', row: "id=2 name=b note=y"}},
			{{op: 'd', row: "id=1"}, {op: 'i', row: "id=4 name=c note=z"}, {op: 'd', row: "id=4"}},
		}, want: []string{"2 b y"}},
		{name: "text/re-insert of a soft-deleted key", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x"}},
			{{op: 'd', row: "id=1"}},
			{{op: 'i', row: "id=1 name=b note=y"}, {op: 'i', row: "id=2 name=c note=z"}},
		}, want: []string{"1 b y", "2 c z"}},
		{name: "text/a row inserted and deleted in one run is copied flagged", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x"}, {op: 'u', row: "id=1 name=b note=x"}, {op: 'd', row: "id=1"}, {op: 'i', row: "id=2 name=c note=y"}},
		}, want: []string{"1 b x deleted", "2 c y"}},
		{name: "text/a soft-deleted key inserted and deleted again in one run", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x"}},
			{{op: 'd', row: "id=1"}},
			{{op: 'i', row: "id=1 name=b note=y"}, {op: 'd', row: "id=1"}, {op: 'i', row: "id=2 name=c note=z"}},
		}, want: []string{"1 b y deleted", "2 c z"}},
		{name: "text/hard: a row inserted and deleted in one run", hard: true, runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x"}, {op: 'd', row: "id=1"}, {op: 'i', row: "id=2 name=c note=y"}},
		}, want: []string{"2 c y"}},
		{name: "json/unsent values keep the stored ones", json: true, runs: [][]change{
			{{op: 'u', row: "id=1 name=a note=x"}},
			{{op: 'u', row: "id=1 name=b"}, {op: 'u', row: "id=2 name=c note=null"}},
		}, want: []string{"1 b x", "2 c -"}},
		{name: "position/a change sent again does not move a row back", json: true, position: "pos", runs: [][]change{
			{{op: 'u', row: "id=1 name=a note=x", pos: 1}, {op: 'u', row: "id=1 name=b note=x", pos: 3}},
			{{op: 'u', row: "id=1 name=a note=x", pos: 1}, {op: 'u', row: "id=2 name=c note=y", pos: 5}, {op: 'u', row: "id=2 name=old note=y", pos: 4}},
		}, want: []string{"1 b x {3}", "2 c y {5}"}},
		{name: "position/a delete of a missing key leaves a flagged row", json: true, position: "pos", runs: [][]change{
			{{op: 'd', row: "id=9 name=z note=z", pos: 7}},
			{{op: 'u', row: "id=9 name=a note=x", pos: 6}},
			{{op: 'u', row: "id=8 name=a note=x", pos: 8}, {op: 'd', row: "id=8", pos: 9}},
		}, want: []string{"8 a x deleted {9}", "9 - - deleted {7}"}},
		{name: "position/a change older than a truncate is flagged", json: true, position: "pos", runs: [][]change{
			{{op: 'u', row: "id=1 name=a note=x", pos: 1, truncate: truncated}, {op: 'u', row: "id=2 name=b note=y", pos: 3}},
		}, want: []string{"1 a x deleted {1}", "2 b y {3}"}},
		{name: "position/text rows", position: "pos", runs: [][]change{
			{{op: 'u', row: "id=1 name=a note=x", pos: 2}},
			{{op: 'u', row: "id=1 name=old", pos: 1}, {op: 'u', row: "id=1 name=b", pos: 3}, {op: 'd', row: "id=5", pos: 4}},
		}, want: []string{"1 b x {3}", "5 - - deleted {4}"}},
		{name: "position/text inserts new to the mirror, sent again", position: "pos", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x", pos: 1}, {op: 'i', row: "id=2 name=b note=y", pos: 2}, {op: 'u', row: "id=2 name=c note=y", pos: 3}},
			{{op: 'i', row: "id=1 name=a note=x", pos: 1}, {op: 'i', row: "id=2 name=b note=y", pos: 2}, {op: 'i', row: "id=3 name=d note=z", pos: 4}},
			{{op: 'i', row: "id=4 name=e note=w", pos: 5}},
		}, want: []string{"1 a x {1}", "2 c y {3}", "3 d z {4}", "4 e w {5}"}},
		{name: "position/text inserts over a delete's flagged row", position: "pos", runs: [][]change{
			{{op: 'd', row: "id=9", pos: 7}},
			{{op: 'i', row: "id=9 name=old note=x", pos: 6}},
			{{op: 'i', row: "id=8 name=a note=x", pos: 8}, {op: 'd', row: "id=8", pos: 9}},
			{{op: 'i', row: "id=9 name=new note=x", pos: 10}},
		}, want: []string{"8 a x deleted {9}", "9 new x {10}"}},
		{name: "position/text: a row inserted and deleted in one run is copied flagged", position: "pos", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x", pos: 1}, {op: 'u', row: "id=1 name=b note=x", pos: 2}, {op: 'd', row: "id=1", pos: 3},
				{op: 'i', row: "id=2 name=c note=y", pos: 4}},
			{{op: 'i', row: "id=1 name=a note=x", pos: 1}, {op: 'd', row: "id=1", pos: 3}},
		}, want: []string{"1 b x deleted {3}", "2 c y {4}"}},
		{name: "position/json: a row inserted and deleted in one run is copied flagged", json: true, position: "pos", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x", pos: 1}, {op: 'u', row: "id=1 name=b note=x", pos: 2}, {op: 'd', row: "id=1", pos: 3},
				{op: 'i', row: "id=2 name=c note=y", pos: 4}},
		}, want: []string{"1 b x deleted {3}", "2 c y {4}"}},
		{name: "position/a text insert older than a truncate is flagged", position: "pos", runs: [][]change{
			{{op: 'i', row: "id=1 name=a note=x", pos: 1, truncate: truncated}, {op: 'i', row: "id=2 name=b note=y", pos: 3}},
		}, want: []string{"1 a x deleted {1}", "2 b y {3}"}},
	}
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, _ := pgtest.NewPool(t)
			if _, err := pool.Exec(ctx, `CREATE TABLE m (id integer PRIMARY KEY, name text, note text,
				loaded_at timestamptz NOT NULL, deleted_at timestamptz, pos bigint[])`); err != nil {
				t.Fatal(err)
			}
			rel := writerRelation(tt.json, tt.hard, tt.position)
			var w mirror.Writer
			for _, run := range tt.runs {
				writeRun(t, pool, &w, rel, run)
			}
			got := mirrorRows(t, pool)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("mirror:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

// TestWriterShared: Txns that share a transaction (BeginShared) each
// start from an empty stage, so that one does not write the rows of the
// one before it again.
func TestWriterShared(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE m (id integer PRIMARY KEY, name text, note text,
		loaded_at timestamptz NOT NULL, deleted_at timestamptz, pos bigint[])`); err != nil {
		t.Fatal(err)
	}
	for _, json := range []bool{false, true} {
		rel := writerRelation(json, false, "")
		var w mirror.Writer
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for i, row := range []string{"id=1 name=a note=x", "id=2 name=b note=y"} {
			c := mirror.NewChanges(1)
			if err := c.Update(rel, nil, parseRow(t, row, json), mirror.At{Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
			if err := w.BeginShared(tx, time.Now()).Write(ctx, c); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				if _, err := tx.Exec(ctx, `UPDATE m SET name = 'changed' WHERE id = 1`); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(mirrorRows(t, pool), "; ")
		if want := "1 changed x; 2 b y"; got != want {
			t.Errorf("json=%v: mirror %q, want %q", json, got, want)
		}
		if _, err := pool.Exec(ctx, `TRUNCATE m`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWriterEdges: a JSON row's column names are JSON-escaped whatever
// characters they hold; a delete of a key the mirror lacks leaves its
// other columns NULL, not their defaults; a truncate at the zero time
// still flags the late change.
func TestWriterEdges(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	odd := "a\x01b\x7fc\u2028"
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE m (id integer PRIMARY KEY, %s text DEFAULT 'dflt',
		loaded_at timestamptz NOT NULL, deleted_at timestamptz, pos bigint[])`, pgx.Identifier{odd}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	rel := &mirror.Relation{Name: "public.m", Columns: []string{"id", odd}, JSON: true, Position: "pos",
		Mirror: &mirror.Table{Target: pgx.Identifier{"public", "m"}, Key: []string{"id"}, LoadedColumn: "loaded_at", DeletedColumn: "deleted_at"}}
	text := func(s string) *string { return &s }
	var zero time.Time
	c := mirror.NewChanges(3)
	for _, err := range []error{
		c.Update(rel, nil, mirror.Row{"id": text("1"), odd: text(`"v"`)}, mirror.At{Time: time.Now(), Position: []int64{5}}),
		c.Delete(rel, mirror.Row{"id": text("7")}, mirror.At{Time: time.Now(), Position: []int64{6}}),
		c.Update(rel, nil, mirror.Row{"id": text("3"), odd: text(`"w"`)}, mirror.At{Time: time.Now(), Position: []int64{4}, Truncated: &zero}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var w mirror.Writer
	if err := w.Begin(tx, time.Now()).Write(ctx, c); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(pgtest.Rows(t, pool, fmt.Sprintf(`SELECT concat_ws(' ', id, coalesce(%s, '-'), CASE WHEN deleted_at IS NOT NULL THEN 'deleted' END)
		FROM m ORDER BY id`, pgx.Identifier{odd}.Sanitize())), "; ")
	if want := "1 v; 3 w deleted; 7 - deleted"; got != want {
		t.Errorf("mirror %q, want %q", got, want)
	}
}
