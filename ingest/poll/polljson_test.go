package poll_test

import (
	"fmt"
	"testing"
	"time"
)

// pollJSONValues are values of a json column: some jsonb takes, some it
// refuses although json takes them.
var pollJSONValues = []struct {
	name  string
	text  string
	jsonb bool // jsonb takes it: the payload holds it as JSON
}{
	{"object", `{"a": [1, 2.5], "b": "x"}`, true},
	{"duplicate keys and spacing", `{"k":1,  "k":2}`, true},
	{"NUL escape", `{"a": "x\u0000y"}`, false},
	{"lone surrogate", `["\ud800"]`, false},
	{"number too large", `{"n": 1e131072}`, false},
	{"number too precise", `1e-16384`, false},
}

// TestPollJSONColumnJSONBRefuses: a json column whose value jsonb refuses
// does not fail the run. The mirror holds every value exactly as the
// source does; the raw change row's payload holds it as JSON when jsonb
// takes it, otherwise as a JSON string of its text. A re-read changes
// nothing, a second write with the same updated_at reaches the mirror,
// and a later one is recorded as an update.
func TestPollJSONColumnJSONBRefuses(t *testing.T) {
	e := newPollEnv(t, `CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, doc json, docs json[],
		updated_at timestamptz NOT NULL)`)
	p := e.poller("")
	hour := time.Hour
	for i, v := range pollJSONValues {
		e.srcExec(`INSERT INTO src_customers VALUES ($1, $2::text::json, ARRAY[$2::text::json], '2026-10-05 09:00+00')`, i, v.text)
	}
	e.run(p, "2026-10-05 12:00", &hour)
	e.run(p, "2026-10-05 12:00", &hour) // a re-read: no change
	// A second write within the same updated_at: the values move one row on.
	e.srcExec(`UPDATE src_customers s SET doc = o.doc FROM src_customers o WHERE o.customer_id = (s.customer_id + 1) % $1`, len(pollJSONValues))
	e.run(p, "2026-10-05 12:00", &hour)
	// A later write of every row records it as an update.
	e.srcExec(`UPDATE src_customers SET updated_at = '2026-10-05 09:30+00'`)
	e.run(p, "2026-10-05 12:00", &hour)
	n := len(pollJSONValues)
	for i, v := range pollJSONValues {
		t.Run(v.name, func(t *testing.T) {
			expr := `to_jsonb($1::text)`
			if v.jsonb {
				expr = `$1::text::jsonb`
			}
			for _, c := range []struct {
				sql  string
				want int64
			}{
				{fmt.Sprintf(`SELECT count(*) FROM dw_customers WHERE customer_id = %d AND docs[1]::text = $1`, i), 1},
				{fmt.Sprintf(`SELECT count(*) FROM dw_customers WHERE customer_id = %d AND doc::text = $1`, (i+n-1)%n), 1},
				{fmt.Sprintf(`SELECT count(*) FROM raw.customers WHERE row_key = '%d' AND op = 'insert' AND payload->'doc' = %s`, i, expr), 1},
				{fmt.Sprintf(`SELECT count(*) FROM raw.customers WHERE row_key = '%d' AND op = 'update' AND payload->'doc' = %s`, (i+n-1)%n, expr), 1},
			} {
				var got int64
				if err := e.wh.QueryRow(e.ctx, c.sql, v.text).Scan(&got); err != nil {
					t.Fatalf("%s: %v", c.sql, err)
				}
				if got != c.want {
					t.Errorf("%s: %d, want %d", c.sql, got, c.want)
				}
			}
		})
	}
	if got := e.int(`SELECT count(*) FROM raw.customers`); got != int64(2*n) {
		t.Errorf("raw change rows: %d, want %d", got, 2*n)
	}
}
