package cdc

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/ingest"
	"github.com/tidemark-dev/tidemark/mirror"
)

// SQL of applying changes. A group of source transactions is applied in ONE
// warehouse transaction: its raw change rows, its ledger rows, the changes
// to the mirrors and the position of its last transaction.
const (
	createStageSQL = `
CREATE TEMP TABLE IF NOT EXISTS tidemark_cdc_raw (
    event_id text, event_time timestamptz, op text, source_table text,
    payload jsonb, row_key text, old_row jsonb, commit_lsn text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS tidemark_cdc_apply (
    source_table text, kind text, at timestamptz, payload jsonb
) ON COMMIT DELETE ROWS`
	truncateStageSQL = `TRUNCATE pg_temp.tidemark_cdc_raw, pg_temp.tidemark_cdc_apply`

	// insertRawSQL moves the staged change rows into raw.<source>; %s is
	// the raw table.
	insertRawSQL = `
INSERT INTO %s (event_id, event_time, ingested_at, op, source_table, payload, row_key, old_row, commit_lsn)
SELECT event_id, event_time, $1, op, source_table, coalesce(payload, old_row, '{}'), row_key, old_row, commit_lsn::pg_lsn
FROM pg_temp.tidemark_cdc_raw`

	// updateMirrorSQL updates the mirror rows of staged upserts; a column
	// the change did not carry (an unchanged TOAST value) keeps its stored
	// value. %[1]s mirror, %[2]s SET list, %[3]s key match of t and r.
	updateMirrorSQL = `
UPDATE %[1]s AS t SET %[2]s
FROM pg_temp.tidemark_cdc_apply AS s CROSS JOIN LATERAL jsonb_populate_record(NULL::%[1]s, s.payload) AS r
WHERE s.source_table = $1 AND s.kind = 'upsert' AND %[3]s`

	// insertMirrorSQL inserts the staged upserts whose key the mirror does
	// not have. %[1]s mirror, %[2]s columns, %[3]s r's columns, %[4]s key
	// match of t and r, %[5]s loaded and deleted columns.
	insertMirrorSQL = `
INSERT INTO %[1]s (%[2]s, %[5]s)
SELECT %[3]s, $2, NULL
FROM pg_temp.tidemark_cdc_apply AS s CROSS JOIN LATERAL jsonb_populate_record(NULL::%[1]s, s.payload) AS r
WHERE s.source_table = $1 AND s.kind = 'upsert' AND NOT EXISTS (SELECT 1 FROM %[1]s AS t WHERE %[4]s)`

	// flagMirrorSQL marks staged deletes (soft); removeMirrorSQL removes
	// them (hard). %[1]s mirror, %[2]s deleted column, %[3]s key match.
	flagMirrorSQL = `
UPDATE %[1]s AS t SET %[2]s = s.at
FROM pg_temp.tidemark_cdc_apply AS s CROSS JOIN LATERAL jsonb_populate_record(NULL::%[1]s, s.payload) AS r
WHERE s.source_table = $1 AND s.kind = 'delete' AND %[3]s AND t.%[2]s IS NULL`
	removeMirrorSQL = `
DELETE FROM %[1]s AS t
USING pg_temp.tidemark_cdc_apply AS s CROSS JOIN LATERAL jsonb_populate_record(NULL::%[1]s, s.payload) AS r
WHERE s.source_table = $1 AND s.kind = 'delete' AND %[3]s`

	// truncateFlagSQL and truncateRemoveSQL apply a TRUNCATE of the source
	// table. %[1]s mirror, %[2]s deleted column.
	truncateFlagSQL   = `UPDATE %[1]s SET %[2]s = $1 WHERE %[2]s IS NULL`
	truncateRemoveSQL = `DELETE FROM %[1]s`

	// advancePositionSQL stores the end of the group's last transaction.
	advancePositionSQL = `
UPDATE tidemark.cdc_positions SET
    applied_lsn = greatest(applied_lsn, $2::pg_lsn),
    last_commit_time = $3,
    transactions = transactions + $4,
    changes = changes + $5,
    updated_at = $6
WHERE source = $1`
)

// stagedRawColumns are the columns of tidemark_cdc_raw.
var stagedRawColumns = []string{"event_id", "event_time", "op", "source_table", "payload", "row_key", "old_row", "commit_lsn"}

// stagedApplyColumns are the columns of tidemark_cdc_apply.
var stagedApplyColumns = []string{"source_table", "kind", "at", "payload"}

// applier writes groups of source transactions to the warehouse.
type applier struct {
	pool     *pgxpool.Pool
	source   string
	raw      *ingest.RawTable
	now      func() time.Time
	truncate bool // apply TRUNCATE to the mirrors
	chunk    int  // changes folded and applied at a time

	ddl  *pgx.Conn // raw partition DDL, outside the load transaction
	conn *pgxpool.Conn
	tx   pgx.Tx

	pending []change // not yet written, in order
	buckets map[time.Time]*bucket
	// The group so far: transactions, changes, the end of the last
	// transaction and its commit time.
	txns, changes int64
	end           pglogrepl.LSN
	lastCommit    time.Time
	ingestedAt    time.Time
}

type bucket struct {
	rows     int64
	min, max time.Time
}

// open reports whether a group is open.
func (a *applier) open() bool { return a.tx != nil }

// begin opens a group if none is open.
func (a *applier) begin(ctx context.Context) error {
	if a.tx != nil {
		return nil
	}
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("warehouse: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		return fmt.Errorf("warehouse: %w", err)
	}
	if err := mirror.SetLocal(ctx, tx); err != nil {
		_ = tx.Rollback(ctx)
		conn.Release()
		return fmt.Errorf("warehouse: %w", err)
	}
	if _, err := tx.Exec(ctx, createStageSQL); err != nil {
		_ = tx.Rollback(ctx)
		conn.Release()
		return fmt.Errorf("staging tables: %w", err)
	}
	a.conn, a.tx = conn, tx
	a.buckets = map[time.Time]*bucket{}
	a.txns, a.changes, a.end = 0, 0, 0
	a.ingestedAt = a.now()
	return nil
}

// add queues a change of the open group, writing a chunk when it is full.
// A truncate is applied at once, after the changes before it.
func (a *applier) add(ctx context.Context, c change) error {
	a.pending = append(a.pending, c)
	a.changes++
	if c.op == opTruncate || len(a.pending) >= a.chunk {
		return a.flush(ctx)
	}
	return nil
}

// done records that a source transaction of the group is complete.
func (a *applier) done(end pglogrepl.LSN, commitTime time.Time) {
	a.txns++
	a.end = max(a.end, end)
	a.lastCommit = commitTime
}

// rollback abandons the open group.
func (a *applier) rollback(ctx context.Context) {
	if a.tx != nil {
		_ = a.tx.Rollback(context.WithoutCancel(ctx))
		a.conn.Release()
	}
	a.tx, a.conn, a.pending = nil, nil, nil
}

// commit writes what is pending, the ledger and the position, and commits
// the group. It returns the end of the group's last transaction.
func (a *applier) commit(ctx context.Context) (pglogrepl.LSN, error) {
	if a.tx == nil {
		return 0, nil
	}
	if err := a.flush(ctx); err != nil {
		a.rollback(ctx)
		return 0, err
	}
	if err := a.ledger(ctx); err != nil {
		a.rollback(ctx)
		return 0, err
	}
	if _, err := a.tx.Exec(ctx, advancePositionSQL, a.source, a.end.String(), a.lastCommit, a.txns, a.changes, a.ingestedAt); err != nil {
		a.rollback(ctx)
		return 0, fmt.Errorf("store the position: %w", err)
	}
	err := a.tx.Commit(ctx)
	a.conn.Release()
	a.tx, a.conn = nil, nil
	if err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return a.end, nil
}

// flush writes the pending changes: their raw change rows, one for each,
// and their effect on the mirrors, folded per key so that a key changed
// several times is written once.
func (a *applier) flush(ctx context.Context) error {
	if len(a.pending) == 0 {
		return nil
	}
	changes := a.pending
	a.pending = nil
	if err := a.ensurePartitions(ctx, changes); err != nil {
		return err
	}
	if _, err := a.tx.Exec(ctx, truncateStageSQL); err != nil {
		return fmt.Errorf("staging tables: %w", err)
	}
	_, err := a.tx.CopyFrom(ctx, pgx.Identifier{"tidemark_cdc_raw"}, stagedRawColumns, pgx.CopyFromSlice(len(changes), func(i int) ([]any, error) {
		c := &changes[i]
		var key any
		r := c.newRow
		if r == nil {
			r = c.oldRow
		}
		if r != nil {
			if k, ok := c.table.keyOf(r); ok {
				key = k
			}
		}
		return []any{fmt.Sprintf("%s/%d", c.commitLSN, c.seq), c.commitTime, c.op, c.table.name,
			jsonArg(c.table.json(c.newRow)), key, jsonArg(c.table.json(c.oldRow)), c.commitLSN.String()}, nil
	}))
	if err != nil {
		return fmt.Errorf("stage change rows: %w", err)
	}
	if _, err := a.tx.Exec(ctx, fmt.Sprintf(insertRawSQL, a.raw.Ident()), a.ingestedAt); err != nil {
		return fmt.Errorf("write %s: %w", a.raw.Ident(), err)
	}
	for _, c := range changes {
		h := c.commitTime.UTC().Truncate(time.Hour)
		b := a.buckets[h]
		if b == nil {
			b = &bucket{min: c.commitTime, max: c.commitTime}
			a.buckets[h] = b
		}
		b.rows++
		b.min, b.max = minTime(b.min, c.commitTime), maxTime(b.max, c.commitTime)
	}
	// A truncate can only be the last change of a chunk (add flushes at
	// once): fold and apply what came before it, then the truncate.
	last := changes[len(changes)-1]
	if last.op == opTruncate {
		changes = changes[:len(changes)-1]
	}
	if err := a.applyMirrors(ctx, changes); err != nil {
		return err
	}
	if last.op == opTruncate && a.truncate {
		m := last.table.mirror
		q := fmt.Sprintf(truncateFlagSQL, m.Target.Sanitize(), quote(m.DeletedColumn))
		args := []any{last.commitTime}
		if m.Hard {
			q, args = fmt.Sprintf(truncateRemoveSQL, m.Target.Sanitize()), nil
		}
		if _, err := a.tx.Exec(ctx, q, args...); err != nil {
			return fmt.Errorf("truncate %s: %w", m.Target.Sanitize(), err)
		}
	}
	return nil
}

// state is the net effect of a chunk's changes on one key.
type state struct {
	table  *table
	delete bool
	at     time.Time
	cols   row // upsert: the columns known; absent ones keep their stored value
	key    row // delete: the key columns
	// before is, for a delete, the row as this chunk had upserted it:
	// with soft deletes it is written and then flagged, so that the
	// mirror keeps it whether or not the upsert and the delete fall into
	// the same chunk.
	before row
}

// applyMirrors folds the changes per table and key, in order, and writes
// the result: one upsert or delete per key.
func (a *applier) applyMirrors(ctx context.Context, changes []change) error {
	if len(changes) == 0 {
		return nil
	}
	type tk struct {
		table *table
		key   string
	}
	states := map[tk]*state{}
	var order []tk
	set := func(k tk, s *state) {
		if _, ok := states[k]; !ok {
			order = append(order, k)
		}
		states[k] = s
	}
	for _, c := range changes {
		t := c.table
		switch c.op {
		case opInsert, opUpdate:
			newKey, ok := t.keyOf(c.newRow)
			if !ok {
				return fmt.Errorf("cdc: %s: a row without its key columns %v", t.name, t.mirror.Key)
			}
			if c.oldRow != nil {
				if oldKey, ok := t.keyOf(c.oldRow); ok && oldKey != newKey {
					// The key changed: the old key is gone.
					set(tk{t, oldKey}, &state{table: t, delete: true, at: c.commitTime, key: c.oldRow, before: upserted(states[tk{t, oldKey}])})
				}
			}
			k := tk{t, newKey}
			cols := make(row, len(c.newRow))
			if prev := states[k]; prev != nil && !prev.delete && c.op == opUpdate {
				for name, v := range prev.cols {
					cols[name] = v
				}
			}
			for name, v := range c.newRow {
				cols[name] = v
			}
			set(k, &state{table: t, cols: cols, at: c.commitTime})
		case opDelete:
			key, ok := t.keyOf(c.oldRow)
			if !ok {
				return fmt.Errorf("cdc: %s: a delete without the key columns %v (check the table's replica identity)", t.name, t.mirror.Key)
			}
			set(tk{t, key}, &state{table: t, delete: true, at: c.commitTime, key: c.oldRow, before: upserted(states[tk{t, key}])})
		}
	}
	tables := map[*table]bool{}
	rows := make([][]any, 0, len(order))
	for _, k := range order {
		s := states[k]
		tables[s.table] = true
		kind, payload := "upsert", s.cols
		if s.delete {
			kind, payload = "delete", s.key
			if s.before != nil && !s.table.mirror.Hard {
				rows = append(rows, []any{s.table.name, "upsert", s.at, jsonArg(s.table.json(s.before))})
			}
		}
		rows = append(rows, []any{s.table.name, kind, s.at, jsonArg(s.table.json(payload))})
	}
	if _, err := a.tx.CopyFrom(ctx, pgx.Identifier{"tidemark_cdc_apply"}, stagedApplyColumns, pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("stage mirror changes: %w", err)
	}
	for t := range tables {
		if err := a.applyTable(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// upserted returns the columns of an upsert state, or nil.
func upserted(s *state) row {
	if s == nil || s.delete {
		return nil
	}
	return s.cols
}

// applyTable writes the staged upserts and deletes of one table.
func (a *applier) applyTable(ctx context.Context, t *table) error {
	m := t.mirror
	target := m.Target.Sanitize()
	var match, sets, cols, rcols []string
	for _, k := range m.Key {
		match = append(match, fmt.Sprintf("t.%[1]s = r.%[1]s", quote(k)))
	}
	for _, c := range t.columns {
		q := quote(c.name)
		cols = append(cols, q)
		rcols = append(rcols, "r."+q)
		sets = append(sets, fmt.Sprintf("%[1]s = CASE WHEN s.payload ? %[2]s THEN r.%[1]s ELSE t.%[1]s END", q, literal(c.name)))
	}
	sets = append(sets, quote(m.LoadedColumn)+" = $2", quote(m.DeletedColumn)+" = NULL")
	keyMatch := strings.Join(match, " AND ")
	if _, err := a.tx.Exec(ctx, fmt.Sprintf(updateMirrorSQL, target, strings.Join(sets, ", "), keyMatch), t.name, a.ingestedAt); err != nil {
		return fmt.Errorf("update %s: %w", target, err)
	}
	if _, err := a.tx.Exec(ctx, fmt.Sprintf(insertMirrorSQL, target, strings.Join(cols, ", "), strings.Join(rcols, ", "), keyMatch,
		quote(m.LoadedColumn)+", "+quote(m.DeletedColumn)), t.name, a.ingestedAt); err != nil {
		return fmt.Errorf("insert into %s: %w", target, err)
	}
	del := fmt.Sprintf(flagMirrorSQL, target, quote(m.DeletedColumn), keyMatch)
	if m.Hard {
		del = fmt.Sprintf(removeMirrorSQL, target, "", keyMatch)
	}
	if _, err := a.tx.Exec(ctx, del, t.name); err != nil {
		return fmt.Errorf("delete from %s: %w", target, err)
	}
	return nil
}

// ensurePartitions creates the raw partitions the changes' commit times
// need, on a connection of its own.
func (a *applier) ensurePartitions(ctx context.Context, changes []change) error {
	times := make([]time.Time, len(changes))
	for i, c := range changes {
		times[i] = c.commitTime
	}
	missing := a.raw.Missing(times)
	if len(missing) == 0 {
		return nil
	}
	if a.ddl == nil || a.ddl.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, a.pool.Config().ConnConfig.Copy())
		if err != nil {
			return fmt.Errorf("warehouse connection for raw partitions: %w", err)
		}
		a.ddl = conn
	}
	return a.raw.EnsurePartitions(ctx, a.ddl, missing)
}

// ledger writes the group's ledger rows, one per UTC hour of commit time.
func (a *applier) ledger(ctx context.Context) error {
	if len(a.buckets) == 0 {
		return nil
	}
	var (
		sources     []string
		hours       []time.Time
		counts      []int64
		mins, maxes []time.Time
	)
	for h, b := range a.buckets {
		sources, hours, counts = append(sources, a.source), append(hours, h), append(counts, b.rows)
		mins, maxes = append(mins, b.min), append(maxes, b.max)
	}
	if _, err := a.tx.Exec(ctx, ingest.InsertLedgerSQL, a.ingestedAt, sources, hours, counts, mins, maxes); err != nil {
		return fmt.Errorf("write ledger: %w", err)
	}
	return nil
}

// close releases the applier's connections.
func (a *applier) close(ctx context.Context) {
	a.rollback(ctx)
	if a.ddl != nil {
		_ = a.ddl.Close(context.WithoutCancel(ctx))
		a.ddl = nil
	}
}

// jsonArg passes JSON text to COPY as jsonb, or NULL.
func jsonArg(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

func quote(name string) string { return pgx.Identifier{name}.Sanitize() }

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
