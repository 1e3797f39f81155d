package mirror

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Row is a row of a change: its values in PostgreSQL's text form by column
// name, nil for NULL. A column absent from the map was not sent (an
// unchanged TOASTed value, or a column outside the key of an old key
// tuple): applying the row keeps its stored value.
type Row map[string]*string

// Relation is a source table as a stream of changes sends its rows: its
// mirror, and the names of the columns of its rows, in the source's order.
type Relation struct {
	Name    string // the source table, for errors
	Mirror  *Table
	Columns []string
	// JSON says that the rows' values are JSON texts (nil for null),
	// which the warehouse converts to the mirror's column types as
	// jsonb_populate_record does; otherwise they are the text forms of
	// those types.
	JSON bool
	// Position, when set, is the mirror's bigint[] column holding the
	// source position of the change that wrote each row: a change at or
	// below it is not applied, so that a change sent again never moves a
	// row backwards, and a delete of a key the mirror lacks leaves a
	// flagged row holding its position. Such a mirror's deletes are soft.
	Position string
}

// At is where a change stands: when it was committed at the source, and
// for a relation with a position column, its position there.
type At struct {
	Time     time.Time
	Position []int64
	// Truncated, when not nil, is the time of a truncate of the source
	// table that came after this change (which arrived late): the row it
	// leaves is flagged deleted at that time.
	Truncated *time.Time
}

// KeyOf returns the key of a row as text (the value for one key column, a
// JSON array of the values for several) and whether the row has every key
// column. A table without key columns gives no row a key: "[]" would fold
// all its rows into one.
func (t *Table) KeyOf(r Row) (string, bool) {
	if len(t.Key) == 0 {
		return "", false
	}
	vals := make([]string, len(t.Key))
	for i, k := range t.Key {
		v, ok := r[k]
		if !ok || v == nil {
			return "", false
		}
		vals[i] = *v
	}
	if len(vals) == 1 {
		return vals[0], true
	}
	b, _ := json.Marshal(vals)
	return string(b), true
}

// Changes folds a run of row changes per relation and key, in order: the
// net effect on each key is one upsert or one delete, which a Txn writes.
// The zero value is empty and ready to use.
type Changes struct {
	// states are in the order their keys first appeared; index finds a
	// relation's keys. Most runs are of one relation: last caches its
	// index.
	states []*state
	index  map[*Relation]map[string]int
	lastR  *Relation
	lastK  map[string]int
	room   int
}

// NewChanges returns an empty Changes with room for about n keys.
func NewChanges(n int) *Changes { return &Changes{room: n} }

// state is the net effect of a run's changes on one key.
type state struct {
	rel    *Relation
	delete bool
	at     At
	cols   Row // upsert: the columns known; absent ones keep their stored value
	// from is, for an upsert whose key changed, a row holding the old
	// key: columns absent from cols take the old key's stored values.
	from Row
	key  Row // delete: the key columns
	// before is, for a delete, the upsert this run made of the row: with
	// soft deletes it is written and then flagged, so that the mirror
	// keeps it whether or not the upsert and the delete fall into the
	// same run.
	before *state
	// fresh marks an upsert of a key whose first change in the run was an
	// insert, with every column and the same key since: the mirror most
	// likely lacks the key, and the row can be COPYed into it.
	fresh bool
}

// Len is the number of keys the changes touch.
func (c *Changes) Len() int { return len(c.states) }

func (c *Changes) keys(r *Relation) map[string]int {
	if r != c.lastR {
		if c.index == nil {
			c.index = map[*Relation]map[string]int{}
		}
		c.lastR, c.lastK = r, c.index[r]
		if c.lastK == nil {
			c.lastK = make(map[string]int, c.room)
			c.index[r] = c.lastK
		}
	}
	return c.lastK
}

func (c *Changes) get(r *Relation, key string) *state {
	if i, ok := c.keys(r)[key]; ok {
		return c.states[i]
	}
	return nil
}

func (c *Changes) set(r *Relation, key string, s *state) {
	k := c.keys(r)
	if i, ok := k[key]; ok {
		c.states[i] = s
		return
	}
	k[key] = len(c.states)
	c.states = append(c.states, s)
}

// Insert adds the insert of row.
func (c *Changes) Insert(r *Relation, row Row, at At) error {
	return c.upsert(r, nil, row, true, at)
}

// Update adds an update to row; old is the old row's key (or the whole old
// row) when the source sent it, nil otherwise. A key other than row's is a
// key change: the old key is deleted, and the columns row lacks are the
// old key's.
func (c *Changes) Update(r *Relation, old, row Row, at At) error {
	return c.upsert(r, old, row, false, at)
}

func (c *Changes) upsert(r *Relation, old, row Row, insert bool, at At) error {
	newKey, ok := r.Mirror.KeyOf(row)
	if !ok {
		return fmt.Errorf("%s: a row without its key columns %v", r.Name, r.Mirror.Key)
	}
	// prev is what the row was before this change, as far as the run
	// knows.
	prev := c.get(r, newKey)
	if stale(r, prev, at) {
		return nil
	}
	var from Row
	if old != nil {
		if oldKey, ok := r.Mirror.KeyOf(old); ok && oldKey != newKey {
			// The key changed: the old key is gone, and the row's unsent
			// columns are those of the old key.
			prev = c.get(r, oldKey)
			from = old
			c.set(r, oldKey, &state{rel: r, delete: true, at: at, key: old, before: upserted(prev)})
		}
	}
	// cols is the change's row itself unless an update adds to what the
	// run knows of it: no state's columns are changed once set.
	cols := row
	if p := upserted(prev); p != nil && !insert {
		if !covers(row, p.cols) {
			cols = maps.Clone(p.cols)
			maps.Copy(cols, row)
		}
		if p.from != nil {
			from = p.from
		}
	}
	// Fresh rows are COPYed as text into the mirror: not JSON rows. (A
	// row of a key the mirror lacks has no position to compare with;
	// the COPY fails when the mirror has the key.)
	fresh := from == nil && len(cols) == len(r.Columns) && !r.JSON
	if insert {
		fresh = fresh && prev == nil
	} else {
		p := upserted(prev)
		fresh = fresh && p != nil && p.fresh
	}
	c.set(r, newKey, &state{rel: r, cols: cols, from: from, at: at, fresh: fresh})
	return nil
}

// Delete adds the delete of the row whose key old holds.
func (c *Changes) Delete(r *Relation, old Row, at At) error {
	key, ok := r.Mirror.KeyOf(old)
	if !ok {
		return fmt.Errorf("%s: a delete without the key columns %v (check the table's replica identity)", r.Name, r.Mirror.Key)
	}
	prev := c.get(r, key)
	if stale(r, prev, at) {
		return nil
	}
	c.set(r, key, &state{rel: r, delete: true, at: at, key: old, before: upserted(prev)})
	return nil
}

// stale reports whether a change at at of a relation with a position
// column is at or below the position of prev, the run's change to the
// same key: sent again, or older than what the run has.
func stale(r *Relation, prev *state, at At) bool {
	return r.Position != "" && prev != nil && slices.Compare(at.Position, prev.at.Position) <= 0
}

// covers reports whether row has every column of cols: merged, they are
// row (an update that sends every column, as most do, is not copied).
func covers(row, cols Row) bool {
	if len(row) < len(cols) {
		return false
	}
	for c := range cols {
		if _, ok := row[c]; !ok {
			return false
		}
	}
	return true
}

// freshDeleted reports whether s is the soft delete of a fresh row: the
// row, which the mirror most likely lacks, can be COPYed into it already
// flagged, as the upsert and the flag that the delete stands for would
// leave it.
func (s *state) freshDeleted() bool {
	return s.delete && s.before != nil && s.before.fresh && !s.rel.Mirror.Hard
}

// freshRow is what the fresh state s (fresh, or freshDeleted) writes
// into its mirror: the row whose values it takes (s, or for a row
// inserted and deleted in the run the row before the delete) and when the
// row is flagged deleted: at the delete, at a truncate that came after
// the change (At.Truncated), or not at all (nil).
func (s *state) freshRow() (row *state, deletedAt *time.Time) {
	switch {
	case s.delete:
		return s.before, &s.at.Time
	case s.at.Truncated != nil:
		return s, s.at.Truncated
	}
	return s, nil
}

// upserted returns s when it is an upsert, or nil.
func upserted(s *state) *state {
	if s == nil || s.delete {
		return nil
	}
	return s
}
