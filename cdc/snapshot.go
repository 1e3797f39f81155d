package cdc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/mirror"
)

// SQL of the initial snapshot.
const (
	// estimateRowsSQL is the planner's row count of a table; -1 when the
	// table was never analyzed.
	estimateRowsSQL = `SELECT reltuples::float8, relpages::float8 FROM pg_class WHERE oid = $1::regclass`
	// relationPagesSQL is a table's size in blocks, from its file size.
	relationPagesSQL = `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::float8`
	// sampleKeysSQL reads the keys of a block sample of a table, in key
	// order, as text. %[1]s key columns of t as text, %[2]s table, %[3]s
	// key columns of t: qualified, so that the order is the columns'
	// own, not that of the text output columns of the same names.
	sampleKeysSQL = `SELECT %[1]s FROM %[2]s AS t TABLESAMPLE SYSTEM ($1) ORDER BY %[3]s`
	// copyChunkSQL reads one chunk of a table. %[1]s columns, %[2]s the
	// load time literal, %[3]s table, %[4]s key-range condition.
	copyChunkSQL = `COPY (SELECT %[1]s, %[2]s::timestamptz FROM %[3]s WHERE %[4]s) TO STDOUT`
	// truncateMirrorSQL empties a mirror before a snapshot fills it.
	truncateMirrorSQL = `TRUNCATE %s`
)

// snapshotProgressEvery is how often, in nanoseconds, a snapshot logs
// its progress; zero is progress.DefaultEvery. Tests shorten it.
var snapshotProgressEvery atomic.Int64

// minSampleBlocks is the fewest blocks a chunk plan samples.
const minSampleBlocks = 256

// countPages is the size, in blocks, up to which a table that was never
// analyzed is counted whole to plan its chunks; a larger one is counted
// on a block sample of this many blocks, so that planning stays well
// inside write_timeout whatever the table's size. A variable for tests.
var countPages = 16384.0

// estimateUnanalyzed estimates the rows and blocks of a table that was
// never analyzed (pg_class.reltuples is -1 and relpages may be 0):
// blocks from its size on disk, rows by counting, whole or on a sample.
func estimateUnanalyzed(ctx context.Context, tx pgx.Tx, id pgx.Identifier) (rows, pages float64, err error) {
	if err := tx.QueryRow(ctx, relationPagesSQL, id.Sanitize()).Scan(&pages); err != nil {
		return 0, 0, err
	}
	q, scale := "SELECT count(*)::float8 FROM "+id.Sanitize(), 1.0
	if pages > countPages {
		pct := 100 * countPages / pages
		q += fmt.Sprintf(" TABLESAMPLE SYSTEM (%g)", pct)
		scale = 100 / pct
	}
	if err := tx.QueryRow(ctx, q).Scan(&rows); err != nil {
		return 0, 0, err
	}
	return rows * scale, pages, nil
}

// chunk is one key range of a table, copied in one warehouse transaction.
type chunk struct {
	t     *table
	id    pgx.Identifier // the source table
	where string         // the key range, as a condition on the source table
}

// planSnapshot splits each table into the key-range chunks the snapshot
// copies, planned in the exported snapshot name on a connection of its
// own, closed before the copy starts.
func (r *Reader) planSnapshot(ctx context.Context, name string, tables map[string]*table) ([]chunk, error) {
	conf := &r.conf
	plan, err := mirror.Connect(ctx, conf.DSN, "tidemark-cdc-snapshot")
	if err != nil {
		return nil, err
	}
	defer pgconnect.Close(ctx, plan)
	ptx, err := importSnapshot(ctx, plan, name, r.waitTimeout)
	if err != nil {
		return nil, err
	}
	defer r.rollback(ctx, ptx) // a no-op once rolled back below
	var chunks []chunk
	for _, id := range r.specs {
		t := tables[id[0]+"."+id[1]]
		pctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
		wheres, err := planChunks(pctx, ptx, t, id, conf.SnapshotChunkRows)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("plan the snapshot of %s: %w", t.name, err)
		}
		for _, w := range wheres {
			chunks = append(chunks, chunk{t: t, id: id, where: w})
		}
	}
	r.rollback(ctx, ptx)
	_ = plan.Close(ctx) // idle from here on; the deferred Close is then a no-op
	return chunks, nil
}

// snapshot copies every tracked table, as of the snapshot the new slot
// exported, into its mirror. Tables are split into key ranges of about
// snapshot_chunk_rows rows, copied by snapshot_workers workers, each in its
// own source transaction that imports the exported snapshot and one
// warehouse transaction per chunk. The mirrors are emptied first: a
// snapshot replaces what a mirror held. The snapshot is marked done only
// when every chunk is committed; a snapshot cut short stays pending, and
// the next start drops the slot and begins again.
//
// Each wait is bounded by r.waitTimeout (warehouse.write_timeout): importing the
// snapshot, planning a table, emptying the mirrors and marking the
// snapshot done each get r.waitTimeout, and a chunk's copy may take as long as
// its bytes keep flowing (see copyChunk). A stall on either side thus
// fails the snapshot, and the reader's restart takes it again with a new
// slot: the exported snapshot lives only as long as the replication
// connection that created it, so a snapshot cannot be resumed.
func (r *Reader) snapshot(ctx context.Context, name string, tables map[string]*table) error {
	conf := &r.conf
	started := time.Now()
	chunks, err := r.planSnapshot(ctx, name, tables)
	if err != nil {
		return err
	}

	var mirrors []string
	for _, id := range r.specs {
		mirrors = append(mirrors, tables[id[0]+"."+id[1]].mirror.Target.Sanitize())
	}
	tctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	_, err = r.pool.Exec(tctx, fmt.Sprintf(truncateMirrorSQL, strings.Join(mirrors, ", ")))
	cancel()
	if err != nil {
		return fmt.Errorf("empty the mirrors: %w", err)
	}
	r.m.snapshotPlanned.Set(float64(len(chunks)))
	r.m.snapshotCopied.Set(0)
	workers := min(conf.SnapshotWorkers, len(chunks))
	r.log.Info("snapshot planned", "tables", len(r.specs), "chunks", len(chunks), "workers", workers)
	// A service component: plain lines through the reader's log.
	tr := progress.Service(time.Duration(snapshotProgressEvery.Load())).Start(r.log,
		progress.Job{Label: "snapshot", Unit: "chunks", Total: int64(len(chunks))})
	defer tr.Finish(false)

	loaded := r.now().UTC().Format("2006-01-02 15:04:05.999999") + "+00"
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	todo := make(chan chunk)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		rows     int64
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
			cancel()
		}
	}
	for range workers {
		wg.Go(func() {
			conn, err := mirror.Connect(wctx, conf.DSN, "tidemark-cdc-snapshot")
			if err != nil {
				fail(err)
				return
			}
			defer pgconnect.Close(wctx, conn)
			stx, err := importSnapshot(wctx, conn, name, r.waitTimeout)
			if err != nil {
				fail(err)
				return
			}
			defer r.rollback(wctx, stx)
			for c := range todo {
				n, err := r.copyChunk(wctx, conn, c, loaded)
				if err != nil {
					fail(fmt.Errorf("copy %s: %w", c.t.name, err))
					return
				}
				mu.Lock()
				rows += n
				mu.Unlock()
				r.m.snapshotRows.Add(float64(n))
				r.m.snapshotCopied.Inc()
				tr.Add(1)
			}
		})
	}
feed:
	for _, c := range chunks {
		select {
		case todo <- c:
		case <-wctx.Done():
			break feed
		}
	}
	close(todo)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	err = execDurable(dctx, r.pool, snapshotDoneSQL, r.conf.Source, r.now())
	cancel()
	if err != nil {
		return fmt.Errorf("mark the snapshot done: %w", err)
	}
	tr.Finish(true)
	r.log.Info("snapshot copied", "rows", rows, "chunks", len(chunks), "took", time.Since(started).Round(time.Millisecond))
	return nil
}

// importSnapshot begins a read-only transaction on src in the exported
// snapshot, waiting at most timeout.
func importSnapshot(ctx context.Context, src *pgx.Conn, name string, timeout time.Duration) (pgx.Tx, error) {
	ictx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tx, err := src.BeginTx(ictx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("begin the snapshot's transaction: %w", err)
	}
	if _, err := tx.Exec(ictx, "SET TRANSACTION SNAPSHOT "+pgquote.Literal(name)); err != nil {
		pgconnect.Rollback(ictx, tx)
		return nil, fmt.Errorf("use the slot's snapshot: %w", err)
	}
	return tx, nil
}

// rollback ends tx, waiting at most r.waitTimeout, also when ctx has ended: a
// rollback on a stalled connection would otherwise wait for good.
func (r *Reader) rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.waitTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// copyPipeBuffer is how many bytes of a chunk's COPY pass through the
// pipe at a time. COPY TO STDOUT hands over one row per write, and the
// warehouse's COPY FROM STDIN sends each read as one CopyData message:
// unbuffered, every row would be a message, a socket write and a hand-over
// between goroutines of its own. 32 KiB fits one read of COPY FROM's 64 KiB
// buffer.
const copyPipeBuffer = 32 << 10

// progressWriter passes writes on to w and touches wd as bytes pass, at
// most once per every: a watchdog's deadline then moves on while data
// flows, at a cost that does not grow with the number of rows.
type progressWriter struct {
	w     io.Writer
	wd    *pgconnect.Watchdog
	every time.Duration
	last  time.Time
	// moving, when set, is called each time wd is touched
	// (Options.chunkMoving).
	moving func()
}

// Write implements io.Writer.
func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if n > 0 {
		if now := time.Now(); now.Sub(p.last) >= p.every {
			p.wd.Touch()
			p.last = now
			if p.moving != nil {
				p.moving()
			}
		}
	}
	return n, err
}

// copyChunk copies one chunk from the source connection (inside its
// snapshot transaction) into the mirror, in one warehouse transaction, and
// returns the rows copied.
//
// The wait for a warehouse connection is not bounded here: with
// snapshot_workers at or above warehouse.max_conns, workers wait for each
// other's chunks, which are. From then on a watchdog of r.waitTimeout bounds the
// chunk, and the bytes that pass from the source's COPY into the
// warehouse's move it on: a chunk takes as long as it needs while data
// flows, and a stall on either side ends it within r.waitTimeout of the last
// byte.
func (r *Reader) copyChunk(ctx context.Context, src *pgx.Conn, c chunk, loaded string) (int64, error) {
	wh, err := r.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer wh.Release()
	wctx, wd := pgconnect.WithWatchdog(ctx, r.waitTimeout)
	defer wd.Stop()
	n, err := r.copyChunkOn(wctx, wd, wh.Conn(), src, c, loaded)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		err = fmt.Errorf("%w: %w", context.Cause(wctx), err)
	}
	return n, err
}

// copyChunkOn is copyChunk on the warehouse connection wh, under the
// watchdog wd of ctx.
func (r *Reader) copyChunkOn(ctx context.Context, wd *pgconnect.Watchdog, wh *pgx.Conn, src *pgx.Conn, c chunk, loaded string) (int64, error) {
	m := c.t.mirror
	cols := pgquote.Idents(m.ColumnNames())
	tx, err := wh.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer r.rollback(ctx, tx)
	pr, pw := io.Pipe()
	out := bufio.NewWriterSize(&progressWriter{w: pw, wd: wd, every: r.waitTimeout / 16, moving: r.opts.chunkMoving}, copyPipeBuffer)
	done := make(chan error, 1)
	go func() {
		_, err := src.PgConn().CopyTo(ctx, out, fmt.Sprintf(copyChunkSQL, cols, pgquote.Literal(loaded), c.id.Sanitize(), c.where))
		if err == nil {
			err = out.Flush()
		}
		pw.CloseWithError(err)
		done <- err
	}()
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, pr, fmt.Sprintf("COPY %s (%s, %s) FROM STDIN", m.Target.Sanitize(), cols, pgquote.Ident(m.LoadedColumn)))
	_ = pr.CloseWithError(err)
	if serr := <-done; err == nil {
		err = serr
	}
	if err != nil {
		return 0, err
	}
	wd.Touch()
	return tag.RowsAffected(), tx.Commit(ctx)
}

// planChunks splits a table into key ranges of about chunkRows rows and
// returns their conditions. The boundaries come from a block sample of
// the keys; any boundaries cover the whole key space, so a poor sample
// makes chunks uneven, never incomplete.
func planChunks(ctx context.Context, tx pgx.Tx, t *table, id pgx.Identifier, chunkRows int) ([]string, error) {
	var est, pages float64
	if err := tx.QueryRow(ctx, estimateRowsSQL, id.Sanitize()).Scan(&est, &pages); err != nil {
		return nil, err
	}
	if est < 0 {
		var err error
		if est, pages, err = estimateUnanalyzed(ctx, tx, id); err != nil {
			return nil, err
		}
	}
	n := int(math.Ceil(est / float64(chunkRows)))
	if n <= 1 {
		return []string{"true"}, nil
	}
	key := t.mirror.Key
	var asText, quoted, types []string
	for _, k := range key {
		c, ok := t.mirror.Column(k)
		if !ok {
			return nil, fmt.Errorf("key column %s is not in the mirror", k)
		}
		asText = append(asText, "t."+pgquote.Ident(k)+"::text")
		quoted = append(quoted, pgquote.Ident(k))
		types = append(types, c.Type)
	}
	// About 32 sampled keys per chunk, and at least minSampleBlocks
	// blocks: the sample picks whole blocks at random, and a handful of
	// them may hold none of a table's rows, or too few to split it.
	pct := 100 * float64(n*32) / est
	if pages > 0 {
		pct = max(pct, 100*minSampleBlocks/pages)
	}
	pct = min(100, pct)
	var byKey []string
	for _, q := range quoted {
		byKey = append(byKey, "t."+q)
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(sampleKeysSQL, strings.Join(asText, ", "), id.Sanitize(), strings.Join(byKey, ", ")), pct)
	if err != nil {
		return nil, err
	}
	sample, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([]string, error) {
		vals := make([]string, len(key))
		ptrs := make([]any, len(key))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		return vals, row.Scan(ptrs...)
	})
	if err != nil {
		return nil, err
	}
	n = min(n, len(sample))
	var bounds []string
	for i := 1; i < n; i++ {
		var lits []string
		for j, v := range sample[i*len(sample)/n] {
			lits = append(lits, pgquote.Literal(v)+"::"+types[j])
		}
		b := "(" + strings.Join(lits, ", ") + ")"
		if len(bounds) == 0 || bounds[len(bounds)-1] != b {
			bounds = append(bounds, b)
		}
	}
	if len(bounds) == 0 {
		return []string{"true"}, nil
	}
	k := "(" + strings.Join(quoted, ", ") + ")"
	if len(quoted) == 1 {
		// A one-element row constructor needs ROW.
		k = quoted[0]
		for i, b := range bounds {
			bounds[i] = strings.TrimSuffix(strings.TrimPrefix(b, "("), ")")
		}
	}
	wheres := []string{fmt.Sprintf("%s < %s", k, bounds[0])}
	for i := 1; i < len(bounds); i++ {
		wheres = append(wheres, fmt.Sprintf("%s >= %s AND %s < %s", k, bounds[i-1], k, bounds[i]))
	}
	return append(wheres, fmt.Sprintf("%s >= %s", k, bounds[len(bounds)-1])), nil
}

// mirrorColumn describes a column added to a mirror.
func mirrorColumn(name, typ string) mirror.Column { return mirror.Column{Name: name, Type: typ} }
