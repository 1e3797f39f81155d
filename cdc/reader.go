package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/connerr"
	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/raw"
)

// SQL of the reader's state and of the source.
const (
	readPositionSQL = `
SELECT system_id, snapshot, applied_lsn::text, confirmed_lsn::text FROM tidemark.cdc_positions WHERE source = $1`
	insertPositionSQL = `
INSERT INTO tidemark.cdc_positions (source, slot, system_id, slot_created_lsn, snapshot, applied_lsn, confirmed_lsn, updated_at)
VALUES ($1, $2, $3, $4::pg_lsn, $5, $4::pg_lsn, $4::pg_lsn, $6)`
	deletePositionSQL = `DELETE FROM tidemark.cdc_positions WHERE source = $1`
	// claimSlotSQL records, before tidemark creates a slot, that it is
	// creating it: a crash between the slot's creation and the storing of
	// its consistent point then leaves a pending position, which the next
	// start handles like a snapshot cut short (it drops the slot and
	// creates it again), not a slot tidemark never read from.
	claimSlotSQL = `
INSERT INTO tidemark.cdc_positions (source, slot, system_id, snapshot, updated_at)
VALUES ($1, $2, $3, 'pending', $4)`
	// slotCreatedSQL stores the consistent point of the slot just created.
	slotCreatedSQL = `
UPDATE tidemark.cdc_positions SET slot_created_lsn = $2::pg_lsn, applied_lsn = $2::pg_lsn, confirmed_lsn = $2::pg_lsn,
    snapshot = $3, updated_at = $4
WHERE source = $1`
	snapshotDoneSQL      = `UPDATE tidemark.cdc_positions SET snapshot = 'done', updated_at = $2 WHERE source = $1`
	storeConfirmedSQL    = `UPDATE tidemark.cdc_positions SET confirmed_lsn = greatest(confirmed_lsn, $2::pg_lsn) WHERE source = $1`
	createPublicationSQL = `CREATE PUBLICATION %s FOR TABLE %s WITH (publish_via_partition_root = true)`
	primaryKeySQL        = `
SELECT array_agg(a.attname::text ORDER BY array_position(i.indkey, a.attnum))
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = to_regclass($1) AND i.indisprimary`
	formatTypeSQL = `SELECT format_type($1::oid, $2)`
	heartbeatSQL  = `SELECT pg_logical_emit_message(false, 'tidemark.heartbeat', $1)`
	// slotMetricsSQL is the WAL a slot keeps and its wal_status.
	slotMetricsSQL = `
SELECT coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::int8, 0), coalesce(wal_status, '')
FROM pg_replication_slots WHERE slot_name = $1`
)

// Options customise a Reader.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the service clock (ingested_at, loaded-at); default time.Now.
	Now func() time.Time
	// GroupChanges and GroupAge bound a group of source transactions
	// applied in one warehouse transaction; defaults 10000 and 100ms.
	GroupChanges int
	GroupAge     time.Duration
	// ChunkChanges is how many changes of a group are folded and written
	// at a time; default 10000.
	ChunkChanges int
	// Paused reports whether an operator paused a source (pause.Watch):
	// the reader then stops reading the slot until it is resumed. nil:
	// none is.
	Paused func(source string) bool

	// Hooks that tell tests a state was reached (set by tests; nil
	// otherwise). Each is called on the goroutine that reached the
	// state, which waits for it to return.
	//
	// slotLockBusy is called each time a run finds the slot's lock held
	// by another session, before it tries again.
	slotLockBusy func()
	// chunkMoving is called as rows of a snapshot chunk pass from the
	// source's COPY into the warehouse's, each time the chunk's watchdog
	// is moved on.
	chunkMoving func()
	// creationWatched is called each time the watch of a slot's creation
	// finds the walsender pid still creating it, waited after it began.
	creationWatched func(pid uint32, waited time.Duration)
}

// Reader mirrors the tables of one CDC source.
type Reader struct {
	conf Config
	pool *pgxpool.Pool
	log  *slog.Logger
	now  func() time.Time
	opts Options
	raw  *raw.Table
	m    *metrics
	// specs are the source tables of conf.Tables.
	specs []pgx.Identifier
	// stopAt, once set, stops the next run before a transaction (see
	// stopBefore).
	stopAt *stopBefore
	// rs is the resync under way, nil when none is: its driver sets it,
	// the stream reads it.
	rs atomic.Pointer[resync]
	// waitTimeout bounds each wait on the warehouse or on a source query
	// (conf.WriteTimeout); walSenderTimeout is the replication
	// session's, which bounds its silence (see silence).
	waitTimeout      time.Duration
	walSenderTimeout time.Duration
	// keep is how often a group's transaction that waits for the group
	// before runs a statement: a quarter of the shorter of
	// conf.WriteTimeout and conf.IdleInTransactionTimeout.
	keep time.Duration
}

// withDefaults fills the options left empty.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.GroupChanges <= 0 {
		o.GroupChanges = 10000
	}
	if o.GroupAge <= 0 {
		o.GroupAge = 100 * time.Millisecond
	}
	if o.ChunkChanges <= 0 {
		o.ChunkChanges = 10000
	}
	return o
}

// New returns the reader of the CDC source that c configures (see
// ConfigFrom), writing to the warehouse through pool.
func New(c Config, pool *pgxpool.Pool, opts Options) (*Reader, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	rt := raw.NewChangeTable(c.Source, c.RawPartition)
	rt.Local = !c.Distribute
	r := &Reader{conf: c, pool: pool, log: opts.Logger.With("source", c.Source), now: opts.Now, opts: opts, raw: rt,
		waitTimeout: c.WriteTimeout}
	r.keep = r.waitTimeout / 4
	if idle := c.IdleInTransactionTimeout; idle > 0 {
		r.keep = min(r.waitTimeout, idle) / 4
	}
	r.raw.Log = r.log
	for _, t := range c.Tables {
		r.specs = append(r.specs, t.Source)
	}
	r.m = newMetrics(opts.Registerer, c.Source)
	return r, nil
}

// Run reads until ctx ends. Connection failures are retried with backoff;
// a setup the reader cannot use (ErrSetup) ends Run with that error.
func (r *Reader) Run(ctx context.Context) error {
	// Runs restart after 1s, doubling to 30s while they end quickly.
	retry := backoff.Backoff{First: time.Second, Max: 30 * time.Second}
	for {
		if r.waitResumed(ctx) != nil {
			return nil
		}
		started := time.Now()
		err := r.RunOnce(ctx)
		if time.Since(started) > time.Minute {
			// A run that lasted is not a crash loop: retry soon.
			retry.Reset()
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrSetup):
			return err
		case errors.Is(err, errPaused):
			retry.Reset()
			continue
		}
		wait := retry.Next()
		if err != nil {
			r.log.Warn("cdc reader stopped; restarting", "err", err, "retry_in", wait)
		}
		if backoff.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// RunOnce checks the source, takes the slot's lock (waiting while another
// reader holds it), snapshots the tables when the slot is new, and streams
// until ctx ends or an error.
func (r *Reader) RunOnce(ctx context.Context) error {
	// A run whose lock session fails ends, and is started again.
	rctx, lose := context.WithCancelCause(ctx)
	defer lose(nil)
	stopWatching := r.watchPause(rctx, lose)
	defer stopWatching()
	err := r.runOnce(rctx, lose)
	if ctx.Err() == nil && rctx.Err() != nil {
		if cause := context.Cause(rctx); err == nil || !errors.Is(err, cause) {
			err = errors.Join(cause, err)
		}
	}
	return err
}

func (r *Reader) runOnce(ctx context.Context, lose context.CancelCauseFunc) error {
	conf := &r.conf
	r.stopAt = nil
	srcConn, err := mirror.Connect(ctx, conf.DSN, "tidemark-cdc")
	if err != nil {
		return fmt.Errorf("sources.%s.cdc.dsn: %w", r.conf.Source, err)
	}
	defer pgconnect.Close(ctx, srcConn)

	// One reader per slot: the others wait here, hot, and take over when
	// the holder's session ends.
	lcc := r.pool.Config().ConnConfig.Copy()
	lcc.RuntimeParams["idle_session_timeout"] = fmt.Sprintf("%dms", r.waitTimeout.Milliseconds())
	lock, err := pgx.ConnectConfig(ctx, lcc)
	if err != nil {
		return fmt.Errorf("warehouse: %w", err)
	}
	defer pgconnect.Close(ctx, lock)
	if err := r.lockSlot(ctx, lock); err != nil {
		return err
	}
	kctx, stopKeeping := context.WithCancel(ctx)
	kept := make(chan struct{})
	go func() { defer close(kept); r.keepLock(kctx, lock, lose) }()
	defer func() { stopKeeping(); <-kept }()

	pos, err := r.position(ctx)
	if err != nil {
		return err
	}
	report, pos, err := r.checkSource(ctx, srcConn, pos)
	if err != nil {
		return err
	}
	tables, err := r.prepareTables(ctx, srcConn)
	if err != nil {
		return err
	}
	rawBinary, err := r.prepareRaw(ctx)
	if err != nil {
		return err
	}

	repl, err := r.replicationConn(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if repl != nil {
			pgconnect.Close(ctx, repl)
		}
	}()
	if pos, err = r.prepareSlot(ctx, repl, srcConn, report, pos, tables); err != nil {
		return err
	}
	s := &stream{r: r, repl: repl, src: srcConn, byName: tables, rels: map[uint32]*table{},
		applied: pos.applied, confirmed: max(pos.applied, pos.confirmed), storedConfirmed: pos.confirmed, buffers: map[uint32]*buffer{},
		a: &applier{pool: r.pool, source: r.conf.Source, raw: r.raw, now: r.now, truncate: conf.ApplyTruncate, rawBinary: rawBinary, chunk: r.opts.ChunkChanges, waitTimeout: r.waitTimeout, keep: r.keep}}
	// s is the stream reading now: the loop below may replace it.
	s.a.keepalive = func(ctx context.Context, done <-chan struct{}) error { return s.keepalive(ctx, done) }
	defer s.a.close(ctx)
	if hb, dsn := conf.HeartbeatEvery, r.writeDSN(report); hb > 0 && dsn != "" {
		hctx, stop := context.WithCancel(ctx)
		defer stop()
		go r.heartbeat(hctx, dsn, hb)
	} else if hb > 0 {
		r.log.Info("no heartbeats: the source is a standby and cdc.primary_dsn is not set; the slot moves with the tracked tables' changes", "slot", conf.Slot)
	}
	stopResyncs, err := r.startResyncs(ctx, tables, r.writeDSN(report), lose)
	if err != nil {
		return err
	}
	defer stopResyncs()
	for {
		err := s.run(ctx)
		var stop *stopBefore
		if !errors.As(err, &stop) {
			return err
		}
		if r.stopAt != nil {
			return stop.err
		}
		// The stream stopped inside a transaction it must not apply:
		// read the slot again, here, from what is applied (the start's
		// checks would now refuse the changed source), and stop before
		// that transaction.
		r.log.Info("reading the slot again to apply what comes before the transaction that stops the reader", "commit_lsn", stop.lsn)
		r.stopAt = stop
		// The groups that were committing when the stream stopped were
		// not confirmed, and DDL of the group rolled back is gone: start
		// from what the warehouse holds.
		pos, err := r.position(ctx)
		if err != nil {
			return err
		}
		if err := r.reloadMirrors(ctx, tables); err != nil {
			return err
		}
		pgconnect.Close(ctx, repl)
		next, err := r.replicationConn(ctx)
		if err != nil {
			repl = nil
			return err
		}
		repl = next
		for _, t := range tables {
			t.setColumns(nil)
		}
		s = &stream{r: r, repl: repl, src: srcConn, byName: tables, rels: map[uint32]*table{},
			applied: max(s.applied, pos.applied), confirmed: s.confirmed, storedConfirmed: max(s.storedConfirmed, pos.confirmed),
			buffers: map[uint32]*buffer{}, a: s.a}
	}
}

// checkSource checks the source against the configuration and the
// position pos stored for it (Check), logs the check's warnings, and
// creates the publication if it is missing. It returns the check's report
// and pos, moved to what the slot confirmed if that is further on.
func (r *Reader) checkSource(ctx context.Context, srcConn *pgx.Conn, pos position) (Report, position, error) {
	conf := &r.conf
	// Each wait on the source before streaming is bounded by r.waitTimeout: a
	// stalled connection answers nothing and does not fail either, and
	// the stream's bound of silence applies only once it streams.
	cctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	// A pending position is a snapshot cut short, a position in state
	// resync a slot to replace: the slot, if any, is dropped and created
	// again, so it is not held to these checks.
	replace := pos.exists && (pos.snapshot == "pending" || pos.snapshot == snapshotResync)
	report, err := Check(cctx, srcConn, CheckSpec{Source: r.conf.Source, Slot: conf.Slot, Publication: conf.Publication, Tables: r.specs,
		Position: pos.readFrom(), Failover: conf.FailoverSlot, Replace: replace, Primary: conf.PrimaryDSN != ""})
	cancel()
	unpublished := report.Unpublished
	if !report.PublicationExists && err == nil {
		// Dropped since the reader streamed: every table's changes
		// since are not in the slot.
		unpublished = r.specs
	}
	if len(unpublished) > 0 && pos.exists && !replace {
		// Before the tables are published, whoever publishes them:
		// their changes until then are not in the slot.
		if rerr := r.resyncUnpublished(ctx, unpublished); rerr != nil {
			return report, pos, errors.Join(err, rerr)
		}
	}
	if err != nil {
		return report, pos, err
	}
	for _, w := range report.Warnings {
		r.log.Warn(w)
	}
	if pos.exists && !replace && pos.systemID != report.SystemID {
		return report, pos, fmt.Errorf("%w: sources.%s: the source database is another server (system identifier %s, tidemark read from %s); "+
			"a failover to a server without the slot loses changes: run tidemark resync %s --new-slot", ErrSetup, r.conf.Source, report.SystemID, pos.systemID, r.conf.Source)
	}
	if pos.exists && !replace && report.Slot.Exists {
		if pos, err = r.confirmedWithin(ctx, pos, conf.Slot, report.Slot.ConfirmedFlush); err != nil {
			return report, pos, err
		}
	}
	if !report.PublicationExists {
		create := r.createPublication
		if report.InRecovery {
			create = r.createPublicationOnPrimary
		}
		if err := create(ctx, srcConn); err != nil {
			return report, pos, err
		}
	} else if len(report.Unpublished) > 0 {
		if err := r.addToPublication(ctx, srcConn, report); err != nil {
			return report, pos, err
		}
	}
	return report, pos, nil
}

// createPublication creates the configured publication of the tracked
// tables. A statement the source refuses is a setup the reader cannot use
// (ErrSetup); one it could not run is retried with the run.
func (r *Reader) createPublication(ctx context.Context, srcConn *pgx.Conn) error {
	conf := &r.conf
	pctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
	_, err := srcConn.Exec(pctx, r.createPublicationStatement())
	cancel()
	if pgerr.Refused(err) {
		return fmt.Errorf("%w: sources.%s.cdc.publication: create publication %s: %w", ErrSetup, r.conf.Source, conf.Publication, err)
	}
	if err != nil {
		// The server could not run the statement: retry.
		return fmt.Errorf("sources.%s.cdc.publication: create publication %s: %w", r.conf.Source, conf.Publication, err)
	}
	r.log.Info("created publication", "publication", conf.Publication)
	return nil
}

// createPublicationStatement is the statement that creates the source's
// publication of its tables.
func (r *Reader) createPublicationStatement() string {
	var names []string
	for _, t := range r.specs {
		names = append(names, t.Sanitize())
	}
	return fmt.Sprintf(createPublicationSQL, pgquote.Ident(r.conf.Publication), strings.Join(names, ", "))
}

// prepareRaw creates or extends the source's raw change table and reports
// whether its columns take the binary COPY the applier writes.
func (r *Reader) prepareRaw(ctx context.Context) (rawBinary bool, err error) {
	wh, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("warehouse: %w", err)
	}
	defer wh.Release()
	if err := r.raw.Ensure(ctx, wh.Conn()); err != nil {
		return false, err
	}
	return raw.ChangeColumns.BinaryCopyFits(ctx, wh.Conn(), r.raw.Ident())
}

// reloadMirrors reads each mirror's columns from the warehouse again.
func (r *Reader) reloadMirrors(ctx context.Context, tables map[string]*table) error {
	wh, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("warehouse: %w", err)
	}
	defer wh.Release()
	for _, t := range tables {
		if err := t.mirror.Reload(ctx, wh.Conn()); err != nil {
			return err
		}
	}
	return nil
}

// position is what the warehouse stores about the source.
type position struct {
	exists             bool
	systemID, snapshot string
	applied, confirmed pglogrepl.LSN
}

// readFrom is the position tidemark has read the slot from, 0 when it has
// not: a snapshot still pending is taken again with a new slot, so its
// slot missing is no loss.
func (p position) readFrom() pglogrepl.LSN {
	if !p.exists || p.snapshot == "pending" || p.snapshot == snapshotResync {
		return 0
	}
	return p.applied
}

func (r *Reader) position(ctx context.Context) (position, error) {
	var (
		p                  position
		applied, confirmed string
	)
	err := r.pool.QueryRow(ctx, readPositionSQL, r.conf.Source).Scan(&p.systemID, &p.snapshot, &applied, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("read the stored position: %w", err)
	}
	p.exists = true
	if p.applied, err = pglogrepl.ParseLSN(applied); err != nil {
		return p, err
	}
	if p.confirmed, err = pglogrepl.ParseLSN(confirmed); err != nil {
		return p, err
	}
	return p, nil
}

// prepareTables describes each source table, with its primary key as the
// mirror's key, and creates or extends its mirror.
func (r *Reader) prepareTables(ctx context.Context, src *pgx.Conn) (map[string]*table, error) {
	wh, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("warehouse: %w", err)
	}
	defer wh.Release()
	out := map[string]*table{}
	for _, t := range r.conf.Tables {
		name := t.Source[0] + "." + t.Source[1]
		dctx, cancel := context.WithTimeout(ctx, r.waitTimeout)
		m, err := describeMirror(dctx, src, &r.conf, t)
		cancel()
		if err != nil {
			return nil, err
		}
		if err := m.Ensure(ctx, wh.Conn()); err != nil {
			if errors.Is(err, mirror.ErrMirror) {
				// A mirror that does not fit the source does not fix
				// itself: retrying would only repeat the error.
				return nil, fmt.Errorf("%w: sources.%s: %w", ErrSetup, r.conf.Source, err)
			}
			return nil, err
		}
		out[name] = &table{name: name, mirror: m, rel: mirror.Relation{Name: name, Mirror: m}}
	}
	return out, nil
}

// describeMirror describes the source table t of c, with its primary key
// as the mirror's key, and returns its mirror.
func describeMirror(ctx context.Context, src *pgx.Conn, c *Config, t Table) (*mirror.Table, error) {
	name := t.Source[0] + "." + t.Source[1]
	var key []string
	if err := src.QueryRow(ctx, primaryKeySQL, t.Source.Sanitize()).Scan(&key); err != nil {
		return nil, fmt.Errorf("sources.%s.cdc.tables: %s: %w", c.Source, name, err)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("%w: sources.%s.cdc.tables: %s has no primary key; the mirror needs one to apply updates and deletes",
			ErrSetup, c.Source, name)
	}
	m := &mirror.Table{Name: c.Source, Source: slices.Clone(t.Source), Target: slices.Clone(t.Mirror), Key: key,
		DeletedColumn: c.DeletedColumn, LoadedColumn: c.LoadedColumn, Hard: c.HardDeletes, Distribute: c.Distribute}
	if err := m.Describe(ctx, src); err != nil {
		if errors.Is(err, mirror.ErrSource) {
			// The table cannot be mirrored as configured.
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		// The source could not answer (a lost connection, say): retry.
		return nil, err
	}
	return m, nil
}

// Mirrors describes the mirror of each table of the CDC source that c
// configures, as the reader does, without changing anything: for drift
// checks with key reconciliation.
func Mirrors(ctx context.Context, c Config) ([]*mirror.Table, error) {
	src, err := mirror.Connect(ctx, c.DSN, "tidemark-keys")
	if err != nil {
		return nil, fmt.Errorf("sources.%s.cdc.dsn: %w", c.Source, err)
	}
	defer pgconnect.Close(ctx, src)
	var out []*mirror.Table
	for _, t := range c.Tables {
		m, err := describeMirror(ctx, src, &c, t)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// replicationConn opens a logical replication connection to the source.
func (r *Reader) replicationConn(ctx context.Context) (*pgconn.PgConn, error) {
	pc, err := pgconnect.Replication(r.conf.DSN, replicationApp)
	if err != nil {
		return nil, fmt.Errorf("sources.%s.cdc.dsn: %w", r.conf.Source, err)
	}
	for k, v := range mirror.SessionParams {
		pc.RuntimeParams[k] = v
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("sources.%s.cdc.dsn: replication connection to the source: %w", r.conf.Source, connerr.Explain(err))
	}
	r.readWalSenderTimeout(ctx, conn)
	return conn, nil
}

// prepareSlot makes the slot the reader streams from: it creates it when
// the source has none that tidemark reads (createSlot), replaces it when
// tidemark resync --new-slot asked for it (replaceSlot), or makes the
// existing one a failover slot as configured; then it takes on the tables
// the reader did not stream before (takeOnTables).
func (r *Reader) prepareSlot(ctx context.Context, repl *pgconn.PgConn, src *pgx.Conn, report Report, pos position, tables map[string]*table) (position, error) {
	var err error
	switch {
	case pos.exists && pos.snapshot == snapshotResync:
		return r.replaceSlot(ctx, repl, src, report)
	case !pos.exists || pos.snapshot == "pending":
		if pos, err = r.createSlot(ctx, repl, src, report, pos, tables); err != nil {
			return pos, err
		}
		return pos, r.takeOnTables(ctx, true)
	}
	if err := r.makeFailover(ctx, repl, report); err != nil {
		return pos, err
	}
	return pos, r.takeOnTables(ctx, false)
}

// createSlot creates the slot and, with snapshot: initial, copies the
// tables in the snapshot the slot exports, so that streaming from the
// slot's consistent point has no gap and no overlap. A snapshot cut short
// (position "pending") is started again with a new slot: the old one was
// created by tidemark for it and nothing was read from it (see
// dropUnfinishedSlot). The creation may wait for the source's open
// transactions for as long as they last, watched so that a stalled
// network still ends it (see createSlotWatched); each other wait is
// bounded by r.waitTimeout.
func (r *Reader) createSlot(ctx context.Context, repl *pgconn.PgConn, src *pgx.Conn, report Report, pos position, tables map[string]*table) (position, error) {
	conf := &r.conf
	if report.Slot.Exists {
		if !pos.exists {
			if conf.Snapshot == config.SnapshotInitial {
				return pos, fmt.Errorf("%w: sources.%s.cdc.slot: slot %s exists but tidemark has never read from it, so its changes cannot be joined to a snapshot; "+
					"drop the slot to let tidemark create it, or set cdc.snapshot: never to stream from where the slot stands", ErrSetup, r.conf.Source, conf.Slot)
			}
			// Stream from where the existing slot stands.
			at := report.Slot.ConfirmedFlush
			err := r.execStep(ctx, insertPositionSQL, r.conf.Source, conf.Slot, report.SystemID, at.String(), "skipped", r.now())
			return position{exists: true, systemID: report.SystemID, snapshot: "skipped", applied: at, confirmed: at}, err
		}
		// A snapshot that did not finish: start over with a new slot.
		if err := r.dropUnfinishedSlot(ctx, repl, src); err != nil {
			return pos, err
		}
	}
	if pos.exists {
		if err := r.execStep(ctx, deletePositionSQL, r.conf.Source); err != nil {
			return pos, fmt.Errorf("store the position: %w", err)
		}
	}
	if err := r.execStep(ctx, claimSlotSQL, r.conf.Source, conf.Slot, report.SystemID, r.now()); err != nil {
		return pos, fmt.Errorf("store the position: %w", err)
	}
	res, at, err := r.newSlot(ctx, repl, src, conf.Snapshot == config.SnapshotInitial, report)
	if err != nil {
		return pos, err
	}
	state := "skipped"
	if conf.Snapshot == config.SnapshotInitial {
		state = "pending"
	}
	if err := r.execStep(ctx, slotCreatedSQL, r.conf.Source, at.String(), state, r.now()); err != nil {
		return pos, fmt.Errorf("store the position: %w", err)
	}
	r.log.Info("created replication slot", "slot", conf.Slot, "consistent_point", at, "snapshot", conf.Snapshot,
		"failover", wantsFailover(conf.FailoverSlot, report))
	if conf.Snapshot == config.SnapshotInitial {
		// The exported snapshot lives as long as repl stays idle.
		if err := r.snapshot(ctx, res.SnapshotName, tables); err != nil {
			return pos, fmt.Errorf("initial snapshot: %w", err)
		}
	}
	return position{exists: true, systemID: report.SystemID, snapshot: "done", applied: at, confirmed: at}, nil
}

// heartbeat writes a logical message on the source at dsn (the source, or
// the primary of a source that is a standby) every interval, so that WAL
// moves and the slot can be confirmed past it while the tracked tables
// are quiet. A beat that fails is logged and the connection made again
// at the next: a source restart must not end the heartbeats.
func (r *Reader) heartbeat(ctx context.Context, dsn string, every time.Duration) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			pgconnect.Close(ctx, conn)
		}
	}()
	job := periodic.Job{Name: "cdc heartbeat", Every: every, FromStart: true, Timeout: r.waitTimeout, Log: r.log,
		Run: func(bctx context.Context) error {
			if conn == nil || conn.IsClosed() {
				c, err := mirror.Connect(bctx, dsn, "tidemark-cdc-heartbeat")
				if err != nil {
					return fmt.Errorf("connect: %w", err)
				}
				conn = c
			}
			if _, err := conn.Exec(bctx, heartbeatSQL, r.now().UTC().Format(time.RFC3339Nano)); err != nil {
				pgconnect.Close(ctx, conn)
				conn = nil
				return err
			}
			return nil
		}}
	_ = job.Loop(ctx) // no error is final: it ends with ctx
}

// receive reads one message, or returns nil when deadline passes first
// (up to receiveSlack early). The wait is a read deadline on the
// connection, not a context: pgconn would register and remove a context
// watcher, and this a timer, for every message, at hundreds of thousands
// of messages a second; and the deadline is only moved when it moves by
// more than receiveSlack, since the stream mostly asks for the same one
// (its next status update or the end of a group's window). pgconn keeps
// the connection after a read deadline passes, and the next call finishes
// a message read in part. ctx ends the wait at once through the deadline
// that watchStop sets.
func receive(ctx context.Context, conn *pgconn.PgConn, deadline time.Time) (pgproto3.BackendMessage, error) {
	if err := pgconnect.ReadDeadlineNear(conn.Conn(), deadline, receiveSlack); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// Checked after the deadline is set: a stop from now on moves
		// the deadline to the past.
		return nil, err
	}
	msg, err := conn.ReceiveMessage(context.Background())
	if err != nil {
		if pgconn.Timeout(err) && ctx.Err() == nil {
			return nil, nil
		}
		return nil, err
	}
	return msg, nil
}

// receiveSlack is how much earlier than asked receive may time out.
const receiveSlack = time.Millisecond

// watchStop makes a read that receive is waiting in return at once when
// ctx ends; the returned function stops watching.
func watchStop(ctx context.Context, conn *pgconn.PgConn) func() bool {
	return context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(time.Now()) })
}
