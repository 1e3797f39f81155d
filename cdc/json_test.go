package cdc_test

import (
	"fmt"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// jsonValues are values of a json column: some jsonb takes, some it
// refuses although json takes them.
var jsonValues = []struct {
	name  string
	text  string
	jsonb bool // jsonb takes it: the payload holds it as JSON
}{
	{"object", `{"a": [1, 2.5], "b": "x"}`, true},
	{"duplicate keys and spacing", `{"k":1,  "k":2}`, true},
	{"string", `"just text"`, true},
	{"surrogate pair", `"\ud83d\ude00"`, true},
	{"NUL escape", `{"a": "x\u0000y"}`, false},
	{"NUL escape in a key", `{"\u0000": 1}`, false},
	{"lone high surrogate", `["\ud800"]`, false},
	{"lone low surrogate", `"\udc00 tail"`, false},
	{"number too large", `{"n": 1e131072}`, false},
	{"number too precise", `1e-16384`, false},
}

// TestJSONColumnsJSONBRefuses: a json column whose value jsonb refuses
// does not stop the stream. The snapshot and the stream copy every value
// into the mirror exactly as the source holds it; each raw change row's
// payload holds the value as JSON when jsonb takes it, otherwise as a
// JSON string of its text, in both payload and old_row (replica identity
// FULL).
func TestJSONColumnsJSONBRefuses(t *testing.T) {
	e := newCDCEnv(t)
	e.exec(`ALTER TABLE customers ADD COLUMN j json; ALTER TABLE customers REPLICA IDENTITY FULL`)
	const snapBase, streamBase = 1000, 2000
	for i, v := range jsonValues {
		e.exec(`INSERT INTO customers (id, name, j) VALUES ($1, $2, $3::text::json)`, snapBase+i, v.name, v.text)
	}
	e.start(e.config("snapshot: initial", "deletes: soft"))
	for i, v := range jsonValues {
		id := streamBase + i
		e.exec(`INSERT INTO customers (id, name, j) VALUES ($1, $2, $3::text::json)`, id, v.name, v.text)
		e.exec(`UPDATE customers SET tier = 'pro' WHERE id = $1`, id)
		e.exec(`UPDATE customers SET j = $2::text::json WHERE id = $1`, snapBase+i, v.text)
	}
	e.exec(`DELETE FROM customers WHERE id >= $1`, streamBase)
	// Two changes per value on the streamed rows, one on the snapshot
	// rows, and a delete of every streamed row.
	want := int64(4 * len(jsonValues))
	_ = waitfor.Poll(waitfor.Timeout, func() bool { return e.count("SELECT count(*) FROM raw.shop") >= want })
	if n := e.count("SELECT count(*) FROM raw.shop"); n != want {
		t.Fatalf("raw change rows: %d, want %d (the stream is stuck)", n, want)
	}
	for i, v := range jsonValues {
		t.Run(v.name, func(t *testing.T) {
			for _, id := range []int{snapBase + i, streamBase + i} {
				got := pgtest.Rows(t, e.wh, fmt.Sprintf(`SELECT j::text FROM mirror.customers WHERE id = %d`, id))
				if len(got) != 1 || got[0] != v.text {
					t.Errorf("mirror row %d: j is %q, want exactly %q", id, got, v.text)
				}
			}
			// The payload's value: the JSON itself, or its text as a
			// JSON string.
			expr := `to_jsonb($1::text)`
			if v.jsonb {
				expr = `$1::text::jsonb`
			}
			// Snapshot rows have one update, whose old row holds the value
			// too; streamed rows an insert, an update and a delete.
			for _, q := range []struct {
				where          string
				snap, streamed int64
			}{
				{`op <> 'delete' AND payload->'j' = ` + expr, 1, 2},
				{`op = 'update' AND old_row->'j' = ` + expr, 1, 1},
				{`op = 'delete' AND payload->'j' = ` + expr, 0, 1},
			} {
				for id, n := range map[int]int64{snapBase + i: q.snap, streamBase + i: q.streamed} {
					sql := fmt.Sprintf(`SELECT count(*) FROM raw.shop WHERE row_key = '%d' AND %s`, id, q.where)
					var got int64
					if err := e.wh.QueryRow(e.ctx, sql, v.text).Scan(&got); err != nil {
						t.Fatal(err)
					}
					if got != n {
						t.Errorf("%s: %d rows, want %d", sql, got, n)
					}
				}
			}
		})
	}
}
