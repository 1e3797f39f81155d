package poll_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/ingest/poll"
)

// typesTypesDDL creates the user-defined types of typesDDL; they must
// exist in the warehouse too, for the mirror.
const typesTypesDDL = `CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy, really');
CREATE TYPE place AS (name text, lat float8, tags text[])`

// typesDDL is a source table with a column of most kinds of type, and a
// soft-delete flag.
const typesDDL = `CREATE TABLE src_customers (
    customer_id bigint PRIMARY KEY,
    email       text,
    tier        text NOT NULL,
    score       numeric(12,3),
    ratio       float8,
    born        date,
    seen        timestamp,
    span        interval,
    blob        bytea,
    doc         json,
    docb        jsonb,
    tags        text[],
    ok          boolean,
    uid         uuid,
    addr        inet,
    period      tstzrange,
    size        int4range,
    price       money,
    mood        mood,
    place       place,
    removed     boolean NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL
)`

// typesRowsSQL fills typesDDL with n rows whose values cycle through
// awkward cases: NULLs, COPY's special characters, float specials, a json
// value that jsonb refuses, a string that looks like COPY's end marker.
const typesRowsSQL = `
INSERT INTO src_customers
SELECT g,
       CASE g % 6 WHEN 0 THEN NULL WHEN 1 THEN E'tab\there\nnew\\back\rret' WHEN 2 THEN '\.' WHEN 3 THEN '\N'
                  WHEN 4 THEN 'ünïcødé ✓ ''quoted'' "dq"' ELSE 'c' || g || '@example.com' END,
       (ARRAY['free', 'pro', 'team'])[g % 3 + 1],
       CASE WHEN g % 7 = 0 THEN NULL ELSE g * 1.125 END,
       (ARRAY[0.1, 'NaN', 'Infinity', '-Infinity', -0.0, 1e-300, 1.0/3])[g % 7 + 1]::float8,
       date '1999-12-31' + g,
       timestamp '2026-10-05 00:00' + g * interval '1.5 second',
       CASE g % 3 WHEN 0 THEN interval '1 year 2 mons 3 days 04:05:06.789' WHEN 1 THEN interval '-1 day' ELSE NULL END,
       CASE g % 4 WHEN 0 THEN NULL WHEN 1 THEN '\x00ff5c0a09'::bytea ELSE convert_to('b' || g, 'UTF8') END,
       (ARRAY['{"a": 1,  "a": 2}', '[1, "x\ty", null]', '{"nul": "\u0000"}', '12345678901234567890.5e-3', NULL])[g % 5 + 1]::json,
       (ARRAY['{"k": [1, 2, {"n": null}]}', '"s"', NULL])[g % 3 + 1]::jsonb,
       CASE g % 3 WHEN 0 THEN ARRAY['a', 'b c', NULL, 'd"e', E'f\\g'] WHEN 1 THEN '{}'::text[] ELSE NULL END,
       CASE g % 3 WHEN 0 THEN true WHEN 1 THEN false ELSE NULL END,
       md5(g::text)::uuid,
       ('10.0.' || (g % 256) || '.' || (g % 250) || '/32')::inet,
       CASE g % 3 WHEN 0 THEN tstzrange('2026-10-05 00:00+00', NULL) WHEN 1 THEN 'empty'::tstzrange
                  ELSE tstzrange(timestamptz '2026-10-05 00:00+00' + g * interval '1 second', '2026-12-01 00:00+00', '(]') END,
       CASE g % 2 WHEN 0 THEN int4range(g, g * 2) ELSE NULL END,
       (g * 1.25)::numeric::money,
       (ARRAY['sad', 'ok', 'happy, really', NULL])[g % 4 + 1]::mood,
       CASE g % 3 WHEN 0 THEN ROW('café "x"', g / 7.0, ARRAY['a,b', NULL])::place WHEN 1 THEN ROW(NULL, NULL, NULL)::place ELSE NULL END,
       g % 11 = 0,
       timestamptz '2026-10-05 06:00+00' + (g % 900) * interval '17 second' + g * interval '1 microsecond'
FROM generate_series(1, $1) AS g`

// TestPollCopyLoadMatchesMerge: a first load into an empty mirror and raw
// table is COPYed, and leaves exactly what the merge leaves: the same
// mirror rows (every column's value, of built-in, enum and composite
// types), raw change rows, ledger and report.
// Later runs merge over the COPYed rows as over merged ones: an unchanged
// row re-read through the lookback writes nothing.
func TestPollCopyLoadMatchesMerge(t *testing.T) {
	const rows = 2500
	hour := 24 * time.Hour
	copied, merged := newPollEnv(t, typesTypesDDL+";\n"+typesDDL), newPollEnv(t, typesTypesDDL+";\n"+typesDDL)
	for _, e := range []*pollEnv{copied, merged} {
		if _, err := e.wh.Exec(e.ctx, typesTypesDDL); err != nil {
			t.Fatal(err)
		}
	}
	pc := copied.poller("chunk_rows: 1000\nsoft_delete: removed")
	pm := merged.poller("chunk_rows: 1000\nsoft_delete: removed")
	poll.SetMergeOnly(pm)
	for _, e := range []*pollEnv{copied, merged} {
		e.srcExec(typesRowsSQL, rows)
	}
	rc, rm := copied.run(pc, "2026-10-05 12:00", nil), merged.run(pm, "2026-10-05 12:00", nil)
	if !rc.Copied || rm.Copied {
		t.Fatalf("first runs Copied = %v and %v, want true (empty tables) and false (merge only)", rc.Copied, rm.Copied)
	}
	if rc.Read != rows || rc.Inserted+rc.Deleted != rows || rc.Deleted != rows/11 || rc.Chunks != 3 {
		t.Errorf("COPYed run read %d, inserted %d, deleted %d in %d chunks; want %d rows, %d deleted, 3 chunks",
			rc.Read, rc.Inserted, rc.Deleted, rc.Chunks, rows, rows/11)
	}
	rc.Copied = false
	if rc != rm {
		t.Errorf("reports differ:\nCOPY  %+v\nmerge %+v", rc, rm)
	}
	sameTables(t, copied, merged)

	// Some rows change, all are re-read: the changed ones, and only they,
	// become change rows on both sides.
	for _, e := range []*pollEnv{copied, merged} {
		e.srcExec(`UPDATE src_customers SET tier = 'enterprise', updated_at = updated_at + interval '1 minute' WHERE customer_id % 10 = 0`)
	}
	rc, rm = copied.run(pc, "2026-10-05 12:00", &hour), merged.run(pm, "2026-10-05 12:00", &hour)
	if rc.Copied || rc.Read != rows || rc.Updated+rc.Deleted != rows/10 || rc.Inserted != 0 {
		t.Errorf("second run: %+v, want a merge that reads %d rows and changes %d (flagged ones as deletes)", rc, rows, rows/10)
	}
	if rc != rm {
		t.Errorf("second reports differ:\nafter COPY  %+v\nafter merge %+v", rc, rm)
	}
	sameTables(t, copied, merged)
}

// sameTables fails unless the two warehouses hold the same mirror, raw
// change rows and ledger (all but load transaction ids).
func sameTables(t *testing.T, a, b *pollEnv) {
	t.Helper()
	for _, q := range []string{
		`SELECT m::text FROM dw_customers m ORDER BY customer_id`,
		`SELECT (event_id, event_time, ingested_at, op, source_table, payload, row_key, old_row, commit_lsn)::text
		 FROM raw.customers ORDER BY event_id, event_time`,
		`SELECT (source, bucket, sum(rows), min(min_event_time), max(max_event_time), ingested_at)::text
		 FROM tidemark.ingest_ledger GROUP BY source, bucket, ingested_at ORDER BY bucket, ingested_at`,
	} {
		ra, rb := a.texts(q), b.texts(q)
		if len(ra) == 0 {
			t.Fatalf("%s: no rows", q)
		}
		if len(ra) != len(rb) {
			t.Fatalf("%s: %d rows against %d", q, len(ra), len(rb))
		}
		for i := range ra {
			if ra[i] != rb[i] {
				t.Fatalf("%s: row %d differs:\n%s\n%s", q, i, ra[i], rb[i])
			}
		}
	}
}

// TestPollCopyConflictMerges: when a row COPYed into the empty tables is
// already there (here a trigger writes the change rows first, as another
// writer could), the run is repeated with the merge and loses nothing, and
// later runs merge.
func TestPollCopyConflictMerges(t *testing.T) {
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers SELECT g, 'c' || g || '@example.com', 'free', timestamptz '2026-10-05 09:00+00' + g * interval '1 second'
		FROM generate_series(1, 300) AS g`)
	p := e.poller("chunk_rows: 100")
	// The mirror and raw table exist once the poller has prepared.
	if err := p.Prepare(e.ctx); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE FUNCTION raw_first() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		     INSERT INTO raw.customers (event_id, event_time, ingested_at, op, source_table, payload, row_key)
		     VALUES (NEW.customer_id::text, NEW.updated_at, now(), 'insert', 'elsewhere', '{}', NEW.customer_id::text)
		     ON CONFLICT DO NOTHING;
		     RETURN NEW;
		 END $$`,
		`CREATE TRIGGER raw_first BEFORE INSERT ON dw_customers FOR EACH ROW WHEN (NEW.customer_id = 150) EXECUTE FUNCTION raw_first()`,
	} {
		if _, err := e.wh.Exec(e.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rep := e.run(p, "2026-10-05 12:00", nil)
	if rep.Copied || rep.Read != 300 || rep.Merged != 300 {
		t.Errorf("run: %+v, want the repeated run to merge all 300 rows", rep)
	}
	if n := e.int(`SELECT count(*) FROM dw_customers`); n != 300 {
		t.Errorf("mirror has %d rows, want 300", n)
	}
	// Row 150's change row is the trigger's; the others are the merge's.
	if n := e.int(`SELECT count(*) FROM raw.customers WHERE source_table <> 'elsewhere'`); n != 299 {
		t.Errorf("%d change rows from the poller, want 299", n)
	}
	if _, err := e.wh.Exec(e.ctx, `TRUNCATE dw_customers, raw.customers`); err != nil {
		t.Fatal(err)
	}
	if rep := e.run(p, "2026-10-05 12:00", nil); rep.Copied {
		t.Errorf("a run after the conflict COPYed again; want merges only")
	}
}

// texts returns the first column of every row of q, as text.
func (e *pollEnv) texts(q string) []string {
	e.t.Helper()
	rows, err := e.wh.Query(e.ctx, q)
	if err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return out
}
