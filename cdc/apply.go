package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/raw"
)

// SQL of applying changes. A group of source transactions is applied in ONE
// warehouse transaction: its raw change rows, its ledger rows, the changes
// to the mirrors and the position of its last transaction.
const (
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

	// mirrors writes the folded changes of every group's chunks.
	mirrors mirror.Writer

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
	// mirrors is the group's writes to mirrors; it counts the rows they
	// wrote, by how (see tidemark_cdc_mirror_rows_total).
	mirrors *mirror.Txn
	ops     map[string]int64 // the group's changes by operation
	ledger  raw.Ledger
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

	// resyncs are the resync chunks the group applies.
	resyncs []resyncStep
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
		mirrors: a.mirrors.Begin(tx, ingestedAt), ops: map[string]int64{}, ingestedAt: ingestedAt}
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
		err = a.writeResync(ctx, g)
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
	if err := a.recordResyncKeys(ctx, g, changes); err != nil {
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

// applyMirrors folds the changes per table and key, in order, and writes
// the result to the mirrors through the group's mirror.Txn: one upsert or
// delete per key.
func (a *applier) applyMirrors(ctx context.Context, g *group, changes []change) error {
	if len(changes) == 0 {
		return nil
	}
	folded := mirror.NewChanges(len(changes))
	for _, c := range changes {
		var err error
		switch c.op {
		case opInsert:
			err = folded.Insert(&c.table.rel, c.newRow, mirror.At{Time: c.commitTime})
		case opUpdate, opSnapshot:
			err = folded.Update(&c.table.rel, c.oldRow, c.newRow, mirror.At{Time: c.commitTime})
		case opDelete:
			err = folded.Delete(&c.table.rel, c.oldRow, mirror.At{Time: c.commitTime})
		}
		if err != nil {
			return fmt.Errorf("cdc: %w", err)
		}
	}
	return g.mirrors.Write(ctx, folded)
}
