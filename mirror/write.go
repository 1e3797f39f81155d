package mirror

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/copytext"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
)

// Writer writes folded changes (Changes) to mirrors, one warehouse
// transaction (Txn) at a time or several at once. It remembers, per
// mirror, whether inserts of new keys are worth COPYing straight into it
// (see freshBackoff).
type Writer struct {
	// mu guards freshOff: per mirror, the number of runs that stage their
	// fresh rows rather than COPY them, after a COPY of fresh rows met a
	// stored key.
	mu       sync.Mutex
	freshOff map[string]int
}

// Txn is the writes of one warehouse transaction to mirrors: the stages
// it has created and the savepoints it has set, which last until it ends.
type Txn struct {
	w        *Writer
	tx       pgx.Tx
	loadedAt time.Time
	staged   map[string]bool
	// savepoints counts the savepoints of fresh rows this transaction
	// has set: each may hold a subtransaction ID until it ends.
	savepoints int
	written    Written
	// shared: the transaction is not the Txn's alone (BeginShared).
	shared bool
}

// Written counts the mirror rows a Txn wrote, by how.
type Written struct {
	// Copied are upserts of keys a run inserted, COPYed straight into the
	// mirror; Merged the other upserts, staged and merged; Deleted the
	// staged deletes, flagged or removed.
	Copied, Merged, Deleted int64
}

// Begin starts the writes of transaction tx, whose rows are loaded at
// loadedAt (the mirrors' loaded column). tx is a whole transaction that
// no other Txn writes to: the stages it creates are its own until it
// ends.
func (w *Writer) Begin(tx pgx.Tx, loadedAt time.Time) *Txn {
	return &Txn{w: w, tx: tx, loadedAt: loadedAt, staged: map[string]bool{}}
}

// BeginShared is Begin for a transaction that other Txns write to as
// well, or a savepoint that may be rolled back: each stage is emptied
// when the Txn first uses it.
func (w *Writer) BeginShared(tx pgx.Tx, loadedAt time.Time) *Txn {
	t := w.Begin(tx, loadedAt)
	t.shared = true
	return t
}

// Written returns the rows the transaction has written so far.
func (t *Txn) Written() Written { return t.written }

// Write writes the net changes of c: per key one upsert or one delete.
// Each relation's rows are written with at most a COPY into a stage, an
// upsert or an UPDATE and an INSERT, and a delete; keys a run inserted
// first are COPYed straight into the mirror where it lacks them.
func (t *Txn) Write(ctx context.Context, c *Changes) error {
	byRel := map[*Relation]*stageRows{}
	var rels []*Relation
	for _, s := range c.states {
		st := byRel[s.rel]
		if st == nil {
			st = newStageRows(s.rel)
			st.copyFresh = t.savepoints < maxFreshSavepoints && t.w.copyFresh(s.rel.Mirror.Target.Sanitize())
			byRel[s.rel] = st
			rels = append(rels, s.rel)
		}
		if st.copyFresh && (s.fresh || s.freshDeleted()) {
			st.fresh = append(st.fresh, s)
			continue
		}
		if s.delete {
			if s.before != nil && !s.rel.Mirror.Hard {
				st.upsert(s.before)
			}
			st.delete(s)
			continue
		}
		st.upsert(s)
	}
	for _, r := range rels {
		if err := t.writeRelation(ctx, byRel[r]); err != nil {
			return err
		}
	}
	return nil
}

// stageRows are the net changes of one relation in a run: staged, or
// fresh.
type stageRows struct {
	r       *Relation
	name    string // the temp table
	ddl     string
	w       *copytext.Rows
	upserts int  // upserts staged
	deletes int  // deletes staged
	absent  bool // some upsert lacks a column
	renamed bool // some upsert takes columns from an old key

	copyFresh bool     // fresh rows are COPYed into the mirror
	fresh     []*state // the fresh rows, when they are

	// positioned: the stage has positions and JSON or typed rows (see
	// newPositionedStage).
	positioned bool
	// jsonNames are, for JSON rows, each column's name as a JSON object
	// key followed by a colon.
	jsonNames map[string]string
}

func newStageRows(r *Relation) *stageRows {
	if r.JSON || r.Position != "" {
		return newPositionedStage(r)
	}
	h := fnv.New64a()
	var from []string
	for _, k := range r.Mirror.Key {
		c, _ := r.Mirror.Column(k)
		from = append(from, pgquote.Ident("tidemark from "+k)+" "+c.Type)
		fmt.Fprintf(h, "%s\x00%s\x00", k, c.Type)
	}
	cols := typedColumns(r, h)
	name := pgquote.Ident("pg_temp", fmt.Sprintf("tidemark_cdc_%016x", h.Sum64()))
	return &stageRows{r: r, name: name, w: copytext.New(),
		ddl: fmt.Sprintf(createStageSQL, name, strings.Join(from, ", "), strings.Join(cols, ", "))}
}

// typedColumns returns the stage's columns of r's rows, each in its
// mirror column's type (text for a column the mirror lacks), and writes
// their names and types to h, which names the stage.
func typedColumns(r *Relation, h io.Writer) []string {
	cols := make([]string, 0, len(r.Columns))
	for _, c := range r.Columns {
		typ := "text"
		if mc, ok := r.Mirror.Column(c); ok {
			typ = mc.Type
		}
		cols = append(cols, pgquote.Ident(c)+" "+typ)
		fmt.Fprintf(h, "%s\x00%s\x00", c, typ)
	}
	return cols
}

// upsert stages an upsert.
func (st *stageRows) upsert(s *state) {
	st.upserts++
	st.w.Text("upsert")
	st.w.Time(s.at.Time)
	var absent []string
	for _, c := range st.r.Columns {
		if _, ok := s.cols[c]; !ok {
			absent = append(absent, c)
		}
	}
	st.w.TextArray(absent)
	st.absent = st.absent || len(absent) > 0
	if st.positioned {
		st.positions(s)
		st.row(s.cols, false)
		return
	}
	for _, k := range st.r.Mirror.Key {
		if s.from == nil || len(absent) == 0 {
			st.w.Null()
			continue
		}
		st.renamed = true
		st.w.Value(s.from[k])
	}
	for _, c := range st.r.Columns {
		if v, ok := s.cols[c]; ok {
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
		if s.delete {
			st.upsert(s.before)
			st.delete(s)
			continue
		}
		st.upsert(s)
	}
	st.fresh = nil
}

// delete stages a delete.
func (st *stageRows) delete(s *state) {
	st.deletes++
	st.w.Text("delete")
	st.w.Time(s.at.Time)
	st.w.Null()
	if st.positioned {
		st.positions(s)
		st.row(s.key, true)
		return
	}
	for range st.r.Mirror.Key {
		st.w.Null()
	}
	for _, c := range st.r.Columns {
		if v, ok := s.key[c]; ok && slices.Contains(st.r.Mirror.Key, c) {
			st.w.Value(v)
		} else {
			st.w.Null()
		}
	}
	st.w.End()
}

// writeRelation writes a relation's fresh rows, and its staged upserts and
// deletes, to its mirror.
func (t *Txn) writeRelation(ctx context.Context, st *stageRows) error {
	defer st.w.Release()
	// The stage is created by the transaction's first Write that uses it
	// and emptied by the later ones (it empties itself at COMMIT). A
	// Write with fresh rows sends the savepoint they are copied under in the
	// same round trip, after it.
	staged := false
	stage := func(then string) error {
		q := fmt.Sprintf(truncateStageSQL, st.name)
		if !t.staged[st.name] {
			q = st.ddl
			if t.shared {
				q += "; " + fmt.Sprintf(truncateStageSQL, st.name)
			}
		}
		if then != "" {
			q += "; " + then
		}
		if _, err := t.tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("stage of %s: %w", st.r.Name, err)
		}
		t.staged[st.name], staged = true, true
		return nil
	}
	if len(st.fresh) > 0 && t.savepoints >= maxFreshSavepoints {
		// Earlier relations of the run used the transaction's last
		// savepoints.
		st.stageFresh()
	}
	if len(st.fresh) > 0 {
		if st.upserts+st.deletes > 0 {
			if err := stage(savepointFreshSQL); err != nil {
				return err
			}
		} else if _, err := t.tx.Exec(ctx, savepointFreshSQL); err != nil {
			return fmt.Errorf("insert into %s: %w", st.r.Mirror.Target.Sanitize(), err)
		}
		t.savepoints++
		copied, err := t.insertFresh(ctx, st)
		if err != nil {
			return err
		}
		if copied {
			for _, s := range st.fresh {
				t.written.Copied++
				if s.delete {
					t.written.Deleted++
				}
			}
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
	if _, err := st.w.CopyFrom(ctx, t.tx.Conn().PgConn(), fmt.Sprintf(copyStageSQL, st.name)); err != nil {
		return fmt.Errorf("stage of %s: %w", st.r.Name, err)
	}
	if st.positioned {
		return t.writePositioned(ctx, st)
	}
	keyMatch, err := t.writeUpserts(ctx, st)
	if err != nil {
		return err
	}
	t.written.Merged += int64(st.upserts)
	if st.deletes == 0 {
		return nil
	}
	if err := t.writeDeletes(ctx, st, keyMatch); err != nil {
		return err
	}
	t.written.Deleted += int64(st.deletes)
	return nil
}

// writeUpserts writes the relation's staged upserts to its mirror: one
// INSERT ... ON CONFLICT when every staged row has all its columns, or an
// UPDATE and an INSERT when some lack values the source did not send
// (unchanged TOAST values), which the mirror row keeps (or, for a row
// whose key changed, takes from the old key's row). It returns the
// condition matching a staged row (s) to its mirror row (t) by key.
func (t *Txn) writeUpserts(ctx context.Context, st *stageRows) (string, error) {
	m := st.r.Mirror
	target := m.Target.Sanitize()
	var match, fromMatch, sets, cols, vals []string
	for _, k := range m.Key {
		match = append(match, fmt.Sprintf("t.%[1]s = s.%[1]s", pgquote.Ident(k)))
		fromMatch = append(fromMatch, fmt.Sprintf("o.%s = s.%s", pgquote.Ident(k), pgquote.Ident("tidemark from "+k)))
	}
	oldFound := fmt.Sprintf("o.%s IS NOT NULL", pgquote.Ident(m.Key[0]))
	for _, c := range st.r.Columns {
		q := pgquote.Ident(c)
		cols = append(cols, q)
		switch {
		case slices.Contains(m.Key, c):
			// A row is matched by its key, so its key columns keep their
			// values; a distributed mirror refuses a SET of its
			// distribution column, even to the same value.
			vals = append(vals, "s."+q)
		case !st.absent:
			sets = append(sets, fmt.Sprintf("%[1]s = s.%[1]s", q))
			vals = append(vals, "s."+q)
		default:
			absent := fmt.Sprintf(`%s = ANY(s."tidemark absent")`, pgquote.Literal(c))
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
		for _, c := range st.r.Columns {
			if !slices.Contains(m.Key, c) {
				excluded = append(excluded, fmt.Sprintf("%[1]s = EXCLUDED.%[1]s", pgquote.Ident(c)))
			}
		}
		excluded = append(excluded, pgquote.Ident(m.LoadedColumn)+" = EXCLUDED."+pgquote.Ident(m.LoadedColumn), pgquote.Ident(m.DeletedColumn)+" = NULL")
		if _, err := t.tx.Exec(ctx, fmt.Sprintf(upsertMirrorSQL, target, st.name, strings.Join(cols, ", "), strings.Join(vals, ", "),
			pgquote.Idents(m.Key), strings.Join(excluded, ", "), loadedDeleted), t.loadedAt); err != nil {
			return "", fmt.Errorf("upsert into %s: %w", target, err)
		}
	default:
		if _, err := t.tx.Exec(ctx, fmt.Sprintf(updateMirrorSQL, target, st.name, strings.Join(sets, ", "), keyMatch, join), t.loadedAt); err != nil {
			return "", fmt.Errorf("update %s: %w", target, err)
		}
		if _, err := t.tx.Exec(ctx, fmt.Sprintf(insertMirrorSQL, target, st.name, strings.Join(cols, ", "), strings.Join(vals, ", "), pgquote.Idents(m.Key),
			loadedDeleted, join), t.loadedAt); err != nil {
			return "", fmt.Errorf("insert into %s: %w", target, err)
		}
	}
	return keyMatch, nil
}

// freshBackoff is the number of Writes to a mirror that stage their fresh
// rows after a COPY of fresh rows met a stored key: a workload that
// re-inserts soft-deleted keys pays for the failed COPY once in so many
// Writes.
const freshBackoff = 100

// maxFreshSavepoints bounds the savepoints of fresh rows in one
// transaction (which may hold a whole source transaction, however large):
// a transaction with more than 64 subtransaction IDs overflows the cache
// PostgreSQL keeps of them, and every snapshot taken on the warehouse
// meanwhile looks into pg_subtrans. Later Writes of such a transaction
// stage their fresh rows.
const maxFreshSavepoints = 32

// copyFresh reports whether the next Write to mirror target COPYs its
// fresh rows, counting the Write.
func (w *Writer) copyFresh(target string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freshOff[target] > 0 {
		w.freshOff[target]--
		return false
	}
	return true
}

// insertFresh COPYs a run's fresh rows into the mirror, under the
// savepoint writeRelation set; the savepoint is left in place (a RELEASE
// would cost a round trip). Each row goes as freshRow gives it, with its
// position for a relation with a position column. It reports false,
// having rolled the savepoint back, when a row's key is in the mirror
// already (for a positioned mirror: a change sent again, a tombstone, a
// re-insert): the rows are then to be staged, positions compared there,
// and the mirror's next Writes stage theirs (freshBackoff).
func (t *Txn) insertFresh(ctx context.Context, st *stageRows) (bool, error) {
	r, m := st.r, st.r.Mirror
	target := m.Target.Sanitize()
	if m.Hard && r.Position != "" {
		return false, fmt.Errorf("mirror %s: a mirror with a position column keeps its deletes soft", target)
	}
	rows := copytext.New()
	defer rows.Release()
	for _, s := range st.fresh {
		row, deleted := s.freshRow()
		for _, c := range r.Columns {
			rows.Value(row.cols[c])
		}
		rows.Time(t.loadedAt)
		if deleted != nil {
			rows.Time(*deleted)
		} else {
			rows.Null()
		}
		if r.Position != "" {
			if s.at.Position == nil {
				rows.Null()
			} else {
				rows.Text(positionText(s.at.Position))
			}
		}
		rows.End()
	}
	own := pgquote.Ident(m.LoadedColumn) + ", " + pgquote.Ident(m.DeletedColumn)
	if r.Position != "" {
		own += ", " + pgquote.Ident(r.Position)
	}
	return t.copyFresh(ctx, rows, target, pgquote.Idents(r.Columns), own)
}

// copyFresh COPYs rows, the fresh rows of a run built by the caller, into
// target's columns cols and own (tidemark's columns), under the savepoint
// the run took. A key the mirror already holds fails the COPY: it rolls
// back to the savepoint, backs off the target (freshBackoff) and returns
// false, for the caller to stage the rows instead.
func (t *Txn) copyFresh(ctx context.Context, rows *copytext.Rows, target, cols, own string) (bool, error) {
	_, err := rows.CopyFrom(ctx, t.tx.Conn().PgConn(), fmt.Sprintf(copyFreshSQL, target, cols, own))
	if err == nil {
		return true, nil
	}
	if !pgerr.UniqueViolation(err) {
		return false, fmt.Errorf("insert into %s: %w", target, err)
	}
	if _, err := t.tx.Exec(ctx, rollbackToFreshSQL); err != nil {
		return false, fmt.Errorf("insert into %s: %w", target, err)
	}
	t.w.backOff(target)
	return false, nil
}

// backOff makes the next freshBackoff Writes to mirror target stage their
// fresh rows.
func (w *Writer) backOff(target string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freshOff == nil {
		w.freshOff = map[string]int{}
	}
	w.freshOff[target] = freshBackoff
}

// writeDeletes flags or removes the staged deletes of a relation.
func (t *Txn) writeDeletes(ctx context.Context, st *stageRows, keyMatch string) error {
	m := st.r.Mirror
	target := m.Target.Sanitize()
	del := fmt.Sprintf(flagMirrorSQL, target, st.name, pgquote.Ident(m.DeletedColumn), keyMatch)
	if m.Hard {
		del = fmt.Sprintf(removeMirrorSQL, target, st.name, "", keyMatch)
	}
	if _, err := t.tx.Exec(ctx, del); err != nil {
		return fmt.Errorf("delete from %s: %w", target, err)
	}
	return nil
}
