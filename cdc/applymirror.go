package cdc

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/tidemark-dev/tidemark/internal/copytext"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

const (
	// createStageSQL creates the stage of one mirror: the net change of
	// each key of a chunk, with the source table's columns in the
	// mirror's types. "tidemark absent" lists the columns the change did
	// not carry (unchanged TOAST values), which keep their stored value;
	// the "tidemark from" columns hold, for a row whose key changed, the
	// old key, whose mirror row provides those values. %[1]s stage, %[2]s
	// old-key columns, %[3]s columns.
	createStageSQL = `
CREATE TEMP TABLE IF NOT EXISTS %[1]s (
    "tidemark kind" text, "tidemark at" timestamptz, "tidemark absent" text[], %[2]s, %[3]s
) ON COMMIT DELETE ROWS`
	// copyStageSQL fills a stage; %[1]s is the stage.
	copyStageSQL     = `COPY %[1]s FROM STDIN`
	truncateStageSQL = `TRUNCATE %s`

	// updateMirrorSQL updates the mirror rows of staged upserts. %[1]s
	// mirror, %[2]s stage, %[3]s SET list, %[4]s key match of t and s,
	// %[5]s the join of the old key's row o (or nothing).
	updateMirrorSQL = `
UPDATE %[1]s AS t SET %[3]s
FROM %[2]s AS s %[5]s
WHERE s."tidemark kind" = 'upsert' AND %[4]s`

	// insertMirrorSQL inserts, after updateMirrorSQL, the staged upserts
	// whose key the mirror does not have: those it has were updated. (A
	// correlated NOT EXISTS would say the same, but Citus does not plan
	// one over a distributed mirror and a local stage.) %[1]s mirror,
	// %[2]s stage, %[3]s columns, %[4]s values, %[5]s key columns, %[6]s
	// loaded and deleted columns, %[7]s the join of the old key's row o
	// (or nothing).
	insertMirrorSQL = `
INSERT INTO %[1]s (%[3]s, %[6]s)
SELECT %[4]s, $1, NULL
FROM %[2]s AS s %[7]s
WHERE s."tidemark kind" = 'upsert'
ON CONFLICT (%[5]s) DO NOTHING`

	// upsertMirrorSQL writes staged upserts that carry every column, in
	// one statement: a chunk holds one upsert per key at most. %[1]s
	// mirror, %[2]s stage, %[3]s columns, %[4]s s's columns, %[5]s key
	// columns, %[6]s SET list, %[7]s loaded and deleted columns.
	upsertMirrorSQL = `
INSERT INTO %[1]s AS t (%[3]s, %[7]s)
SELECT %[4]s, $1, NULL
FROM %[2]s AS s
WHERE s."tidemark kind" = 'upsert'
ON CONFLICT (%[5]s) DO UPDATE SET %[6]s`

	// Fresh rows: upserts of keys that a chunk inserted first, which the
	// mirror most likely lacks, are COPYed straight into it under a
	// savepoint; when a key is there after all (re-inserted after a soft
	// delete), the savepoint is rolled back and they are staged with the
	// rest. The savepoint is not released: savepoints nest, and ROLLBACK
	// TO goes back to the latest of the name. %[1]s mirror, %[2]s
	// columns, %[3]s loaded and deleted columns.
	copyFreshSQL       = `COPY %[1]s (%[2]s, %[3]s) FROM STDIN`
	savepointFreshSQL  = `SAVEPOINT tidemark_fresh`
	rollbackToFreshSQL = `ROLLBACK TO SAVEPOINT tidemark_fresh`

	// flagMirrorSQL marks staged deletes (soft); removeMirrorSQL removes
	// them (hard). %[1]s mirror, %[2]s stage, %[3]s deleted column, %[4]s
	// key match.
	flagMirrorSQL = `
UPDATE %[1]s AS t SET %[3]s = s."tidemark at"
FROM %[2]s AS s
WHERE s."tidemark kind" = 'delete' AND %[4]s AND t.%[3]s IS NULL`
	removeMirrorSQL = `
DELETE FROM %[1]s AS t
USING %[2]s AS s
WHERE s."tidemark kind" = 'delete' AND %[4]s`
)

// state is the net effect of a chunk's changes on one key.
type state struct {
	table  *table
	delete bool
	at     time.Time
	cols   row // upsert: the columns known; absent ones keep their stored value
	// from is, for an upsert whose key changed, a row holding the old
	// key: columns absent from cols take the old key's stored values.
	from row
	key  row // delete: the key columns
	// before is, for a delete, the upsert this chunk made of the row:
	// with soft deletes it is written and then flagged, so that the
	// mirror keeps it whether or not the upsert and the delete fall into
	// the same chunk.
	before *state
	// fresh marks an upsert of a key whose first change in the chunk was
	// an insert, with every column and the same key since: the mirror
	// most likely lacks the key, and the row can be COPYed into it.
	fresh bool
}

// applyMirrors folds the changes per table and key, in order, and writes
// the result: one upsert or delete per key.
func (a *applier) applyMirrors(ctx context.Context, g *group, changes []change) error {
	if len(changes) == 0 {
		return nil
	}
	// Each table's keys index the states, which are in the order their
	// keys first appeared; most chunks are of one table.
	var (
		states []*state
		index  = map[*table]map[string]int{}
		lastT  *table
		lastK  map[string]int
	)
	keys := func(t *table) map[string]int {
		if t != lastT {
			lastT, lastK = t, index[t]
			if lastK == nil {
				lastK = make(map[string]int, len(changes))
				index[t] = lastK
			}
		}
		return lastK
	}
	get := func(t *table, key string) *state {
		if i, ok := keys(t)[key]; ok {
			return states[i]
		}
		return nil
	}
	set := func(t *table, key string, s *state) {
		k := keys(t)
		if i, ok := k[key]; ok {
			states[i] = s
			return
		}
		k[key] = len(states)
		states = append(states, s)
	}
	for _, c := range changes {
		t := c.table
		switch c.op {
		case opInsert, opUpdate:
			newKey, ok := t.keyOf(c.newRow)
			if !ok {
				return fmt.Errorf("cdc: %s: a row without its key columns %v", t.name, t.mirror.Key)
			}
			// prev is what the row was before this change, as far as
			// this chunk knows.
			prev := get(t, newKey)
			var from row
			if c.oldRow != nil {
				if oldKey, ok := t.keyOf(c.oldRow); ok && oldKey != newKey {
					// The key changed: the old key is gone, and the
					// row's unsent columns are those of the old key.
					prev = get(t, oldKey)
					from = c.oldRow
					set(t, oldKey, &state{table: t, delete: true, at: c.commitTime, key: c.oldRow, before: upserted(prev)})
				}
			}
			// cols is the change's row itself unless an update adds to
			// what the chunk knows of it: no state's columns are
			// changed once set.
			cols := c.newRow
			if p := upserted(prev); p != nil && c.op == opUpdate {
				cols = make(row, len(p.cols))
				for name, v := range p.cols {
					cols[name] = v
				}
				if p.from != nil {
					from = p.from
				}
				for name, v := range c.newRow {
					cols[name] = v
				}
			}
			fresh := from == nil && len(cols) == len(t.columns)
			if c.op == opInsert {
				fresh = fresh && prev == nil
			} else {
				p := upserted(prev)
				fresh = fresh && p != nil && p.fresh
			}
			set(t, newKey, &state{table: t, cols: cols, from: from, at: c.commitTime, fresh: fresh})
		case opDelete:
			key, ok := t.keyOf(c.oldRow)
			if !ok {
				return fmt.Errorf("cdc: %s: a delete without the key columns %v (check the table's replica identity)", t.name, t.mirror.Key)
			}
			set(t, key, &state{table: t, delete: true, at: c.commitTime, key: c.oldRow, before: upserted(get(t, key))})
		}
	}
	byTable := map[*table]*stageRows{}
	var tables []*table
	for _, s := range states {
		st := byTable[s.table]
		if st == nil {
			st = newStageRows(s.table)
			st.copyFresh = g.savepoints < maxFreshSavepoints && a.copyFresh(s.table.mirror.Target.Sanitize())
			byTable[s.table] = st
			tables = append(tables, s.table)
		}
		if s.fresh && st.copyFresh {
			st.fresh = append(st.fresh, s)
			continue
		}
		if s.delete {
			if s.before != nil && !s.table.mirror.Hard {
				st.upsert(s.before)
			}
			st.delete(s)
			continue
		}
		st.upsert(s)
	}
	for _, t := range tables {
		if err := a.applyTable(ctx, g, byTable[t]); err != nil {
			return err
		}
	}
	return nil
}

// upserted returns s when it is an upsert, or nil.
func upserted(s *state) *state {
	if s == nil || s.delete {
		return nil
	}
	return s
}

// stageRows are the net changes of one table in a chunk: staged, or
// fresh.
type stageRows struct {
	t       *table
	name    string // the temp table
	ddl     string
	w       *copytext.Rows
	upserts int  // upserts staged
	deletes int  // deletes staged
	absent  bool // some upsert lacks a column
	renamed bool // some upsert takes columns from an old key

	copyFresh bool     // fresh rows are COPYed into the mirror
	fresh     []*state // the fresh rows, when they are
}

func newStageRows(t *table) *stageRows {
	h := fnv.New64a()
	var from, cols []string
	for _, k := range t.mirror.Key {
		c, _ := t.mirror.Column(k)
		from = append(from, pgquote.Ident("tidemark from "+k)+" "+c.Type)
		fmt.Fprintf(h, "%s\x00%s\x00", k, c.Type)
	}
	for _, c := range t.columns {
		typ := "text"
		if mc, ok := t.mirror.Column(c.name); ok {
			typ = mc.Type
		}
		cols = append(cols, pgquote.Ident(c.name)+" "+typ)
		fmt.Fprintf(h, "%s\x00%s\x00", c.name, typ)
	}
	name := pgquote.Ident("pg_temp", fmt.Sprintf("tidemark_cdc_%016x", h.Sum64()))
	return &stageRows{t: t, name: name, w: copytext.New(),
		ddl: fmt.Sprintf(createStageSQL, name, strings.Join(from, ", "), strings.Join(cols, ", "))}
}

// upsert stages an upsert.
func (st *stageRows) upsert(s *state) {
	st.upserts++
	st.w.Text("upsert")
	st.w.Time(s.at)
	var absent []string
	for _, c := range st.t.columns {
		if _, ok := s.cols[c.name]; !ok {
			absent = append(absent, c.name)
		}
	}
	st.w.TextArray(absent)
	st.absent = st.absent || len(absent) > 0
	for _, k := range st.t.mirror.Key {
		if s.from == nil || len(absent) == 0 {
			st.w.Null()
			continue
		}
		st.renamed = true
		st.w.Value(s.from[k])
	}
	for _, c := range st.t.columns {
		if v, ok := s.cols[c.name]; ok {
			st.w.Value(v)
		} else {
			st.w.Null()
		}
	}
	st.w.End()
}

// stageFresh stages the fresh rows with the rest.
func (st *stageRows) stageFresh() {
	for _, s := range st.fresh {
		st.upsert(s)
	}
	st.fresh = nil
}

// delete stages a delete.
func (st *stageRows) delete(s *state) {
	st.deletes++
	st.w.Text("delete")
	st.w.Time(s.at)
	st.w.Null()
	for range st.t.mirror.Key {
		st.w.Null()
	}
	for _, c := range st.t.columns {
		if v, ok := s.key[c.name]; ok && slices.Contains(st.t.mirror.Key, c.name) {
			st.w.Value(v)
		} else {
			st.w.Null()
		}
	}
	st.w.End()
}

// applyTable writes a table's fresh rows, and its staged upserts and
// deletes, to its mirror.
func (a *applier) applyTable(ctx context.Context, g *group, st *stageRows) error {
	defer st.w.Release()
	// The stage is created by the group's first chunk that uses it and
	// emptied by the later ones (it empties itself at COMMIT). A chunk
	// with fresh rows sends the savepoint they are copied under in the
	// same round trip, after it.
	staged := false
	stage := func(then string) error {
		q := fmt.Sprintf(truncateStageSQL, st.name)
		if !g.staged[st.name] {
			q = st.ddl
		}
		if then != "" {
			q += "; " + then
		}
		if _, err := g.tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("stage of %s: %w", st.t.name, err)
		}
		g.staged[st.name], staged = true, true
		return nil
	}
	if len(st.fresh) > 0 && g.savepoints >= maxFreshSavepoints {
		// Earlier tables of the chunk used the group's last savepoints.
		st.stageFresh()
	}
	if len(st.fresh) > 0 {
		if st.upserts+st.deletes > 0 {
			if err := stage(savepointFreshSQL); err != nil {
				return err
			}
		} else if _, err := g.tx.Exec(ctx, savepointFreshSQL); err != nil {
			return fmt.Errorf("insert into %s: %w", st.t.mirror.Target.Sanitize(), err)
		}
		g.savepoints++
		copied, err := a.insertFresh(ctx, g, st)
		if err != nil {
			return err
		}
		if copied {
			g.copied += int64(len(st.fresh))
		} else {
			st.stageFresh()
		}
	}
	if st.upserts+st.deletes == 0 {
		return nil
	}
	if !staged {
		if err := stage(""); err != nil {
			return err
		}
	}
	if _, err := st.w.CopyFrom(ctx, g.tx.Conn().PgConn(), fmt.Sprintf(copyStageSQL, st.name)); err != nil {
		return fmt.Errorf("stage of %s: %w", st.t.name, err)
	}
	keyMatch, err := a.applyUpserts(ctx, g, st)
	if err != nil {
		return err
	}
	g.merged += int64(st.upserts)
	if st.deletes == 0 {
		return nil
	}
	if err := a.applyDeletes(ctx, g, st, keyMatch); err != nil {
		return err
	}
	g.deleted += int64(st.deletes)
	return nil
}

// applyUpserts writes the table's staged upserts to its mirror: one
// INSERT ... ON CONFLICT when every staged row has all its columns, or an
// UPDATE and an INSERT when some lack values the source did not send
// (unchanged TOAST values), which the mirror row keeps (or, for a row
// whose key changed, takes from the old key's row). It returns the
// condition matching a staged row (s) to its mirror row (t) by key.
func (a *applier) applyUpserts(ctx context.Context, g *group, st *stageRows) (string, error) {
	m := st.t.mirror
	target := m.Target.Sanitize()
	var match, fromMatch, sets, cols, vals []string
	for _, k := range m.Key {
		match = append(match, fmt.Sprintf("t.%[1]s = s.%[1]s", pgquote.Ident(k)))
		fromMatch = append(fromMatch, fmt.Sprintf("o.%s = s.%s", pgquote.Ident(k), pgquote.Ident("tidemark from "+k)))
	}
	oldFound := fmt.Sprintf("o.%s IS NOT NULL", pgquote.Ident(m.Key[0]))
	for _, c := range st.t.columns {
		q := pgquote.Ident(c.name)
		cols = append(cols, q)
		switch {
		case slices.Contains(m.Key, c.name):
			// A row is matched by its key, so its key columns keep their
			// values; a distributed mirror refuses a SET of its
			// distribution column, even to the same value.
			vals = append(vals, "s."+q)
		case !st.absent:
			sets = append(sets, fmt.Sprintf("%[1]s = s.%[1]s", q))
			vals = append(vals, "s."+q)
		default:
			absent := fmt.Sprintf(`%s = ANY(s."tidemark absent")`, pgquote.Literal(c.name))
			if st.renamed {
				// An unsent value of a row whose key changed is the old
				// key's, even when the new key has a (flagged) row.
				sets = append(sets, fmt.Sprintf("%[1]s = CASE WHEN %[2]s THEN CASE WHEN %[3]s THEN o.%[1]s ELSE t.%[1]s END ELSE s.%[1]s END", q, absent, oldFound))
				vals = append(vals, fmt.Sprintf("CASE WHEN %[2]s THEN o.%[1]s ELSE s.%[1]s END", q, absent))
			} else {
				sets = append(sets, fmt.Sprintf("%[1]s = CASE WHEN %[2]s THEN t.%[1]s ELSE s.%[1]s END", q, absent))
				vals = append(vals, "s."+q)
			}
		}
	}
	sets = append(sets, pgquote.Ident(m.LoadedColumn)+" = $1", pgquote.Ident(m.DeletedColumn)+" = NULL")
	join := ""
	if st.renamed {
		join = fmt.Sprintf("LEFT JOIN %s AS o ON %s", target, strings.Join(fromMatch, " AND "))
	}
	keyMatch := strings.Join(match, " AND ")
	loadedDeleted := pgquote.Ident(m.LoadedColumn) + ", " + pgquote.Ident(m.DeletedColumn)
	switch {
	case st.upserts == 0:
	case !st.absent:
		var excluded []string
		for _, c := range st.t.columns {
			if !slices.Contains(m.Key, c.name) {
				excluded = append(excluded, fmt.Sprintf("%[1]s = EXCLUDED.%[1]s", pgquote.Ident(c.name)))
			}
		}
		excluded = append(excluded, pgquote.Ident(m.LoadedColumn)+" = EXCLUDED."+pgquote.Ident(m.LoadedColumn), pgquote.Ident(m.DeletedColumn)+" = NULL")
		if _, err := g.tx.Exec(ctx, fmt.Sprintf(upsertMirrorSQL, target, st.name, strings.Join(cols, ", "), strings.Join(vals, ", "),
			pgquote.Idents(m.Key), strings.Join(excluded, ", "), loadedDeleted), g.ingestedAt); err != nil {
			return "", fmt.Errorf("upsert into %s: %w", target, err)
		}
	default:
		if _, err := g.tx.Exec(ctx, fmt.Sprintf(updateMirrorSQL, target, st.name, strings.Join(sets, ", "), keyMatch, join), g.ingestedAt); err != nil {
			return "", fmt.Errorf("update %s: %w", target, err)
		}
		if _, err := g.tx.Exec(ctx, fmt.Sprintf(insertMirrorSQL, target, st.name, strings.Join(cols, ", "), strings.Join(vals, ", "), pgquote.Idents(m.Key),
			loadedDeleted, join), g.ingestedAt); err != nil {
			return "", fmt.Errorf("insert into %s: %w", target, err)
		}
	}
	return keyMatch, nil
}

// freshBackoff is the number of chunks of a mirror that stage their
// fresh rows after a COPY of fresh rows met a stored key: a workload that
// re-inserts soft-deleted keys pays for the failed COPY once in so many
// chunks.
const freshBackoff = 100

// maxFreshSavepoints bounds the savepoints of fresh rows in one group (a
// group holds at least one whole source transaction, however large): a
// transaction with more than 64 subtransaction IDs overflows the cache
// PostgreSQL keeps of them, and every snapshot taken on the warehouse
// meanwhile looks into pg_subtrans. Later chunks of such a group stage
// their fresh rows.
const maxFreshSavepoints = 32

// copyFresh reports whether the next chunk of mirror target COPYs its
// fresh rows, counting the chunk.
func (a *applier) copyFresh(target string) bool {
	a.freshMu.Lock()
	defer a.freshMu.Unlock()
	if a.freshOff[target] > 0 {
		a.freshOff[target]--
		return false
	}
	return true
}

// insertFresh COPYs a chunk's fresh rows into the mirror, under the
// savepoint applyTable set; the savepoint is left in place (a RELEASE
// would cost a round trip). It reports false, having rolled the savepoint
// back, when a row's key is in the mirror already: the rows are then to
// be staged, and the table's next chunks stage theirs (freshBackoff).
func (a *applier) insertFresh(ctx context.Context, g *group, st *stageRows) (bool, error) {
	m := st.t.mirror
	target := m.Target.Sanitize()
	w := copytext.New()
	defer w.Release()
	cols := make([]string, len(st.t.columns))
	for i, c := range st.t.columns {
		cols[i] = pgquote.Ident(c.name)
	}
	for _, s := range st.fresh {
		for _, c := range st.t.columns {
			w.Value(s.cols[c.name])
		}
		w.Time(g.ingestedAt)
		w.Null()
		w.End()
	}
	_, err := w.CopyFrom(ctx, g.tx.Conn().PgConn(),
		fmt.Sprintf(copyFreshSQL, target, strings.Join(cols, ", "), pgquote.Ident(m.LoadedColumn)+", "+pgquote.Ident(m.DeletedColumn)))
	if err == nil {
		return true, nil
	}
	if !pgerr.UniqueViolation(err) {
		return false, fmt.Errorf("insert into %s: %w", target, err)
	}
	if _, err := g.tx.Exec(ctx, rollbackToFreshSQL); err != nil {
		return false, fmt.Errorf("insert into %s: %w", target, err)
	}
	a.freshMu.Lock()
	if a.freshOff == nil {
		a.freshOff = map[string]int{}
	}
	a.freshOff[target] = freshBackoff
	a.freshMu.Unlock()
	return false, nil
}

// applyDeletes flags or removes the staged deletes of a table.
func (a *applier) applyDeletes(ctx context.Context, g *group, st *stageRows, keyMatch string) error {
	m := st.t.mirror
	target := m.Target.Sanitize()
	del := fmt.Sprintf(flagMirrorSQL, target, st.name, pgquote.Ident(m.DeletedColumn), keyMatch)
	if m.Hard {
		del = fmt.Sprintf(removeMirrorSQL, target, st.name, "", keyMatch)
	}
	if _, err := g.tx.Exec(ctx, del); err != nil {
		return fmt.Errorf("delete from %s: %w", target, err)
	}
	return nil
}
