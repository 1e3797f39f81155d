package cdc

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
)

// A resync copies a table again while its changes keep streaming, in
// chunks of its key order, without emptying its mirror: for `tidemark
// resync`, and for a table added to a running source.
//
// Each chunk is read in a snapshot S of the source between two marks that
// the reader writes into the source's WAL (logical messages, prefix
// resyncPrefix): low before S is taken, high after the rows are read. The
// stream applies the chunk when it reaches high, in the group being
// applied, as upserts of its rows (op "snapshot" in the raw change table),
// leaving out the rows whose key a transaction invisible to S has changed
// in what the stream already applied: those transactions are newer than
// the chunk's row, and the stream has applied them or will. They are the
// transactions committed after low (the window), and those still running
// when S was taken that the stream applied before low, which the stream
// knows because it records, for the table under resync, the keys each
// transaction changed since the resync began (dropping, after each chunk,
// the transactions older than its snapshot's xmin, which no later
// snapshot can miss). Before the first chunk, the reader waits until the
// transactions running when the recording began have ended: a snapshot
// can then miss no transaction the recording missed.
//
// The keys of every row copied or changed during the resync are kept in
// tidemark.cdc_resync_keys; when the last chunk is applied, the mirror's
// rows with no such key are removed (flagged, with soft deletes): the
// source no longer has them. The progress (the last key copied) is stored
// with each chunk, in the transaction that applies it, so that a resync
// stopped part-way goes on from there.

// resyncPrefix is the prefix of the marks' logical messages.
const resyncPrefix = "tidemark.resync"

// opSnapshot is the operation of a row a resync copied.
const opSnapshot = "snapshot"

// SQL of resyncs.
const (
	nextResyncSQL = `
SELECT source_table, generation, coalesce(last_key, '{}'), chunks
FROM tidemark.cdc_resyncs WHERE source = $1 AND state <> 'done' AND source_table = ANY ($2)
ORDER BY requested_at, source_table LIMIT 1`
	// startResyncSQL marks a resync copying; the rows planned ($5) are
	// those of its first start: a resync that goes on after a stop keeps
	// them.
	startResyncSQL = `
UPDATE tidemark.cdc_resyncs SET state = 'copying', started_at = coalesce(started_at, $4),
    rows_planned = CASE WHEN started_at IS NULL THEN $5 ELSE rows_planned END
WHERE source = $1 AND source_table = $2 AND generation = $3`
	chunkResyncSQL = `
UPDATE tidemark.cdc_resyncs SET last_key = $4, chunks = chunks + 1, rows_copied = rows_copied + $5
WHERE source = $1 AND source_table = $2 AND generation = $3`
	endResyncSQL = `
UPDATE tidemark.cdc_resyncs SET state = 'done', finished_at = $4, rows_removed = $5
WHERE source = $1 AND source_table = $2 AND generation = $3`
	addResyncKeysSQL = `
INSERT INTO tidemark.cdc_resync_keys (source, source_table, generation, row_key)
SELECT $1, $2, $3, unnest($4::text[]) ON CONFLICT DO NOTHING`
	resyncKeysSQL     = `SELECT row_key FROM tidemark.cdc_resync_keys WHERE source = $1 AND source_table = $2 AND generation = $3`
	dropResyncKeysSQL = `DELETE FROM tidemark.cdc_resync_keys WHERE source = $1 AND source_table = $2 AND generation = $3`

	emitMarkSQL      = `SELECT pg_logical_emit_message(false, '` + resyncPrefix + `', $1)`
	currentSnapSQL   = `SELECT pg_current_snapshot()::text`
	runningXactsSQL  = `SELECT count(*) FROM unnest($1::xid8[]) AS x WHERE pg_xact_status(x) = 'in progress'`
	resyncWaitXacts  = 100 * time.Millisecond
	resyncChunkLimit = 10 * time.Minute
	// resyncDepth is how many chunks of a resync are read ahead of the
	// stream applying them: the next is read while one is applied.
	resyncDepth = 2
)

// resync is the resync of one table that a run of the reader copies.
// The stream records and reads byXid and window; the driver sets the chunk
// between its marks, under mu.
type resync struct {
	t   *table
	gen int64
	// byXid are the keys of t that each transaction applied since the
	// resync began changed.
	byXid map[uint32]map[string]bool
	// window are the keys of t changed since the current chunk's low
	// mark; nil outside a window.
	window map[string]bool
	// unsent are, for the keys of t the stream changed since the resync
	// began, the columns that none of those changes sent (an update
	// leaves out an unchanged TOASTed value): the mirror may lack their
	// value, which a chunk that leaves the key out then fills in from
	// its row (see applyChunk). Keys with every column sent are absent.
	unsent map[string]map[string]bool

	mu sync.Mutex
	// chunks are the chunks read and not yet applied, in their order: at
	// most resyncDepth.
	chunks []*resyncChunk
}

// resyncChunk is one chunk of a resync.
type resyncChunk struct {
	id    string // the marks' text: generation, number, a nonce
	n     int64
	snap  snapshot
	rows  []row
	cols  []column // the rows' columns, as a relation message has them
	keys  []string // the rows' keys
	last  []string // the key columns' values of the last row; nil when none
	final bool     // the table ends with it
	at    time.Time
	ready bool // rows, keys, last, final and snap are set
	// applied is closed once the group applying the chunk has committed;
	// a group that fails ends the run, and with it the wait.
	applied chan struct{}
	once    sync.Once
}

// markApplied closes applied, once: a chunk read again from the slot
// after its group committed (a stream that stopped before a transaction
// and read the slot again) is applied, and committed, again.
func (c *resyncChunk) markApplied() { c.once.Do(func() { close(c.applied) }) }

// snapshot is a source snapshot, as pg_current_snapshot prints it, the
// transaction ids in 32 bits as pgoutput sends them.
type snapshot struct {
	xmin, xmax uint32
	xip        map[uint32]bool
}

// parseSnapshot parses "xmin:xmax:xip,xip".
func parseSnapshot(s string) (snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snapshot{}, fmt.Errorf("snapshot %q: not xmin:xmax:xip", s)
	}
	var snap snapshot
	for i, p := range parts[:2] {
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return snapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
		}
		if i == 0 {
			snap.xmin = uint32(v)
		} else {
			snap.xmax = uint32(v)
		}
	}
	snap.xip = map[uint32]bool{}
	if parts[2] != "" {
		for x := range strings.SplitSeq(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return snapshot{}, fmt.Errorf("snapshot %q: %w", s, err)
			}
			snap.xip[uint32(v)] = true
		}
	}
	return snap, nil
}

// precedes reports whether transaction id a is older than b, modulo 2^32
// as PostgreSQL compares them.
func precedes(a, b uint32) bool { return int32(a-b) < 0 }

// invisible reports whether the snapshot misses transaction x: x was
// running when it was taken, or began after.
func (s snapshot) invisible(x uint32) bool { return s.xip[x] || !precedes(x, s.xmax) }

// record notes that transaction xid changed key of the table under
// resync; the stream calls it for each such change it applies.
func (rs *resync) record(xid uint32, keys ...string) {
	m := rs.byXid[xid]
	if m == nil {
		m = map[string]bool{}
		rs.byXid[xid] = m
	}
	for _, k := range keys {
		m[k] = true
		if rs.window != nil {
			rs.window[k] = true
		}
	}
}

// mark handles a mark of the stream: the low mark of the chunk under way
// opens its window; its high mark returns the chunk, to be applied there.
func (rs *resync) mark(content string) *resyncChunk {
	id, kind, ok := strings.Cut(content, "|")
	if !ok {
		return nil
	}
	rs.mu.Lock()
	var c *resyncChunk
	for _, x := range rs.chunks {
		if x.id == id {
			c = x
		}
	}
	ready := c != nil && c.ready
	rs.mu.Unlock()
	if c == nil {
		return nil // a mark of a chunk given up
	}
	switch kind {
	case "low":
		rs.window = map[string]bool{}
	case "high":
		if ready && rs.window != nil {
			return c
		}
	}
	return nil
}

// forget drops c from the chunks under way, once it is applied.
func (rs *resync) forget(c *resyncChunk) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.chunks = slices.DeleteFunc(rs.chunks, func(x *resyncChunk) bool { return x == c })
}

// excluded returns the keys of c that the stream has seen changed by a
// transaction c's snapshot missed, and forgets the window.
func (rs *resync) excluded(c *resyncChunk) map[string]bool {
	out := rs.window
	if out == nil {
		out = map[string]bool{}
	}
	rs.window = nil
	for x, keys := range rs.byXid {
		if c.snap.invisible(x) {
			for k := range keys {
				out[k] = true
			}
		}
		if precedes(x, c.snap.xmin) {
			// No later snapshot misses it.
			delete(rs.byXid, x)
		}
	}
	return out
}

// applyChunk applies chunk c of the resync at lsn, the position of its
// high mark: its rows, but those a transaction it missed has changed, as
// one step of the open group (begun if none is), which is then committed.
func (s *stream) applyChunk(ctx context.Context, lsn pglogrepl.LSN, rs *resync, c *resyncChunk) error {
	skip := rs.excluded(c)
	if len(rs.t.columns) == 0 {
		// No relation message yet in this run: the chunk's columns are
		// the table's.
		rs.t.setColumns(c.cols)
	}
	known := make(map[string]bool, len(rs.t.columns))
	for _, col := range rs.t.columns {
		known[col.name] = true
	}
	if !s.a.open() {
		if err := s.a.begin(ctx); err != nil {
			return err
		}
		s.groupStart = time.Now()
	}
	copied := int64(0)
	for i, r := range c.rows {
		if skip[c.keys[i]] {
			// The stream's changes of the key win, but for the columns
			// none of them sent: those the chunk's row has as they are
			// (no change the chunk missed touched them).
			if missing := rs.unsent[c.keys[i]]; len(missing) > 0 {
				part := row{}
				for _, k := range rs.t.mirror.Key {
					part[k] = r[k]
				}
				for name := range missing {
					if v, ok := r[name]; ok && known[name] {
						part[name] = v
					}
				}
				ch := change{op: opSnapshot, table: rs.t, seq: i, commitLSN: lsn, commitTime: c.at, newRow: part}
				if err := s.a.add(ctx, ch); err != nil {
					return err
				}
			}
			delete(rs.unsent, c.keys[i])
			continue
		}
		delete(rs.unsent, c.keys[i])
		for name := range r {
			if !known[name] {
				// A column the stream has not described yet: its
				// relation message adds it to the mirror, and the
				// next change of the row brings its value.
				delete(r, name)
			}
		}
		copied++
		// Not marked for the resync: writeResync keeps every key of the
		// chunk, those left out included.
		ch := change{op: opSnapshot, table: rs.t, seq: i, commitLSN: lsn, commitTime: c.at, newRow: r}
		if err := s.a.add(ctx, ch); err != nil {
			return err
		}
	}
	s.a.g.resyncs = append(s.a.g.resyncs, resyncStep{rs: rs, c: c, copied: copied})
	if c.final {
		// The group ends the resync: the changes after it are no
		// longer the resync's.
		s.r.rs.CompareAndSwap(rs, nil)
	}
	// The group's last commit time stays the last source transaction's:
	// a chunk is no source transaction.
	at := s.commitTime
	if at.IsZero() {
		at = c.at
	}
	s.a.txnDone(lsn, at)
	return s.commitGroup(ctx)
}

// resyncStep is what a group does for a chunk it applies, after its
// changes: the keys and the progress, and after the last chunk, the
// sweep.
type resyncStep struct {
	rs     *resync
	c      *resyncChunk
	copied int64
}

// writeResync stores, in g's transaction, the progress of the chunks g
// applied; after a resync's last chunk it removes the mirror rows whose
// key the resync did not meet, and ends it.
func (a *applier) writeResync(ctx context.Context, g *group) error {
	for _, st := range g.resyncs {
		rs, c := st.rs, st.c
		name := rs.t.rel.Name
		if _, err := g.tx.Exec(ctx, addResyncKeysSQL, a.source, name, rs.gen, c.keys); err != nil {
			return fmt.Errorf("resync %s: store the keys: %w", name, err)
		}
		if _, err := g.tx.Exec(ctx, chunkResyncSQL, a.source, name, rs.gen, c.last, st.copied); err != nil {
			return fmt.Errorf("resync %s: store the progress: %w", name, err)
		}
		if !c.final {
			continue
		}
		removed, err := g.mirrors.Sweep(ctx, &rs.t.rel, resyncKeysSQL, a.source, name, rs.gen)
		if err != nil {
			return fmt.Errorf("resync %s: %w", name, err)
		}
		if _, err := g.tx.Exec(ctx, dropResyncKeysSQL, a.source, name, rs.gen); err != nil {
			return fmt.Errorf("resync %s: %w", name, err)
		}
		if _, err := g.tx.Exec(ctx, endResyncSQL, a.source, name, rs.gen, a.now(), removed); err != nil {
			return fmt.Errorf("resync %s: %w", name, err)
		}
	}
	return nil
}

// recordResyncKeys stores, in g's transaction, the keys of the changes to a
// table under resync: its sweep keeps them.
func (a *applier) recordResyncKeys(ctx context.Context, g *group, changes []change) error {
	var (
		keys []string
		t    *table
		gen  int64
	)
	for _, c := range changes {
		if c.resync == 0 {
			continue
		}
		t, gen = c.table, c.resync
		for _, r := range []row{c.newRow, c.oldRow} {
			if k, ok := c.table.keyOf(r); ok {
				keys = append(keys, k)
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if _, err := g.tx.Exec(ctx, addResyncKeysSQL, a.source, t.rel.Name, gen, keys); err != nil {
		return fmt.Errorf("resync %s: store the keys: %w", t.rel.Name, err)
	}
	return nil
}

// resyncs runs the resyncs of the source, one table at a time, while the
// stream runs: it copies the resync next installed (see nextResync), then
// waits for another, and ends with ctx (the run's), or with an error,
// which ends the run.
func (r *Reader) resyncs(ctx context.Context, tables map[string]*table, writeDSN string, next *pendingResync) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if next != nil {
			if writeDSN == "" {
				return fmt.Errorf("%w: resync of %s: the source is a standby: set sources.%s.cdc.primary_dsn, where the resync writes its marks",
					ErrSetup, next.rs.t.rel.Name, r.conf.Source)
			}
			if err := r.resyncTable(ctx, next, writeDSN); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if asked, err := r.newSlotAsked(ctx); err != nil || asked {
			return cmp.Or(err, errNewSlot)
		}
		var err error
		if next, err = r.nextResync(ctx, tables); err != nil {
			return err
		}
	}
}

// startResyncs installs the resync under way, before the run streams,
// and runs the resyncs of the source beside the stream (resyncs); an
// error of theirs ends the run through lose. The returned function stops
// them and waits.
func (r *Reader) startResyncs(ctx context.Context, tables map[string]*table, writeDSN string, lose context.CancelCauseFunc) (stop func(), err error) {
	next, err := r.nextResync(ctx, tables)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.resyncs(rctx, tables, writeDSN, next); err != nil && rctx.Err() == nil {
			lose(err)
		}
	}()
	return func() { cancel(); <-done; r.rs.Store(nil) }, nil
}

// pendingResync is a resync to copy, installed for the stream to record
// the changes of its table: from last (its key columns' values; empty:
// from the start), chunk n.
type pendingResync struct {
	rs   *resync
	last []string
	n    int64
}

// nextResync reads the next resync of the source that is not done and
// installs it (r.rs), so that the stream records its table's changes from
// then on; nil when there is none. A run installs the resync under way
// before it streams: a change the stream applies while it is not
// installed would escape the resync's sweep.
func (r *Reader) nextResync(ctx context.Context, tables map[string]*table) (*pendingResync, error) {
	var (
		name string
		p    pendingResync
		gen  int64
	)
	// A resync of a table cdc.tables no longer names waits until it is
	// named again, which starts it over (takeOnTables).
	err := r.pool.QueryRow(ctx, nextResyncSQL, r.conf.Source, r.tableNames()).Scan(&name, &gen, &p.last, &p.n)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the resyncs: %w", err)
	}
	t := tables[name]
	if t == nil {
		return nil, fmt.Errorf("%w: resync of %s: sources.%s.cdc.tables does not name it", ErrSetup, name, r.conf.Source)
	}
	p.rs = &resync{t: t, gen: gen, byXid: map[uint32]map[string]bool{}, unsent: map[string]map[string]bool{}}
	r.rs.Store(p.rs)
	return &p, nil
}

// resyncTable copies the table of p in chunks.
func (r *Reader) resyncTable(ctx context.Context, p *pendingResync, dsn string) error {
	rs, t, n, last := p.rs, p.rs.t, p.n, p.last
	gen := rs.gen
	defer r.rs.Store(nil)
	src, err := mirror.Connect(ctx, dsn, "tidemark-cdc-resync")
	if err != nil {
		return fmt.Errorf("resync %s: %w", t.rel.Name, err)
	}
	defer pgconnect.Close(ctx, src)
	planned, err := plannedRows(ctx, src, t.mirror.Source)
	if err != nil {
		// Only the progress shown needs it.
		r.log.Warn("resync: the source's estimate of the table's rows could not be read", "table", t.rel.Name, "error", err)
	}
	if _, err := r.pool.Exec(ctx, startResyncSQL, r.conf.Source, t.rel.Name, gen, r.now(), planned); err != nil {
		return fmt.Errorf("resync %s: %w", t.rel.Name, err)
	}
	defer r.m.resyncEnded(t.rel.Name)
	r.resyncProgress(ctx, t.rel.Name)
	if err := r.awaitRunning(ctx, src); err != nil {
		return fmt.Errorf("resync %s: %w", t.rel.Name, err)
	}
	r.log.Info("resync copying", "table", t.rel.Name, "generation", gen, "from_chunk", n)
	// The next chunk is read while the stream applies the one before:
	// its marks come after the high mark of that one, so that the
	// windows of two chunks never overlap.
	var (
		inFlight []*resyncChunk
		readAll  bool
	)
	for {
		if !readAll && len(inFlight) < resyncDepth {
			c, err := r.readChunk(ctx, src, rs, n, last)
			if err != nil {
				return fmt.Errorf("resync %s: %w", t.rel.Name, err)
			}
			inFlight = append(inFlight, c)
			readAll = c.final
			n, last = c.n+1, c.last
			continue
		}
		c := inFlight[0]
		inFlight = inFlight[1:]
		wctx, cancel := context.WithTimeout(ctx, resyncChunkLimit)
		select {
		case <-c.applied:
		case <-wctx.Done():
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case !isClosed(c.applied):
			return fmt.Errorf("resync %s: chunk %d was not applied within %s", t.rel.Name, c.n, resyncChunkLimit)
		}
		rs.forget(c)
		if asked, err := r.newSlotAsked(ctx); err != nil || asked {
			return cmp.Or(err, errNewSlot)
		}
		r.m.resyncRows.Add(float64(len(c.rows)))
		r.resyncProgress(ctx, t.rel.Name)
		if c.final {
			r.log.Info("resync done", "table", t.rel.Name, "generation", gen, "chunks", c.n+1)
			return nil
		}
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// awaitRunning waits until the transactions running on the source now
// have ended: the recording of the keys they change may have begun after
// the stream applied them.
func (r *Reader) awaitRunning(ctx context.Context, src *pgx.Conn) error {
	var text string
	if err := src.QueryRow(ctx, currentSnapSQL).Scan(&text); err != nil {
		return fmt.Errorf("read a snapshot: %w", err)
	}
	parts := strings.Split(text, ":")
	if len(parts) != 3 || parts[2] == "" {
		return nil
	}
	xids := strings.Split(parts[2], ",")
	logged := time.Now()
	for {
		var running int64
		if err := src.QueryRow(ctx, runningXactsSQL, xids).Scan(&running); err != nil {
			return fmt.Errorf("wait for the running transactions: %w", err)
		}
		if running == 0 {
			return nil
		}
		if time.Since(logged) > time.Minute {
			r.log.Info("resync waits for transactions open on the source", "running", running)
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(resyncWaitXacts):
		}
	}
}

// readChunk reads chunk n of rs's table, after last, between its marks.
func (r *Reader) readChunk(ctx context.Context, src *pgx.Conn, rs *resync, n int64, last []string) (*resyncChunk, error) {
	nonce := make([]byte, 6)
	_, _ = rand.Read(nonce)
	c := &resyncChunk{id: fmt.Sprintf("%d.%d.%s", rs.gen, n, hex.EncodeToString(nonce)), n: n, applied: make(chan struct{})}
	rs.mu.Lock()
	rs.chunks = append(rs.chunks, c)
	rs.mu.Unlock()
	if _, err := src.Exec(ctx, emitMarkSQL, c.id+"|low"); err != nil {
		return nil, fmt.Errorf("write the low mark: %w", err)
	}
	rows, cols, snap, err := r.selectChunk(ctx, src, rs.t, last)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(rows))
	for i, row := range rows {
		k, ok := rs.t.keyOf(row)
		if !ok {
			return nil, fmt.Errorf("a row without its key columns")
		}
		keys[i] = k
	}
	var lastKey []string
	if len(rows) > 0 {
		for _, k := range rs.t.mirror.Key {
			lastKey = append(lastKey, *rows[len(rows)-1][k])
		}
	}
	rs.mu.Lock()
	c.rows, c.cols, c.keys, c.snap, c.last, c.final, c.at, c.ready = rows, cols, keys, snap, lastKey, len(rows) < r.conf.ResyncChunkRows, r.now(), true
	rs.mu.Unlock()
	if _, err := src.Exec(ctx, emitMarkSQL, c.id+"|high"); err != nil {
		return nil, fmt.Errorf("write the high mark: %w", err)
	}
	return c, nil
}

// selectChunk reads, in one snapshot, up to resync_chunk_rows rows of t
// after last in its key order, each value in its text form.
func (r *Reader) selectChunk(ctx context.Context, src *pgx.Conn, t *table, last []string) ([]row, []column, snapshot, error) {
	m := t.mirror
	cols := make([]string, len(m.Columns))
	for i, c := range m.Columns {
		cols[i] = pgquote.Ident(c.Name)
	}
	keys := pgquote.Idents(m.Key)
	where, args := "", []any{}
	if len(last) > 0 {
		params := make([]string, len(last))
		for i, k := range m.Key {
			c, _ := m.Column(k)
			params[i] = fmt.Sprintf("$%d::%s", i+1, c.Type)
			args = append(args, last[i])
		}
		where = fmt.Sprintf("WHERE (%s) > (%s)", keys, strings.Join(params, ", "))
	}
	q := fmt.Sprintf("SELECT %s FROM %s %s ORDER BY %s LIMIT %d", strings.Join(cols, ", "), m.Source.Sanitize(), where, keys, r.conf.ResyncChunkRows)
	tx, err := src.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, nil, snapshot{}, err
	}
	defer pgconnect.Rollback(ctx, tx)
	var text string
	if err := tx.QueryRow(ctx, currentSnapSQL).Scan(&text); err != nil {
		return nil, nil, snapshot{}, fmt.Errorf("read the chunk's snapshot: %w", err)
	}
	snap, err := parseSnapshot(text)
	if err != nil {
		return nil, nil, snapshot{}, err
	}
	// In text, as pgoutput sends values: each type's output function.
	rows, err := tx.Query(ctx, q, append([]any{pgx.QueryResultFormats{pgx.TextFormatCode}}, args...)...)
	if err != nil {
		return nil, nil, snapshot{}, fmt.Errorf("read the chunk: %w", err)
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	colsOut := make([]column, len(fields))
	for i, f := range fields {
		colsOut[i] = column{name: f.Name, oid: f.DataTypeOID, mod: f.TypeModifier}
	}
	var out []row
	for rows.Next() {
		raw := rows.RawValues()
		rw := make(row, len(raw))
		for i, v := range raw {
			if v == nil {
				rw[colsOut[i].name] = nil
				continue
			}
			text := string(v)
			rw[colsOut[i].name] = &text
		}
		out = append(out, rw)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, snapshot{}, fmt.Errorf("read the chunk: %w", err)
	}
	return out, colsOut, snap, tx.Commit(ctx)
}

// resyncRecord records change c of transaction xid for the resync under
// way, when it changes the table being copied, and marks c so that the
// group keeps its key for the resync's sweep.
func (s *stream) resyncRecord(xid uint32, c *change) {
	rs := s.r.rs.Load()
	if rs == nil || c.table != rs.t {
		return
	}
	c.resync = rs.gen
	oldKey, hadOld := c.table.keyOf(c.oldRow)
	newKey, hasNew := c.table.keyOf(c.newRow)
	for _, k := range []string{oldKey, newKey} {
		if k != "" {
			rs.record(xid, k)
		}
	}
	rs.noteSent(c.op, oldKey, hadOld, newKey, hasNew, c.newRow)
}

// noteSent updates unsent for a change: a delete leaves nothing to fill
// in, an insert sends every column, an update those of its new row, over
// what the key held before (the old key's, when it changed).
func (rs *resync) noteSent(op, oldKey string, hadOld bool, newKey string, hasNew bool, newRow row) {
	if hadOld && (!hasNew || oldKey != newKey) {
		defer delete(rs.unsent, oldKey)
	}
	if !hasNew {
		return
	}
	if op == opInsert || len(newRow) >= len(rs.t.columns) {
		// Every column sent.
		delete(rs.unsent, newKey)
		return
	}
	from := rs.unsent[newKey]
	if hadOld && oldKey != newKey {
		from = rs.unsent[oldKey]
	}
	missing := map[string]bool{}
	if from == nil {
		// Nothing recorded of the key: what the mirror holds is unknown.
		for _, col := range rs.t.columns {
			missing[col.name] = true
		}
	} else {
		for name := range from {
			missing[name] = true
		}
	}
	for name := range newRow {
		delete(missing, name)
	}
	if len(missing) == 0 {
		delete(rs.unsent, newKey)
		return
	}
	rs.unsent[newKey] = missing
}

// logicalMessage handles a logical decoding message: a mark of the resync
// under way (others, such as heartbeats, are ignored). A chunk whose high
// mark came inside a transaction waits for its end.
func (s *stream) logicalMessage(ctx context.Context, m *pglogrepl.LogicalDecodingMessage) error {
	rs := s.r.rs.Load()
	if m.Prefix != resyncPrefix || m.Transactional || rs == nil {
		return nil
	}
	c := rs.mark(string(m.Content))
	if c == nil {
		return nil
	}
	if s.inTxn {
		s.deferred = append(s.deferred, c)
		return nil
	}
	return s.applyChunk(ctx, m.LSN, rs, c)
}

// applyDeferredChunk applies the chunk whose high mark came inside the
// transaction just received, at that transaction's end.
func (s *stream) applyDeferredChunk(ctx context.Context, end pglogrepl.LSN) error {
	cs := s.deferred
	s.deferred = nil
	rs := s.r.rs.Load()
	for _, c := range cs {
		if rs == nil {
			return nil
		}
		if err := s.applyChunk(ctx, end, rs, c); err != nil {
			return err
		}
		rs = s.r.rs.Load()
	}
	return nil
}

// SQL of resync requests.
const (
	// newResyncSQL asks for a resync of a table ($2) of a source ($1)
	// from its first row, as a new generation of its row, by $4 at $3,
	// where the resync before is in a state the WHERE clause appended
	// takes.
	newResyncSQL = `
INSERT INTO tidemark.cdc_resyncs AS r (source, source_table, generation, state, requested_at, requested_by)
VALUES ($1, $2, 1, 'pending', $3, $4)
ON CONFLICT (source, source_table) DO UPDATE SET
    generation = r.generation + 1, state = 'pending', requested_at = $3, requested_by = $4,
    started_at = NULL, finished_at = NULL, last_key = NULL, chunks = 0, rows_copied = 0, rows_removed = 0,
    rows_planned = NULL
`
	// requestResyncSQL asks for a resync unless one is under way: it
	// returns no row then.
	requestResyncSQL = newResyncSQL + `WHERE r.state = 'done' RETURNING generation`
	readResyncSQL    = `
SELECT generation, state, requested_at, requested_by, started_at, finished_at, chunks, rows_copied, rows_removed, rows_planned
FROM tidemark.cdc_resyncs WHERE source = $1 AND source_table = $2`
)

// Resync is the latest resync of a table, as tidemark.cdc_resyncs holds
// it.
type Resync struct {
	Source, Table string
	Generation    int64
	// State is pending (asked for), copying or done.
	State                 string
	RequestedAt           time.Time
	RequestedBy           string
	StartedAt, FinishedAt *time.Time
	Chunks, Rows, Removed int64
	// Planned is the source's estimate of the table's rows when the copy
	// began (pg_class.reltuples, summed over partitions); nil before it
	// began or when the source had none (a table never analysed).
	Planned *int64
}

// RequestResync asks the readers of source to copy table ("schema.name")
// again while its changes stream. It returns the resync, and false when
// one was under way already, which it leaves as it is.
func RequestResync(ctx context.Context, db Querier, source, table, by string, now time.Time) (Resync, bool, error) {
	var gen int64
	err := db.QueryRow(ctx, requestResyncSQL, source, table, now, by).Scan(&gen)
	asked := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Resync{}, false, fmt.Errorf("request the resync of %s: %w", table, err)
	}
	r, _, err := LastResync(ctx, db, source, table)
	return r, asked, err
}

// LastResync returns the latest resync of table, and false when it has
// never had one.
func LastResync(ctx context.Context, db Querier, source, table string) (Resync, bool, error) {
	r := Resync{Source: source, Table: table}
	err := db.QueryRow(ctx, readResyncSQL, source, table).Scan(&r.Generation, &r.State, &r.RequestedAt, &r.RequestedBy,
		&r.StartedAt, &r.FinishedAt, &r.Chunks, &r.Rows, &r.Removed, &r.Planned)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("read the resync of %s: %w", table, err)
	}
	return r, true, nil
}

// Querier is what the requests to the readers (RequestResync,
// RequestNewSlot) need of a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
