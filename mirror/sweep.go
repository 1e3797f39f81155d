package mirror

import (
	"context"
	"fmt"
	"strings"

	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// SQL of a sweep (Txn.Sweep).
const (
	// createSweepStageSQL makes the stage of the keys a sweep keeps, in
	// the mirror's key types. %[1]s stage, %[2]s key columns and types.
	createSweepStageSQL = `CREATE TEMP TABLE IF NOT EXISTS %[1]s (%[2]s) ON COMMIT DELETE ROWS`
	// fillSweepStageSQL fills it from keys as text. %[1]s stage, %[2]s
	// key columns, %[3]s each key column from the text key k, %[4]s the
	// query of the text keys (its first column).
	fillSweepStageSQL = `INSERT INTO %[1]s (%[2]s) SELECT %[3]s FROM (%[4]s) AS l(k)`
	// removeSweptSQL removes the mirror rows whose key the stage lacks;
	// flagSweptSQL flags them. (An anti-join in a subquery rather than a
	// NOT EXISTS, which Citus does not plan over a distributed mirror and
	// a local stage, or a NOT IN, which PostgreSQL runs row by row once
	// the keys outgrow work_mem.) %[1]s mirror, %[2]s m's key columns,
	// %[3]s stage, %[4]s key match of m and s, %[5]s the first key column,
	// %[6]s key match of t and gone, %[7]s deleted column.
	removeSweptSQL = `
DELETE FROM %[1]s AS t
USING (SELECT %[2]s FROM %[1]s AS m LEFT JOIN %[3]s AS s ON %[4]s WHERE s.%[5]s IS NULL) AS gone
WHERE %[6]s`
	flagSweptSQL = `
UPDATE %[1]s AS t SET %[7]s = $1
FROM (SELECT %[2]s FROM %[1]s AS m LEFT JOIN %[3]s AS s ON %[4]s WHERE s.%[5]s IS NULL) AS gone
WHERE %[6]s AND t.%[7]s IS NULL`
)

// Sweep removes from r's mirror (flags, with soft deletes) the rows whose
// key is not among the text keys (KeyOf's form) that the query keysSQL
// returns, run with args: a resync ends with it, once every row of the
// source table has been copied or seen change, so that a row it did not
// meet is gone at the source. It returns the rows removed or flagged.
func (t *Txn) Sweep(ctx context.Context, r *Relation, keysSQL string, args ...any) (int64, error) {
	m := r.Mirror
	stage := pgquote.Ident("tidemark sweep " + strings.Join(m.Target, "."))
	defs, casts := make([]string, len(m.Key)), make([]string, len(m.Key))
	for i, k := range m.Key {
		c, ok := m.Column(k)
		if !ok {
			return 0, fmt.Errorf("mirror %s: no key column %s", m.Target.Sanitize(), k)
		}
		defs[i] = pgquote.Ident(k) + " " + c.Type
		text := "l.k"
		if len(m.Key) > 1 {
			text = fmt.Sprintf("(l.k::jsonb ->> %d)", i)
		}
		casts[i] = text + "::" + c.Type
	}
	keys := pgquote.Idents(m.Key)
	if _, err := t.tx.Exec(ctx, fmt.Sprintf(createSweepStageSQL, stage, strings.Join(defs, ", "))); err != nil {
		return 0, fmt.Errorf("sweep %s: %w", m.Target.Sanitize(), err)
	}
	if _, err := t.tx.Exec(ctx, fmt.Sprintf(fillSweepStageSQL, stage, keys, strings.Join(casts, ", "), keysSQL), args...); err != nil {
		return 0, fmt.Errorf("sweep %s: %w", m.Target.Sanitize(), err)
	}
	mKeys, ms, tg := make([]string, len(m.Key)), make([]string, len(m.Key)), make([]string, len(m.Key))
	for i, k := range m.Key {
		q := pgquote.Ident(k)
		mKeys[i], ms[i], tg[i] = "m."+q, "m."+q+" = s."+q, "t."+q+" = gone."+q
	}
	args2 := []any{m.Target.Sanitize(), strings.Join(mKeys, ", "), stage, strings.Join(ms, " AND "), pgquote.Ident(m.Key[0]), strings.Join(tg, " AND ")}
	sql, sargs := fmt.Sprintf(removeSweptSQL, args2...), []any{}
	if !m.Hard {
		sql, sargs = fmt.Sprintf(flagSweptSQL, append(args2, pgquote.Ident(m.DeletedColumn))...), []any{t.loadedAt}
	}
	tag, err := t.tx.Exec(ctx, sql, sargs...)
	if err != nil {
		return 0, fmt.Errorf("sweep %s: %w", m.Target.Sanitize(), err)
	}
	if _, err := t.tx.Exec(ctx, fmt.Sprintf(truncateStageSQL, stage)); err != nil {
		return 0, fmt.Errorf("sweep %s: %w", m.Target.Sanitize(), err)
	}
	n := tag.RowsAffected()
	t.written.Deleted += n
	return n, nil
}
