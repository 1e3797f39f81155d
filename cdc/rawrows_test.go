package cdc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/raw"
)

// rawRowsSQL renders the change rows of a raw table, each column as text;
// %s is the table.
const rawRowsSQL = `SELECT concat_ws(' | ', event_id, event_time, ingested_at, op, source_table, payload::text,
    coalesce(row_key, 'NULL'), coalesce(old_row::text, 'NULL'), commit_lsn, load_xid IS NOT NULL)
FROM %s ORDER BY event_id`

// TestRawRowsBinaryMatchesText: the change rows encoded in binary store
// exactly what the same rows store as COPY text (the encoding a raw table
// of other column types gets): values with the characters text escapes,
// NULLs, json that jsonb refuses, composite keys, key changes, deletes
// that carry only the key, a truncate, times to the microsecond and more
// rows than one chunk of the stream. A change table tidemark created gets
// the binary encoding; one with other column types does not.
func TestRawRowsBinaryMatchesText(t *testing.T) {
	ctx := context.Background()
	pool, dsn := pgtest.NewPool(t)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	when := time.Date(2026, 11, 30, 23, 59, 59, 999999000, time.UTC)
	for _, name := range []string{"bin", "txt"} {
		raw := raw.NewChangeTable(name, config.PartitionDay)
		if err := raw.Ensure(ctx, conn.Conn()); err != nil {
			t.Fatal(err)
		}
		if err := raw.EnsurePartitions(ctx, conn.Conn(), raw.Missing([]time.Time{when, when.Add(time.Hour)})); err != nil {
			t.Fatal(err)
		}
		if ok, err := changeColumns.BinaryCopyFits(ctx, conn, raw.Ident()); err != nil || !ok {
			t.Fatalf("raw.%s created by tidemark: types match %v, %v", name, ok, err)
		}
	}

	v := func(s string) *string { return &s }
	one := &table{name: "public.orders", columns: []column{{name: "id", oid: 20}, {name: "note", oid: 25},
		{name: "doc", oid: jsonbOID}, {name: "j", oid: jsonOID}}, mirror: &mirror.Table{Key: []string{"id"}}}
	two := &table{name: "public.lines", columns: []column{{name: "order_id", oid: 20}, {name: "line", oid: 23},
		{name: "qty", oid: 23}}, mirror: &mirror.Table{Key: []string{"order_id", "line"}}}
	tricky := "tab\there, newline\nand \\N, \\ back\\slash, \"quotes\", \r, é漢字😀"
	changes := []change{
		{op: opInsert, table: one, newRow: row{"id": v("1"), "note": v(tricky), "doc": v(`{"a": [1, 2.50], "b": "\\t"}`), "j": v(`{"n": 1e131072}`)}},
		{op: opInsert, table: one, newRow: row{"id": v("2"), "note": nil, "doc": nil, "j": v(`"x\u0000y"`)}},
		{op: opUpdate, table: one, newRow: row{"id": v("1"), "note": v("unchanged TOAST values are absent")}},
		{op: opUpdate, table: one, newRow: row{"id": v("3"), "note": v("key changed")}, oldRow: row{"id": v("1")}},
		{op: opDelete, table: one, oldRow: row{"id": v("2")}},
		{op: opInsert, table: two, newRow: row{"order_id": v("3"), "line": v("1"), "qty": v("-7")}},
		{op: opDelete, table: two, oldRow: row{"order_id": v("3"), "line": v("1"), "qty": nil}},
		{op: opTruncate, table: one},
	}
	for i := range 5000 {
		changes = append(changes, change{op: opInsert, table: one,
			newRow: row{"id": v(fmt.Sprint(100 + i)), "note": v(strings.Repeat("n", i%300)), "doc": v(`{}`), "j": nil}})
	}
	for i := range changes {
		c := &changes[i]
		c.seq = i
		c.commitLSN = pglogrepl.LSN(0x16B3748 + uint64(i/3000)*0x1000)
		c.commitTime = when.Add(time.Duration(i/3000) * time.Minute).Add(-time.Duration(i%2) * time.Microsecond)
	}
	g := &group{ingestedAt: time.Date(2026, 12, 1, 8, 0, 0, 123456000, time.FixedZone("x", -5*3600))}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Conn().PgConn().CopyFrom(ctx, rawRows(g, changes), changeColumns.CopySQL("raw.bin", true)); err != nil {
		t.Fatalf("binary: %v", err)
	}
	w := rawText(g, changes)
	defer w.Release()
	if _, err := tx.Conn().PgConn().CopyFrom(ctx, w.Data(), changeColumns.CopySQL("raw.txt", false)); err != nil {
		t.Fatalf("text: %v", err)
	}
	got := pgtest.Rows(t, tx, fmt.Sprintf(rawRowsSQL, "raw.bin"))
	want := pgtest.Rows(t, tx, fmt.Sprintf(rawRowsSQL, "raw.txt"))
	if len(got) != len(changes) || len(want) != len(changes) {
		t.Fatalf("%d rows in binary and %d as text, want %d each", len(got), len(want), len(changes))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("row %d differs:\nbinary: %.300s\ntext:   %.300s", i, got[i], want[i])
		}
	}
	pgtest.Equal(t, "the first rows", got[:3], []string{
		`0/16B3748/0 | 2026-11-30 23:59:59.999999+00 | 2026-12-01 13:00:00.123456+00 | insert | public.orders | ` +
			`{"j": "{\"n\": 1e131072}", "id": "1", "doc": {"a": [1, 2.50], "b": "\\t"}, "note": "` +
			`tab\there, newline\nand \\N, \\ back\\slash, \"quotes\", \r, é漢字😀"} | 1 | NULL | 0/16B3748 | t`,
		`0/16B3748/1 | 2026-11-30 23:59:59.999998+00 | 2026-12-01 13:00:00.123456+00 | insert | public.orders | ` +
			`{"j": "\"x\\u0000y\"", "id": "2", "doc": null, "note": null} | 2 | NULL | 0/16B3748 | t`,
		`0/16B3748/10 | 2026-11-30 23:59:59.999999+00 | 2026-12-01 13:00:00.123456+00 | insert | public.orders | ` +
			`{"j": null, "id": "102", "doc": {}, "note": "nn"} | 102 | NULL | 0/16B3748 | t`,
	})

	// A raw table created beforehand with other column types.
	if _, err := tx.Exec(ctx, `ALTER TABLE raw.txt ALTER COLUMN commit_lsn TYPE text`); err != nil {
		t.Fatal(err)
	}
	if ok, err := changeColumns.BinaryCopyFits(ctx, tx, pgx.Identifier{"raw", "txt"}.Sanitize()); err != nil || ok {
		t.Fatalf("raw.txt with commit_lsn text: types match %v, %v", ok, err)
	}
}

// changeColumns are the raw change table's columns, named here where a
// test's variable raw hides the package.
var changeColumns = raw.ChangeColumns
