package cdc

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/copybinary"
	"github.com/tidemark-dev/tidemark/internal/copytext"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/raw"
)

// SQL of applying changes. A group of source transactions is applied in ONE
// warehouse transaction: its raw change rows, its ledger rows, the changes
// to the mirrors and the position of its last transaction.
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

// applier writes groups of source transactions to the warehouse.
//
// Groups are pipelined: while one group commits in the background, the
// next is received and its raw change rows are written in a transaction
// of its own. Everything a group does that depends on the groups before
// it (its mirror changes, its ledger and position, its COMMIT) waits until
// the group before it has committed, so the warehouse commits groups in
// source order and each group's statements see the mirror the earlier
// groups left. A group whose predecessor failed fails too.
//
// The stream drives a group through begin, add (changes, written a chunk
// at a time in the background), txnDone (per source transaction), and
// commit, which commits in the background; takeCommitted hands back the
// result, and rollback abandons everything under way. Each await names
// what it waits for: awaitChunk the group's chunk in flight,
// awaitPrevCommit the group before's commit, awaitTurn both (the stream
// then uses the transaction itself), awaitBackground every write in
// flight, awaitClosed one channel while the source is kept answered.
type applier struct {
	pool     *pgxpool.Pool
	source   string
	raw      *raw.Table
	now      func() time.Time
	truncate bool // apply TRUNCATE to the mirrors
	// rawBinary: the raw table has raw.ChangeColumns' types, and change
	// rows are COPYed in binary, which the server reads at about four
	// fifths of the CPU of text; text serves a table created beforehand
	// with other types.
	rawBinary bool
	chunk     int // changes folded and applied at a time
	// waitTimeout bounds the writing of a chunk, and each step of a
	// commit after the group before has committed
	// (warehouse.write_timeout).
	waitTimeout time.Duration
	// keep is how often a transaction that waits for the group before
	// runs a statement (see awaitPrevCommit).
	keep time.Duration
	// keepalive, when set, is how the stream waits for a chunk being
	// written: it keeps answering the source meanwhile.
	keepalive func(ctx context.Context, done <-chan struct{}) error

	ddlMu sync.Mutex
	ddl   *pgx.Conn // raw partition DDL, outside the load transactions

	// freshMu guards freshOff: per mirror, the number of chunks that
	// stage their fresh rows rather than COPY them, after a COPY of fresh
	// rows met a stored key.
	freshMu  sync.Mutex
	freshOff map[string]int

	g *group // the open group, nil when none is
	// committing are the groups whose commit has started, oldest first,
	// until the stream has taken their result.
	committing []*group
	last       *group // the group committed most recently
}

// group is one warehouse transaction: a run of source transactions.
type group struct {
	conn *pgxpool.Conn
	tx   pgx.Tx
	// ctx is what the group's background writes and its commit run
	// under: it outlives a stop of the stream by commitGrace, so that a
	// complete group is not thrown away at shutdown; release ends it.
	ctx     context.Context
	release context.CancelFunc
	// prev is the group committed before this one, nil once it has
	// committed (or when there was none).
	prev *group

	pending []change // not yet written, in order
	// inflight reports the end of the chunk being written in the
	// background, nil when none is. One chunk is written while the next
	// is received and decoded.
	inflight *writing
	staged   map[string]bool  // stages this group has used
	ops      map[string]int64 // the group's changes by operation
	ledger   raw.Ledger
	// savepoints counts the savepoints of fresh rows this group has set:
	// each may hold a subtransaction ID until the group ends.
	savepoints int
	// copied, merged and deleted count the mirror rows the group's
	// chunks wrote, by how (see tidemark_cdc_mirror_rows_total).
	copied, merged, deleted int64
	// The group so far: transactions, changes, the end of the last
	// transaction and its commit time.
	txns, changes int64
	end           pglogrepl.LSN
	lastCommit    time.Time
	ingestedAt    time.Time

	// done is closed when the group's commit has finished: err is nil
	// when it committed, and committedAt is when.
	done        chan struct{}
	err         error
	committedAt time.Time
}

// open reports whether a group is open.
func (a *applier) open() bool { return a.g != nil }

// busy reports whether a group is open or committing: changes have been
// received that the warehouse may not hold yet.
func (a *applier) busy() bool { return a.g != nil || len(a.committing) > 0 }

// changes is the number of changes of the open group.
func (a *applier) changes() int64 {
	if a.g == nil {
		return 0
	}
	return a.g.changes
}

// begin opens a group if none is open.
func (a *applier) begin(ctx context.Context) error {
	if a.g != nil {
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
	err = mirror.SetLocal(ctx, tx)
	if err == nil {
		err = durable(ctx, tx)
	}
	if err != nil {
		_ = tx.Rollback(ctx)
		conn.Release()
		return fmt.Errorf("warehouse: %w", err)
	}
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(commitGrace, cancel) })
	// The raw rows carry the ingestion time in COPY data and the ledger as
	// a bound parameter; at PostgreSQL's precision both are the same value,
	// which the reconciler relies on to find a load's raw rows.
	ingestedAt := a.now().Truncate(time.Microsecond)
	// A group's changes are mostly as many as the last one's: room for
	// that many (up to a chunk) spares growing the slice change by change.
	var room int
	if a.last != nil {
		room = int(min(a.last.changes, int64(a.chunk)))
	}
	a.g = &group{conn: conn, tx: tx, ctx: gctx, release: func() { stop(); cancel() }, prev: a.last, done: make(chan struct{}),
		pending: make([]change, 0, room),
		staged:  map[string]bool{}, ops: map[string]int64{}, ingestedAt: ingestedAt}
	a.last = a.g
	return nil
}

// add queues a change of the open group, writing a chunk in the
// background when it is full. A truncate is applied at once, after the
// changes before it.
func (a *applier) add(ctx context.Context, c change) error {
	g := a.g
	g.pending = append(g.pending, c)
	g.changes++
	g.ops[c.op]++
	if c.op == opTruncate || len(g.pending) >= a.chunk {
		if g.inflight != nil {
			if err := a.awaitClosed(ctx, g.inflight.done); err != nil {
				return err
			}
		}
		if err := g.awaitChunk(); err != nil {
			return err
		}
		changes := g.pending
		g.pending = make([]change, 0, a.chunk)
		ch := &writing{done: make(chan struct{})}
		g.inflight = ch
		go func() {
			ch.err = a.write(g.ctx, g, changes)
			close(ch.done)
		}()
	}
	return nil
}

// writing is a chunk of a group being written in the background: done is
// closed when it is written, err then says how.
type writing struct {
	done chan struct{}
	err  error
}

// awaitChunk waits for the group's chunk being written, if any, and returns its
// error. Whoever uses the group's transaction waits first.
func (g *group) awaitChunk() error {
	if g.inflight == nil {
		return nil
	}
	<-g.inflight.done
	err := g.inflight.err
	g.inflight = nil
	return err
}

// awaitPrevCommit waits until the group before g has committed. g's transaction
// has written its raw change rows and waits its turn, as long as that
// group's remaining writes and commit take: a statement every a.keep
// keeps it from counting as idle, so that the warehouse's
// idle_in_transaction_session_timeout ends a session whose client is
// gone, not one that waits behind a slow but working group. Nobody else
// uses g's transaction meanwhile.
func (a *applier) awaitPrevCommit(ctx context.Context, g *group) error {
	if g.prev == nil {
		return nil
	}
	t := time.NewTicker(a.keep)
	defer t.Stop()
	for done := false; !done; {
		select {
		case <-g.prev.done:
			done = true
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := a.ping(ctx, g); err != nil {
				return fmt.Errorf("warehouse: waiting for the group before: %w", err)
			}
		}
	}
	if err := g.prev.err; err != nil {
		return fmt.Errorf("the group before failed: %w", err)
	}
	g.prev = nil
	return nil
}

// keepOpen runs a statement in the open group's transaction, unless a
// chunk of the group is being written (which keeps it busy, or waits in
// awaitPrevCommit, which runs its own) or failed (the transaction is aborted,
// and the stream reports that chunk's error when it next writes): a group
// that waits for a commit slot, or for the groups committing to finish,
// holds its transaction open, and must not idle past
// idle_in_transaction_session_timeout meanwhile. Only the stream starts
// chunks, and it is the caller, so the transaction stays free while the
// statement runs.
func (a *applier) keepOpen(ctx context.Context) error {
	g := a.g
	if g == nil {
		return nil
	}
	if g.inflight != nil {
		select {
		case <-g.inflight.done:
			if g.inflight.err != nil {
				return nil
			}
		default:
			return nil
		}
	}
	if err := a.ping(ctx, g); err != nil {
		return fmt.Errorf("warehouse: waiting to commit: %w", err)
	}
	return nil
}

// ping runs a statement in g's transaction, within write_timeout, so that
// a transaction that waits does not count as idle.
func (a *applier) ping(ctx context.Context, g *group) error {
	ctx, cancel := context.WithTimeout(ctx, a.waitTimeout)
	defer cancel()
	_, err := g.tx.Exec(ctx, pingSQL)
	return err
}

// awaitTurn waits until the open group's transaction is free and every
// earlier group has committed, so that the stream may use the transaction
// itself (for DDL that locks the mirror, say).
func (a *applier) awaitTurn(ctx context.Context) error {
	if err := a.g.awaitChunk(); err != nil {
		return err
	}
	return a.awaitPrevCommit(ctx, a.g)
}

// awaitBackground waits until nothing is written in the background: the groups
// committing have finished (the stream takes their results later) and the
// open group's chunk is written.
func (a *applier) awaitBackground(ctx context.Context) error {
	for _, g := range a.committing {
		if err := a.awaitClosed(ctx, g.done); err != nil {
			return err
		}
	}
	if a.g == nil {
		return nil
	}
	if a.g.inflight != nil {
		if err := a.awaitClosed(ctx, a.g.inflight.done); err != nil {
			return err
		}
	}
	return a.g.awaitChunk()
}

// awaitClosed waits until done is closed, through keepalive when it is set.
func (a *applier) awaitClosed(ctx context.Context, done <-chan struct{}) error {
	if a.keepalive != nil {
		return a.keepalive(ctx, done)
	}
	<-done
	return nil
}

// writePendingOf awaits the background writes, then writes the open
// group's pending changes when some are of table t: before t's columns
// change, its rows decoded with the old columns are written with them.
func (a *applier) writePendingOf(ctx context.Context, t *table) error {
	if err := a.awaitBackground(ctx); err != nil {
		return err
	}
	g := a.g
	if g == nil || !slices.ContainsFunc(g.pending, func(c change) bool { return c.table == t }) {
		return nil
	}
	changes := g.pending
	g.pending = make([]change, 0, a.chunk)
	return a.write(g.ctx, g, changes)
}

// txnDone records that a source transaction of the group is complete.
func (a *applier) txnDone(end pglogrepl.LSN, commitTime time.Time) {
	g := a.g
	g.txns++
	g.end = max(g.end, end)
	g.lastCommit = commitTime
}

// rollback abandons the open group and waits for the groups committing.
func (a *applier) rollback(ctx context.Context) {
	if g := a.g; g != nil {
		g.release() // a chunk under way stops at once
		_ = g.awaitChunk()
		pgconnect.Rollback(ctx, g.tx)
		g.conn.Release()
		g.err = errors.New("rolled back")
		close(g.done)
		a.g = nil
	}
	for _, g := range a.committing {
		<-g.done
	}
	a.committing, a.last = nil, nil
}

// commit starts committing the open group in the background: it writes
// what is pending, the ledger and the position once the group before has
// committed, and commits. takeCommitted reports the result.
func (a *applier) commit() {
	g := a.g
	if g == nil {
		return
	}
	a.g = nil
	a.committing = append(a.committing, g)
	go func() {
		defer g.release()
		g.err = a.commitGroup(g.ctx, g)
		g.committedAt = time.Now()
		close(g.done)
	}()
}

// commitGrace is how long a group's commit may go on after the stream is
// stopped.
const commitGrace = 30 * time.Second

// commitGroup writes the rest of a group and commits it.
func (a *applier) commitGroup(ctx context.Context, g *group) error {
	err := g.awaitChunk()
	if err == nil && len(g.pending) > 0 {
		changes := g.pending
		g.pending = nil
		err = a.write(ctx, g, changes)
	}
	if err == nil {
		err = a.awaitPrevCommit(ctx, g)
	}
	ctx, cancel := context.WithTimeout(ctx, a.waitTimeout)
	defer cancel()
	if err == nil {
		err = a.ledger(ctx, g)
	}
	if err == nil {
		if _, err = g.tx.Exec(ctx, advancePositionSQL, a.source, g.end.String(), g.lastCommit, g.txns, g.changes, g.ingestedAt); err != nil {
			err = fmt.Errorf("store the position: %w", err)
		}
	}
	if err != nil {
		pgconnect.Rollback(ctx, g.tx)
		g.conn.Release()
		return err
	}
	err = g.tx.Commit(ctx)
	g.conn.Release()
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// takeCommitted returns the oldest group whose commit has started, once it has
// finished (waiting for it when block is set), or nil.
func (a *applier) takeCommitted(block bool) *group {
	if len(a.committing) == 0 {
		return nil
	}
	g := a.committing[0]
	if block {
		<-g.done
	} else {
		select {
		case <-g.done:
		default:
			return nil
		}
	}
	a.committing = a.committing[1:]
	return g
}

// write writes a chunk of changes: their raw change rows, one for each,
// and, once the group before has committed, their effect on the mirrors,
// folded per key so that a key changed several times is written once.
//
// Each of the two is bounded by a.waitTimeout on its own. The wait for the group
// before is not: that group's writes and commit have deadlines of their
// own, and a chunk whose deadline also ran while it waited would time out
// behind a slow but working predecessor, failing the stream again and
// again while a backlog is applied.
func (a *applier) write(ctx context.Context, g *group, changes []change) error {
	wctx, cancel := context.WithTimeout(ctx, a.waitTimeout)
	err := a.ensurePartitions(wctx, changes)
	if err == nil {
		err = a.writeRaw(wctx, g, changes)
	}
	cancel()
	if err != nil {
		return err
	}
	for _, c := range changes {
		g.ledger.Add(a.source, c.commitTime)
	}
	if err := a.awaitPrevCommit(ctx, g); err != nil {
		return err
	}
	ctx, cancel = context.WithTimeout(ctx, a.waitTimeout)
	defer cancel()
	// A truncate can only be the last change of a chunk (add flushes at
	// once): fold and apply what came before it, then the truncate.
	last := changes[len(changes)-1]
	if last.op == opTruncate {
		changes = changes[:len(changes)-1]
	}
	if err := a.applyMirrors(ctx, g, changes); err != nil {
		return err
	}
	if last.op == opTruncate && a.truncate {
		m := last.table.mirror
		q := fmt.Sprintf(truncateFlagSQL, m.Target.Sanitize(), pgquote.Ident(m.DeletedColumn))
		args := []any{last.commitTime}
		if m.Hard {
			q, args = fmt.Sprintf(truncateRemoveSQL, m.Target.Sanitize()), nil
		}
		if _, err := g.tx.Exec(ctx, q, args...); err != nil {
			return fmt.Errorf("truncate %s: %w", m.Target.Sanitize(), err)
		}
	}
	return nil
}

// writeRaw writes one raw change row per change with COPY.
func (a *applier) writeRaw(ctx context.Context, g *group, changes []change) error {
	var err error
	if a.rawBinary {
		_, err = g.tx.Conn().PgConn().CopyFrom(ctx, rawRows(g, changes), raw.ChangeColumns.CopySQL(a.raw.Ident(), true))
	} else {
		w := rawText(g, changes)
		defer w.Release()
		_, err = g.tx.Conn().PgConn().CopyFrom(ctx, w.Data(), raw.ChangeColumns.CopySQL(a.raw.Ident(), false))
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", a.raw.Ident(), err)
	}
	return nil
}

// rawRows encodes the change rows of changes in binary, as the server
// reads them. A row's payload is the row after the change, or what the
// source sent of the old row, or {}; old_row the old row or key sent.
func rawRows(g *group, changes []change) *copybinary.Reader {
	at := copybinary.Micros(g.ingestedAt)
	var (
		lsn     pglogrepl.LSN
		lsnText string
	)
	jsonb := func(b []byte, t *table, r row) []byte {
		b, f := copybinary.OpenJSONB(b)
		return copybinary.Close(t.appendJSON(b, r), f)
	}
	return copybinary.NewReader(len(changes), func(b []byte, i int) []byte {
		c := &changes[i]
		if lsnText == "" || c.commitLSN != lsn {
			lsn, lsnText = c.commitLSN, c.commitLSN.String()
		}
		b = copybinary.Fields(b, len(raw.ChangeColumns))
		b, f := copybinary.Open(b)
		b = append(append(b, lsnText...), '/')
		b = copybinary.Close(strconv.AppendInt(b, int64(c.seq), 10), f)
		b = copybinary.Time(b, c.commitTime)
		b = copybinary.Int64(b, at)
		b = copybinary.Text(b, c.op)
		b = copybinary.Text(b, c.table.name)
		r := c.newRow
		if r == nil {
			r = c.oldRow
		}
		if r != nil {
			b = jsonb(b, c.table, r)
		} else {
			b = copybinary.JSONB(b, []byte("{}"))
		}
		if k, ok := c.table.keyOf(r); ok {
			b = copybinary.Text(b, k)
		} else {
			b = copybinary.Null(b)
		}
		if c.oldRow != nil {
			b = jsonb(b, c.table, c.oldRow)
		} else {
			b = copybinary.Null(b)
		}
		return copybinary.LSN(b, uint64(c.commitLSN))
	})
}

// rawText encodes the change rows of changes as COPY text, with the
// values rawRows encodes.
func rawText(g *group, changes []change) *copytext.Rows {
	w := copytext.New()
	var (
		lsn     pglogrepl.LSN
		lsnText string
	)
	for i := range changes {
		c := &changes[i]
		if lsnText == "" || c.commitLSN != lsn {
			lsn, lsnText = c.commitLSN, c.commitLSN.String()
		}
		payload, old := c.table.json(c.newRow), c.table.json(c.oldRow)
		if payload == nil {
			payload = old
		}
		if payload == nil {
			payload = []byte("{}")
		}
		w.Text(lsnText + "/" + strconv.Itoa(c.seq))
		w.Time(c.commitTime)
		w.Time(g.ingestedAt)
		w.Text(c.op)
		w.Text(c.table.name)
		w.Bytes(payload)
		r := c.newRow
		if r == nil {
			r = c.oldRow
		}
		if k, ok := c.table.keyOf(r); ok {
			w.Text(k)
		} else {
			w.Null()
		}
		w.Bytes(old)
		w.Text(lsnText)
		w.End()
	}
	return w
}

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
	if _, err := g.tx.Conn().PgConn().CopyFrom(ctx, st.w.Data(), fmt.Sprintf(copyStageSQL, st.name)); err != nil {
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
	_, err := g.tx.Conn().PgConn().CopyFrom(ctx, w.Data(),
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

// ensurePartitions creates the raw partitions the changes' commit times
// need, on a connection of its own (which two groups' writes share).
func (a *applier) ensurePartitions(ctx context.Context, changes []change) error {
	times := make([]time.Time, len(changes))
	for i, c := range changes {
		times[i] = c.commitTime
	}
	missing := a.raw.Missing(times)
	if len(missing) == 0 {
		return nil
	}
	a.ddlMu.Lock()
	defer a.ddlMu.Unlock()
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
func (a *applier) ledger(ctx context.Context, g *group) error {
	return g.ledger.Write(ctx, g.tx, g.ingestedAt)
}

// close releases the applier's connections.
func (a *applier) close(ctx context.Context) {
	a.rollback(ctx)
	if a.ddl != nil {
		pgconnect.Close(ctx, a.ddl)
		a.ddl = nil
	}
}
