package poll

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
)

// SQL of a poll run. The warehouse side locks the source's watermark row,
// merges each chunk of source rows into the mirror and records the rows
// that changed as raw change rows; the source side reads the window through
// a cursor in one REPEATABLE READ snapshot.
const (
	ensurePollStateSQL = `INSERT INTO tidemark.poll_watermarks (source) VALUES ($1) ON CONFLICT DO NOTHING`

	// lockPollStateSQL locks the watermark row so two overlapping runs
	// cannot both advance it, and computes the window's lower bound.
	lockPollStateSQL = `
SELECT high_watermark, high_watermark - $2::bigint * interval '1 microsecond'
FROM tidemark.poll_watermarks WHERE source = $1 FOR UPDATE`

	// advancePollSQL moves the watermark to the newest updated_at read,
	// never backwards and never beyond what was read.
	advancePollSQL = `
UPDATE tidemark.poll_watermarks SET
    advanced_at    = CASE WHEN $2::timestamptz > high_watermark THEN $4 ELSE advanced_at END,
    high_watermark = greatest(high_watermark, coalesce($2::timestamptz, high_watermark)),
    last_upper     = $3,
    last_run_at    = $4,
    runs           = runs + 1,
    rows_read      = rows_read + $5,
    rows_merged    = rows_merged + $6
WHERE source = $1
RETURNING high_watermark`

	// storeSourceWatermarkSQL records the event-time watermark of the
	// source (its updated_at watermark minus the allowed out-of-orderness)
	// for the reconciler and status.
	storeSourceWatermarkSQL = `
INSERT INTO tidemark.source_watermarks AS w (source, event_time_watermark, updated_at)
VALUES ($1, $2, $3)
ON CONFLICT (source) DO UPDATE SET
    event_time_watermark = greatest(w.event_time_watermark, EXCLUDED.event_time_watermark),
    updated_at = EXCLUDED.updated_at`

	sourceUpperSQL = `SELECT now() - $1::bigint * interval '1 microsecond'`

	createPollStageSQL = `
CREATE TEMP TABLE IF NOT EXISTS tidemark_poll_stage (
    tidemark_key      text        NOT NULL,
    tidemark_time     timestamptz NOT NULL,
    tidemark_deleted  boolean     NOT NULL,
    tidemark_payload  jsonb       NOT NULL,
    tidemark_json     text[]
) ON COMMIT DELETE ROWS`
	truncatePollStageSQL = `TRUNCATE pg_temp.tidemark_poll_stage`

	// pollCursorSQL reads the window in (updated_at, key) order. Rows are
	// read as json, not jsonb, so that a json value that jsonb refuses does
	// not fail the read, and the values of json columns also as text. %[1]s
	// source table, %[2]s updated_at as timestamptz, %[3]s key text, %[4]s
	// soft-delete test, %[5]s and %[6]s the bounds in the column's type,
	// %[7]s the ordering, %[8]s the text[] of the json columns. Bounds
	// are literals: DECLARE takes no parameters.
	pollCursorSQL = `
DECLARE tidemark_poll NO SCROLL CURSOR FOR
SELECT %[3]s, %[2]s, %[4]s, row_to_json(tidemark_src.*), %[8]s
FROM %[1]s AS tidemark_src
WHERE %[5]s AND %[6]s
ORDER BY %[7]s`
	fetchPollSQL = `FETCH FORWARD %d FROM tidemark_poll`

	// emptyTargetsSQL says whether the mirror and the raw table are both
	// empty: then a run inserts every row it reads and can COPY them
	// (see copyChunk). %[1]s mirror, %[2]s raw table.
	emptyTargetsSQL = `SELECT NOT EXISTS (SELECT FROM %[1]s) AND NOT EXISTS (SELECT FROM %[2]s)`

	// estimateSourceRowsSQL is the planner's row count of the source
	// table, or without one (never analyzed) the statistics' count of
	// live rows: the total a first load's progress expects.
	estimateSourceRowsSQL = `
SELECT (CASE WHEN c.reltuples >= 0 THEN c.reltuples ELSE coalesce(s.n_live_tup, 0) END)::int8
FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid WHERE c.oid = $1::regclass`

	// mergeChunkSQL merges the staged chunk into the mirror: new keys are
	// inserted, existing ones updated only when the incoming updated_at is
	// newer, or equal with other values (a second write within the same
	// timestamp), or when the stored row is flagged deleted but the source
	// has it again; so re-reads change nothing, and every row that changed is
	// recorded as a raw change row. The values of json columns come from
	// their text, exactly: jsonb may refuse them, and SQL cannot take them
	// out of a json object without de-escaping them. It returns the changes
	// per operation and UTC hour of event time, plus the number of rows
	// merged. %[1]s
	// mirror, %[2]s column list, %[3]s key list, %[4]s SET list, %[5]s
	// updated_at column, %[6]s raw table, %[7]s loaded-at column, %[8]s
	// deleted-at column, %[9]s join of merged and incoming on the key,
	// %[10]s the test that the incoming row differs from the stored one,
	// %[11]s the incoming source columns, %[12]s the staged payload
	// without the json columns, %[13]s the raw change columns a poll
	// source writes.
	mergeChunkSQL = `
WITH incoming AS (
    SELECT s.tidemark_key, s.tidemark_time, s.tidemark_deleted, s.tidemark_payload, %[11]s
    FROM pg_temp.tidemark_poll_stage s
    CROSS JOIN LATERAL jsonb_populate_record(NULL::%[1]s, %[12]s) AS r
), merged AS (
    INSERT INTO %[1]s AS t (%[2]s, %[7]s, %[8]s)
    SELECT %[2]s, $1::timestamptz, NULL FROM incoming
    ON CONFLICT (%[3]s) DO UPDATE SET %[4]s
    WHERE EXCLUDED.%[5]s > t.%[5]s OR t.%[8]s IS NOT NULL
       OR (EXCLUDED.%[5]s = t.%[5]s AND %[10]s)
    RETURNING %[3]s, (xmax = 0) AS inserted
), changes AS (
    INSERT INTO %[6]s (%[13]s)
    SELECT i.tidemark_key, i.tidemark_time, $1::timestamptz,
           CASE WHEN i.tidemark_deleted THEN 'delete' WHEN m.inserted THEN 'insert' ELSE 'update' END,
           $2, i.tidemark_payload, i.tidemark_key
    FROM merged m JOIN incoming i ON %[9]s
    ON CONFLICT DO NOTHING
    RETURNING op, event_time
)
SELECT op, date_bin('1 hour', event_time, timestamptz '2000-01-01 00:00:00+00'), count(*), min(event_time), max(event_time)
FROM changes GROUP BY 1, 2
UNION ALL
SELECT 'merged', NULL, count(*), NULL, NULL FROM merged`
)

// cursorSQL declares the cursor over (low, upper]. The bounds become
// literals in the column's own type, so the source can use an index on it.
// For a COPY (copying), the last column has the text of every column;
// otherwise of the json columns.
func (p *Poller) cursorSQL(low pgtype.Timestamptz, upper time.Time, copying bool) string {
	col := "tidemark_src." + pgquote.Ident(p.conf.UpdatedAt)
	lowLit := "'-infinity'::timestamptz"
	if low.InfinityModifier == pgtype.Finite {
		lowLit = tsLiteral(low.Time)
	}
	upLit := tsLiteral(upper)
	asTZ := col
	if p.zone != "" {
		zone := "'" + strings.ReplaceAll(p.zone, "'", "''") + "'"
		lowLit = "(" + lowLit + " AT TIME ZONE " + zone + ")"
		upLit = "(" + upLit + " AT TIME ZONE " + zone + ")"
		asTZ = "(" + col + " AT TIME ZONE " + zone + ")"
	}
	order := []string{col}
	for _, k := range p.table.Key {
		order = append(order, "tidemark_src."+pgquote.Ident(k))
	}
	jsonText := "NULL::text[]"
	cols := jsonColumns(p.table.Columns)
	if copying {
		cols = p.table.Columns
	}
	if len(cols) > 0 {
		var texts []string
		for _, c := range cols {
			texts = append(texts, "tidemark_src."+pgquote.Ident(c.Name)+"::text")
		}
		jsonText = "ARRAY[" + strings.Join(texts, ", ") + "]::text[]"
	}
	return fmt.Sprintf(pollCursorSQL, p.table.Source.Sanitize(), asTZ, mirror.KeyText("tidemark_src", p.table.Key), p.soft,
		col+" > "+lowLit, col+" <= "+upLit, strings.Join(order, ", "), jsonText)
}

func tsLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999") + "+00'::timestamptz"
}

// mergeSQL builds mergeChunkSQL for the mirror's columns.
func (p *Poller) mergeSQL() string {
	t := p.table
	var cols, sets []string
	for _, c := range t.Columns {
		cols = append(cols, pgquote.Ident(c.Name))
		if !slices.Contains(t.Key, c.Name) {
			sets = append(sets, fmt.Sprintf("%[1]s = EXCLUDED.%[1]s", pgquote.Ident(c.Name)))
		}
	}
	sets = append(sets, fmt.Sprintf("%[1]s = EXCLUDED.%[1]s", pgquote.Ident(t.LoadedColumn)), pgquote.Ident(t.DeletedColumn)+" = NULL")
	var join []string
	for _, k := range t.Key {
		join = append(join, fmt.Sprintf("i.%[1]s = m.%[1]s", pgquote.Ident(k)))
	}
	// The json columns' values are their staged text, cast back; they are
	// left out of the payload that fills the other columns.
	incoming, payload := "r.*", "s.tidemark_payload"
	if jc := jsonColumns(t.Columns); len(jc) > 0 {
		var in, names []string
		for _, c := range t.Columns {
			if k := slices.Index(jc, c); k >= 0 {
				in = append(in, fmt.Sprintf("s.tidemark_json[%d]::%s AS %s", k+1, c.Type, pgquote.Ident(c.Name)))
				names = append(names, "'"+strings.ReplaceAll(c.Name, "'", "''")+"'")
			} else {
				in = append(in, "r."+pgquote.Ident(c.Name))
			}
		}
		incoming = strings.Join(in, ", ")
		payload = "s.tidemark_payload - ARRAY[" + strings.Join(names, ", ") + "]::text[]"
	}
	return fmt.Sprintf(mergeChunkSQL, t.Target.Sanitize(), strings.Join(cols, ", "), pgquote.Idents(t.Key),
		strings.Join(sets, ", "), pgquote.Ident(p.conf.UpdatedAt), p.raw.Ident(), pgquote.Ident(t.LoadedColumn), pgquote.Ident(t.DeletedColumn),
		strings.Join(join, " AND "), rowJSON("t", t.Columns)+" IS DISTINCT FROM "+rowJSON("EXCLUDED", t.Columns),
		incoming, payload, pollChangeColumns.List())
}

// jsonColumns returns the columns of type json and json[], in order.
func jsonColumns(cols []mirror.Column) []mirror.Column {
	var out []mirror.Column
	for _, c := range cols {
		if isJSON(c) {
			out = append(out, c)
		}
	}
	return out
}

// isJSON reports whether c is of type json or json[]: their values are
// passed and compared as text.
func isJSON(c mirror.Column) bool { return c.Type == "json" || c.Type == "json[]" }

// rowJSON is a jsonb of the source columns of the row alias, for comparing
// rows whatever their column types (json and others have no equality).
// json values are compared as text: jsonb may refuse them, and the mirror
// keeps their text. jsonb_build_object takes at most 100 arguments, so
// wide rows are built in parts and concatenated.
func rowJSON(alias string, cols []mirror.Column) string {
	var parts []string
	for i := 0; i < len(cols); i += 50 {
		var args []string
		for _, c := range cols[i:min(i+50, len(cols))] {
			v := alias + "." + pgquote.Ident(c.Name)
			if isJSON(c) {
				v += "::text"
			}
			args = append(args, "'"+strings.ReplaceAll(c.Name, "'", "''")+"'", v)
		}
		parts = append(parts, "jsonb_build_object("+strings.Join(args, ", ")+")")
	}
	return "(" + strings.Join(parts, " || ") + ")"
}

// copySQL is the COPY into the mirror of copyChunk: the source's columns,
// then the mirror's loaded-at and deleted-at columns.
func (p *Poller) copySQL() string {
	cols := make([]string, 0, len(p.table.Columns)+2)
	for _, c := range p.table.Columns {
		cols = append(cols, c.Name)
	}
	cols = append(cols, p.table.LoadedColumn, p.table.DeletedColumn)
	return "COPY " + p.table.Target.Sanitize() + " (" + pgquote.Idents(cols) + ") FROM STDIN"
}
