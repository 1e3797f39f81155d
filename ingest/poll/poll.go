package poll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/copytext"
	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgjson"
	"github.com/tidemark-dev/tidemark/internal/pgquote"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/raw"
)

// ErrSource means a poll source cannot be loaded as configured; the
// message names the configuration key.
var ErrSource = errors.New("poll source")

// errSourceChanged means the source table's columns changed since the
// poller described it; the run is repeated after the mirror follows.
var errSourceChanged = errors.New("the source table's columns changed")

// errCopyConflict means a run that COPYed into tables it found empty met a
// row already there (a writer other than this poller, or a source key that
// is not unique); the run is repeated with the merge.
var errCopyConflict = errors.New("a row COPYed into the empty mirror or raw table was already there")

// Options customise a Poller.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the service clock (ingested_at, loaded-at); default time.Now.
	Now func() time.Time
	// Progress shows the progress of a first load (a run while the
	// source has no watermark yet), in rows against the source table's
	// estimated size. nil logs plain lines through Logger every
	// progress.DefaultEvery, as a service component does (none when
	// progress.Env is "off").
	Progress *progress.Display
	// Paused reports whether an operator paused a source (pause.Watch):
	// Run skips its runs while it is. nil: none is.
	Paused func(source string) bool
}

// Poller loads one poll source: each run reads the source rows whose
// updated_at lies in (watermark - lookback, upper], in (updated_at, key)
// order and in chunks, and in ONE warehouse transaction merges them into
// the mirror, records the rows that changed in raw.<source> with ledger
// rows, and advances the watermark to the newest updated_at read.
type Poller struct {
	conf  Config
	table *mirror.Table
	raw   *raw.Table
	pool  *pgxpool.Pool
	log   *slog.Logger
	now   func() time.Time
	m     *pollMetrics
	// progress shows the progress of a first load.
	progress *progress.Display

	mu       sync.Mutex // one run at a time per Poller
	conn     *pgx.Conn  // the source connection, reopened after errors
	ddl      *pgx.Conn  // a warehouse connection outside the pool, for raw partitions
	prepared bool
	// wd is the running run's deadline (conf.WriteTimeout), moved on by
	// every chunk.
	wd   *pgconnect.Watchdog
	zone string // time zone of a timestamp-without-time-zone updated_at
	// estimateWarned is set once a failed estimate of the source
	// table's rows was logged.
	estimateWarned bool
	soft           string // SQL testing the soft-delete column, or "false"
	// mergeOnly is set after errCopyConflict: runs always merge.
	mergeOnly bool
	// isPaused is Options.Paused.
	isPaused func(source string) bool
}

// New returns the poller of the poll source that c configures (see
// ConfigFrom), writing to the warehouse through pool.
func New(c Config, pool *pgxpool.Pool, opts Options) (*Poller, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	t := &mirror.Table{Name: c.Source, Source: slices.Clone(c.Table), Target: slices.Clone(c.Mirror), Key: slices.Clone(c.Key),
		DeletedColumn: c.DeletedColumn, LoadedColumn: c.LoadedColumn, Hard: c.HardDeletes}
	// A poll source's raw table stays on the coordinator of a Citus
	// warehouse (config.Config.Distributes).
	rt := raw.NewChangeTable(c.Source, c.RawPartition)
	rt.Local = true
	opts = opts.withDefaults()
	p := &Poller{conf: c, table: t, raw: rt, pool: pool,
		log: opts.Logger.With("source", c.Source), now: opts.Now, m: newPollMetrics(opts.Registerer), progress: opts.Progress, isPaused: opts.Paused}
	p.raw.Log = opts.Logger
	p.m.register(c.Source, p.now)
	return p, nil
}

// Name is the source's name.
func (p *Poller) Name() string { return p.conf.Source }

// Mirror is the poller's mirror table; its columns are known after Prepare.
func (p *Poller) Mirror() *mirror.Table { return p.table }

// Close closes the source connection.
func (p *Poller) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeConn()
}

func (p *Poller) closeConn() {
	for _, c := range []**pgx.Conn{&p.conn, &p.ddl} {
		if *c != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = (*c).Close(ctx)
			cancel()
			*c = nil
		}
	}
}

// ddlConn returns the poller's own warehouse connection for creating raw
// partitions during a run. It is not taken from the pool: a run already
// holds a pool connection for its transaction, and runs of several sources
// each waiting for a second one could exhaust the pool.
func (p *Poller) ddlConn(ctx context.Context) (*pgx.Conn, error) {
	if p.ddl != nil && !p.ddl.IsClosed() {
		return p.ddl, nil
	}
	conn, err := pgx.ConnectConfig(ctx, p.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("warehouse connection for raw partitions: %w", err)
	}
	p.ddl = conn
	return conn, nil
}

func (p *Poller) source(ctx context.Context) (*pgx.Conn, error) {
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn, nil
	}
	conn, err := mirror.Connect(ctx, p.conf.DSN, "tidemark-poll")
	if err != nil {
		return nil, fmt.Errorf("sources.%s.poll.dsn: %w", p.conf.Source, err)
	}
	p.conn = conn
	return conn, nil
}

// Prepare checks the source table against the configuration and creates
// or extends the mirror and the raw change table. Run and RunOnce call it
// as needed.
func (p *Poller) Prepare(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepare(ctx)
}

func (p *Poller) prepare(ctx context.Context) error {
	if p.prepared {
		return nil
	}
	conn, err := p.source(ctx)
	if err != nil {
		return err
	}
	if err := p.table.Describe(ctx, conn); err != nil {
		return err
	}
	if err := p.checkColumns(); err != nil {
		return err
	}
	wh, err := p.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("poll %s: %w", p.conf.Source, err)
	}
	defer wh.Release()
	if err := p.table.Ensure(ctx, wh.Conn()); err != nil {
		return err
	}
	if err := p.raw.Ensure(ctx, wh.Conn()); err != nil {
		return err
	}
	if _, err := wh.Exec(ctx, ensurePollStateSQL, p.conf.Source); err != nil {
		return fmt.Errorf("poll %s: %w", p.conf.Source, err)
	}
	p.prepared = true
	return nil
}

// checkColumns checks the updated_at and soft-delete columns: a timestamp
// without time zone is accepted only with a configured zone, because its
// values jump at daylight-saving changes otherwise.
func (p *Poller) checkColumns() error {
	conf, name := p.conf, p.conf.Source
	c, ok := p.table.Column(conf.UpdatedAt)
	switch {
	case !ok:
		return fmt.Errorf("%w: sources.%s.poll.updated_at: %s has no column %s", ErrSource, name, p.table.Source.Sanitize(), conf.UpdatedAt)
	case strings.HasPrefix(c.Type, "timestamp") && strings.HasSuffix(c.Type, "with time zone") && !strings.HasSuffix(c.Type, "without time zone"):
		if conf.TimeZone != "" {
			return fmt.Errorf("%w: sources.%s.poll.time_zone: %s is timestamptz, which carries its zone; remove time_zone",
				ErrSource, name, conf.UpdatedAt)
		}
		p.zone = ""
	case strings.HasPrefix(c.Type, "timestamp") && strings.HasSuffix(c.Type, "without time zone"):
		if conf.TimeZone == "" {
			return fmt.Errorf("%w: sources.%s.poll.time_zone: %s is a timestamp without time zone; set time_zone to the zone its writers use "+
				"(values stored as local time repeat or skip an hour at daylight-saving changes; UTC is safest)", ErrSource, name, conf.UpdatedAt)
		}
		p.zone = conf.TimeZone
	default:
		return fmt.Errorf("%w: sources.%s.poll.updated_at: %s is %s; it must be a timestamptz (or a timestamp with time_zone)",
			ErrSource, name, conf.UpdatedAt, c.Type)
	}
	if !c.NotNull {
		p.log.Warn("the updated_at column may be NULL; rows where it is NULL are never loaded (tidemark keys counts them as not in the mirror)",
			"column", conf.UpdatedAt)
	}
	for _, reserved := range []string{"tidemark_src", "tidemark_key", "tidemark_time", "tidemark_deleted", "tidemark_payload"} {
		if _, clash := p.table.Column(reserved); clash {
			return fmt.Errorf("%w: sources.%s.poll.table: %s has a column %s, a name tidemark reserves while loading; rename it or load a view",
				ErrSource, name, p.table.Source.Sanitize(), reserved)
		}
	}
	p.soft = "false"
	if conf.SoftDelete != "" {
		sd, ok := p.table.Column(conf.SoftDelete)
		col := "tidemark_src." + pgquote.Ident(conf.SoftDelete)
		switch {
		case !ok:
			return fmt.Errorf("%w: sources.%s.poll.soft_delete: %s has no column %s", ErrSource, name, p.table.Source.Sanitize(), conf.SoftDelete)
		case sd.Type == "boolean":
			p.soft = "coalesce(" + col + ", false)"
		case strings.HasPrefix(sd.Type, "timestamp") || sd.Type == "date":
			p.soft = col + " IS NOT NULL"
		default:
			return fmt.Errorf("%w: sources.%s.poll.soft_delete: %s is %s; it must be a boolean or a timestamp", ErrSource, name, conf.SoftDelete, sd.Type)
		}
	}
	return nil
}

// Window overrides a run's window; zero values use the configuration.
type Window struct {
	// Upper is an explicit upper bound (the end of a data interval);
	// default now() - safety_lag on the source's clock.
	Upper time.Time
	// Lookback, when not nil, replaces poll.lookback.
	Lookback *time.Duration
}

// Report is what one run did.
type Report struct {
	Source string
	// Low and Upper bound the window read: (Low, Upper]. Low is -infinity
	// (IsZero) on the first run.
	Low, Upper time.Time
	// Watermark is the high watermark after the run; zero before anything
	// was loaded.
	Watermark time.Time
	Read      int64 // rows read from the source
	Merged    int64 // rows inserted or updated in the mirror
	Inserted  int64
	Updated   int64
	Deleted   int64 // soft-deleted rows (op delete)
	Chunks    int
	// Copied is true when the mirror and the raw table were empty and
	// the rows were COPYed into them rather than merged.
	Copied bool
	// More is true when the run stopped at poll.max_rows_per_run and
	// more rows wait.
	More bool
}

// estimateRows returns the estimated row count of the source table, read
// in tx under a savepoint so that a failure (a role without access to the
// statistics views) leaves the transaction and its cursor usable.
func (p *Poller) estimateRows(ctx context.Context, tx pgx.Tx) (int64, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("source: savepoint: %w", err)
	}
	var est int64
	if err := sp.QueryRow(ctx, estimateSourceRowsSQL, p.table.Source.Sanitize()).Scan(&est); err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return 0, fmt.Errorf("source: estimate the rows of %s: %w (roll back to the savepoint: %w)", p.table.Source.Sanitize(), err, rerr)
		}
		return 0, fmt.Errorf("source: estimate the rows of %s: %w", p.table.Source.Sanitize(), err)
	}
	if err := sp.Commit(ctx); err != nil {
		return 0, fmt.Errorf("source: release the savepoint: %w", err)
	}
	return est, nil
}

// RunOnce loads one window. A failure at any point leaves the watermark,
// the mirror and the raw table as they were; the next run re-reads the
// same rows.
func (p *Poller) RunOnce(ctx context.Context, run Window) (Report, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	// No step of a run, on the source or in the warehouse, may wait
	// longer than p.conf.WriteTimeout: a stalled connection fails the run,
	// which is then repeated on new connections.
	wctx, wd := pgconnect.WithWatchdog(ctx, p.conf.WriteTimeout)
	defer wd.Stop()
	p.wd = wd
	rep, err := p.runOnce(wctx, run)
	if errors.Is(err, errSourceChanged) || errors.Is(err, raw.ErrMissingPartition) || errors.Is(err, errCopyConflict) {
		// Once the mirror has the new columns, or the partition cache is
		// dropped, or the run merges, the same window loads.
		p.log.Info("repeating the run", "reason", err)
		wd.Touch()
		rep, err = p.runOnce(wctx, run)
	}
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		err = fmt.Errorf("%w: %w", context.Cause(wctx), err)
	}
	p.m.observe(p.conf.Source, rep, err, time.Since(start), p.now())
	if err != nil {
		if ctx.Err() == nil && (p.conn == nil || p.conn.IsClosed() || !errors.Is(err, ErrSource)) {
			// The source connection may be mid-transaction or broken;
			// start the next run on a fresh one.
			p.closeConn()
		}
		return rep, fmt.Errorf("poll %s: %w", p.conf.Source, err)
	}
	return rep, nil
}

// pollRow is one source row of a chunk.
type pollRow struct {
	key     string
	time    time.Time
	deleted bool
	row     []byte    // the row as json
	payload []byte    // the row as jsonb takes it
	json    []*string // the values of the json columns, as text (a merge)
	cols    []*string // the values of every column, as text (a COPY)
}

func (p *Poller) runOnce(ctx context.Context, run Window) (Report, error) {
	rep := Report{Source: p.conf.Source}
	if err := p.prepare(ctx); err != nil {
		return rep, err
	}
	lookback := p.conf.Lookback
	if run.Lookback != nil {
		lookback = *run.Lookback
	}
	ingestedAt := p.now()

	wh, err := p.pool.Acquire(ctx)
	if err != nil {
		return rep, fmt.Errorf("warehouse: %w", err)
	}
	defer wh.Release()
	tx, err := wh.Begin(ctx)
	if err != nil {
		return rep, fmt.Errorf("warehouse: %w", err)
	}
	defer pgconnect.Rollback(ctx, tx)
	hw, low, err := p.lockWatermark(ctx, tx, lookback, &rep)
	if err != nil {
		return rep, err
	}

	src, err := p.source(ctx)
	if err != nil {
		return rep, err
	}
	stx, err := src.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return rep, fmt.Errorf("source: %w", err)
	}
	defer pgconnect.Rollback(ctx, stx)
	if err := p.openWindow(ctx, tx, stx, run.Upper, low, &rep); err != nil {
		return rep, err
	}
	tr := p.startProgress(ctx, stx, hw)
	defer tr.Finish(false)
	maxRead, err := p.loadWindow(ctx, tx, stx, hw, ingestedAt, &rep, tr)
	if err != nil {
		return rep, err
	}
	if err := p.advance(ctx, tx, maxRead, ingestedAt, lookback, &rep); err != nil {
		return rep, err
	}
	if err := tx.Commit(ctx); err != nil {
		return rep, fmt.Errorf("commit: %w", err)
	}
	tr.Finish(!rep.More)
	p.log.Debug("poll run", "low", rep.Low, "upper", rep.Upper, "read", rep.Read, "merged", rep.Merged, "watermark", rep.Watermark)
	return rep, nil
}

// lockWatermark locks the source's watermark row in the warehouse
// transaction tx, so that no other run writes the mirror or the raw table
// until tx ends, and returns the high watermark and the window's lower
// bound (the watermark minus lookback), also set in rep.
func (p *Poller) lockWatermark(ctx context.Context, tx pgx.Tx, lookback time.Duration, rep *Report) (hw, low pgtype.Timestamptz, err error) {
	if err := mirror.SetLocal(ctx, tx); err != nil {
		return hw, low, fmt.Errorf("warehouse: %w", err)
	}
	if _, err := tx.Exec(ctx, ensurePollStateSQL, p.conf.Source); err != nil {
		return hw, low, fmt.Errorf("warehouse: %w", err)
	}
	if err := tx.QueryRow(ctx, lockPollStateSQL, p.conf.Source, lookback.Microseconds()).Scan(&hw, &low); err != nil {
		return hw, low, fmt.Errorf("lock the watermark: %w", err)
	}
	if hw.InfinityModifier == pgtype.Finite {
		rep.Watermark = hw.Time
	}
	if low.InfinityModifier == pgtype.Finite {
		rep.Low = low.Time
	}
	return hw, low, nil
}

// openWindow fixes the window's upper bound (upper, or now() - safety_lag
// on the source's clock), decides whether the run COPYs (rep.Copied) and
// declares the cursor over the window in the source transaction stx. It
// returns errSourceChanged when the source table's columns are not those
// the poller described.
func (p *Poller) openWindow(ctx context.Context, tx, stx pgx.Tx, upper time.Time, low pgtype.Timestamptz, rep *Report) error {
	if upper.IsZero() {
		if err := stx.QueryRow(ctx, sourceUpperSQL, p.conf.SafetyLag.Microseconds()).Scan(&upper); err != nil {
			return fmt.Errorf("source clock: %w", err)
		}
	}
	rep.Upper = upper
	copying := false
	if !p.mergeOnly {
		// Under the watermark row's lock no other run writes the mirror
		// or the raw table.
		if err := tx.QueryRow(ctx, fmt.Sprintf(emptyTargetsSQL, p.table.Target.Sanitize(), p.raw.Ident())).Scan(&copying); err != nil {
			return fmt.Errorf("warehouse: %w", err)
		}
	}
	rep.Copied = copying
	if _, err := stx.Exec(ctx, p.cursorSQL(low, upper, copying)); err != nil {
		return fmt.Errorf("source: read %s: %w", p.table.Source.Sanitize(), err)
	}
	// The cursor holds a lock on the table until the end of the
	// transaction, so its columns cannot change under the run; but they
	// may have changed since the poller described them, and a column
	// missing from the mirror would be dropped from the rows silently.
	p.wd.Touch()
	if changed, err := p.table.SourceChanged(ctx, stx.Conn()); err != nil {
		return err
	} else if changed {
		p.prepared = false
		return errSourceChanged
	}
	if _, err := tx.Exec(ctx, createPollStageSQL); err != nil {
		return fmt.Errorf("staging table: %w", err)
	}
	return nil
}

// startProgress starts showing the progress of a first load (no high
// watermark hw yet), which reads the whole table; it returns nil for
// other runs, or when progress is off. The total is only shown: without
// it (a role that may not read the statistics) the load goes on with an
// unknown total.
func (p *Poller) startProgress(ctx context.Context, stx pgx.Tx, hw pgtype.Timestamptz) *progress.Tracker {
	if hw.InfinityModifier == pgtype.Finite || p.progress.Mode() == progress.Off {
		return nil
	}
	est, err := p.estimateRows(ctx, stx)
	if err != nil {
		if !p.estimateWarned {
			p.estimateWarned = true
			p.log.Warn("cannot estimate the rows of the source table; the first load's progress shows no total",
				"table", p.table.Source.Sanitize(), "err", err)
		}
		est = 0
	}
	return p.progress.Start(p.log, progress.Job{Label: "poll first load", Unit: "rows",
		Total: min(est, int64(p.conf.MaxRowsPerRun)), Estimated: true})
}

// loadWindow reads the window from the cursor in chunks and merges (or
// COPYs, rep.Copied) each into the mirror and the raw table, then writes
// the ledger rows. It stops after poll.max_rows_per_run rows newer than
// the high watermark hw (rep.More), and returns the updated_at of the
// last row read.
func (p *Poller) loadWindow(ctx context.Context, tx, stx pgx.Tx, hw pgtype.Timestamptz, ingestedAt time.Time, rep *Report, tr *progress.Tracker) (time.Time, error) {
	var (
		maxRead    time.Time
		fresh      int64      // rows newer than the stored watermark
		cut        *time.Time // set once max_rows_per_run is reached
		ledger     raw.Ledger
		load, stmt = p.mergeChunk, p.mergeSQL()
	)
	if rep.Copied {
		load, stmt = p.copyChunk, p.copySQL()
	}
	// The next chunk is fetched from the source while the current one is
	// merged in the warehouse; at most three chunks are in memory.
	chunks, stopReading := readChunks(ctx, stx, p.conf.ChunkRows, rep.Copied)
	defer stopReading()
	for res := range chunks {
		if res.err != nil {
			return maxRead, fmt.Errorf("source: read %s: %w", p.table.Source.Sanitize(), res.err)
		}
		chunk, stop := res.rows, false
		if rep.Chunks == 0 && len(chunk) > 0 && !p.sameShape(chunk[0].row) {
			// Every row of the cursor has the shape of the first.
			p.prepared = false
			return maxRead, errSourceChanged
		}
		// Rows come in (updated_at, key) order. After the row limit is
		// reached, the rows sharing the last updated_at are still taken,
		// so that the watermark never splits a timestamp.
		for i, r := range chunk {
			if cut != nil && r.time.After(*cut) {
				chunk, stop, rep.More = chunk[:i], true, true
				break
			}
			if !hw.Valid || hw.InfinityModifier == pgtype.NegativeInfinity || r.time.After(hw.Time) {
				fresh++
			}
			if cut == nil && fresh >= int64(p.conf.MaxRowsPerRun) {
				t := r.time
				cut = &t
			}
		}
		if len(chunk) > 0 {
			rep.Chunks++
			rep.Read += int64(len(chunk))
			maxRead = chunk[len(chunk)-1].time
			if err := load(ctx, tx, stmt, chunk, ingestedAt, rep, &ledger); err != nil {
				return maxRead, err
			}
			p.wd.Touch()
			tr.Add(int64(len(chunk)))
		}
		if stop {
			break
		}
	}
	stopReading()
	if rep.More {
		rep.Upper = *cut
	}
	return maxRead, ledger.Write(ctx, tx, ingestedAt)
}

// advance moves the watermark to maxRead, the newest updated_at read (if
// any row was), and stores the source's event-time watermark, in the
// warehouse transaction tx.
func (p *Poller) advance(ctx context.Context, tx pgx.Tx, maxRead, ingestedAt time.Time, lookback time.Duration, rep *Report) error {
	var maxArg pgtype.Timestamptz
	if rep.Read > 0 {
		maxArg = pgtype.Timestamptz{Time: maxRead, Valid: true}
	}
	var after pgtype.Timestamptz
	if err := tx.QueryRow(ctx, advancePollSQL, p.conf.Source, maxArg, rep.Upper, ingestedAt, rep.Read, rep.Merged).Scan(&after); err != nil {
		return fmt.Errorf("advance the watermark: %w", err)
	}
	if after.InfinityModifier != pgtype.Finite {
		return nil
	}
	rep.Watermark = after.Time
	// Rows found through the lookback may be that much older than the
	// watermark.
	wm := after.Time.Add(-max(p.conf.OutOfOrderness, lookback))
	if _, err := tx.Exec(ctx, storeSourceWatermarkSQL, p.conf.Source, wm, ingestedAt); err != nil {
		return fmt.Errorf("store the event-time watermark: %w", err)
	}
	return nil
}

// sameShape reports whether a row read from the source has exactly the
// columns the poller described: to_jsonb of a row of a table altered since
// (even between the start of the run's snapshot and the cursor) has other
// keys, which the merge would drop or set to NULL.
func (p *Poller) sameShape(payload []byte) bool {
	var row map[string]json.RawMessage
	if err := json.Unmarshal(payload, &row); err != nil || len(row) != len(p.table.Columns) {
		return false
	}
	for _, c := range p.table.Columns {
		if _, ok := row[c.Name]; !ok {
			return false
		}
	}
	return true
}

// chunkResult is one fetched chunk, or the error that ended reading.
type chunkResult struct {
	rows []pollRow
	err  error
}

// readChunks fetches chunks of n rows from the cursor in a goroutine until
// a short chunk, an error or stop. stop waits for the goroutine, so the
// source transaction is free again when it returns; it may be called more
// than once.
func readChunks(ctx context.Context, stx pgx.Tx, n int, copying bool) (<-chan chunkResult, func()) {
	out := make(chan chunkResult, 1)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for {
			rows, err := fetchChunk(ctx, stx, n, copying)
			select {
			case out <- chunkResult{rows, err}:
			case <-quit:
				return
			}
			if err != nil || len(rows) < n {
				return
			}
		}
	}()
	var once sync.Once
	return out, func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

func fetchChunk(ctx context.Context, stx pgx.Tx, n int, copying bool) ([]pollRow, error) {
	rows, err := stx.Query(ctx, fmt.Sprintf(fetchPollSQL, n))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (pollRow, error) {
		var pr pollRow
		texts := &pr.json
		if copying {
			texts = &pr.cols
		}
		if err := r.Scan(&pr.key, &pr.time, &pr.deleted, &pr.row, texts); err != nil {
			return pr, err
		}
		var err error
		pr.payload, err = jsonbPayload(pr.row)
		return pr, err
	})
}

// jsonbPayload returns row, a source row as a json object, as jsonb takes
// it: a column value that jsonb refuses (a json value with a \u0000
// escape, a lone surrogate escape or a number numeric cannot hold, also
// inside an array or a composite value) becomes a JSON string of its
// text, which loses nothing.
func jsonbPayload(row []byte) ([]byte, error) {
	if pgjson.JSONBTakes(string(row)) {
		return row, nil
	}
	var cols map[string]json.RawMessage
	if err := json.Unmarshal(row, &cols); err != nil {
		return nil, fmt.Errorf("a source row is not a JSON object: %w", err)
	}
	for name, v := range cols {
		if !pgjson.JSONBTakes(string(v)) {
			s, err := json.Marshal(string(v))
			if err != nil {
				return nil, err
			}
			cols[name] = s
		}
	}
	return json.Marshal(cols)
}

var pollStageColumns = []string{"tidemark_key", "tidemark_time", "tidemark_deleted", "tidemark_payload", "tidemark_json"}

// mergeChunk stages one chunk and merges it, creating the raw partitions
// its event times need first (on another connection: DDL must not run in
// the load transaction).
func (p *Poller) mergeChunk(ctx context.Context, tx pgx.Tx, stmt string, chunk []pollRow, ingestedAt time.Time, rep *Report, ledger *raw.Ledger) error {
	if err := p.ensurePartitions(ctx, chunk); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, truncatePollStageSQL); err != nil {
		return fmt.Errorf("staging table: %w", err)
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"tidemark_poll_stage"}, pollStageColumns, pgx.CopyFromSlice(len(chunk), func(i int) ([]any, error) {
		r := &chunk[i]
		return []any{r.key, r.time, r.deleted, r.payload, r.json}, nil
	}))
	if err != nil {
		return fmt.Errorf("stage rows: %w", err)
	}
	rows, err := tx.Query(ctx, stmt, ingestedAt, p.table.Source.Sanitize())
	if err != nil {
		return p.mergeError(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			op       string
			bucket   pgtype.Timestamptz
			n        int64
			min, max pgtype.Timestamptz
		)
		if err := rows.Scan(&op, &bucket, &n, &min, &max); err != nil {
			return err
		}
		switch op {
		case "merged":
			rep.Merged += n
			continue
		case "insert":
			rep.Inserted += n
		case "update":
			rep.Updated += n
		case "delete":
			rep.Deleted += n
		}
		ledger.AddHour(p.conf.Source, bucket.Time, n, min.Time, max.Time)
	}
	if err := rows.Err(); err != nil {
		return p.mergeError(err)
	}
	return nil
}

// ensurePartitions creates the raw partitions the chunk's event times need
// (on another connection: DDL must not run in the load transaction).
func (p *Poller) ensurePartitions(ctx context.Context, chunk []pollRow) error {
	times := make([]time.Time, len(chunk))
	for i, r := range chunk {
		times[i] = r.time
	}
	missing := p.raw.Missing(times)
	if len(missing) == 0 {
		return nil
	}
	ddl, err := p.ddlConn(ctx)
	if err != nil {
		return err
	}
	return p.raw.EnsurePartitions(ctx, ddl, missing)
}

// copyChunk loads one chunk into a mirror and raw table that were empty
// when the run began, so every row is new: the rows are COPYed into both
// (the mirror with stmt, copySQL) instead of merged, which makes a first
// load about as fast as COPYing the same rows. The mirror's values are the
// source columns' text, read under the same session settings
// (mirror.SessionParams) on both sides; the change rows are those the
// merge would write. A row already there (not possible while this poller
// is the tables' only writer and the source key is unique) fails the run
// with errCopyConflict, and it is repeated with the merge.
func (p *Poller) copyChunk(ctx context.Context, tx pgx.Tx, stmt string, chunk []pollRow, ingestedAt time.Time, rep *Report, ledger *raw.Ledger) error {
	if err := p.ensurePartitions(ctx, chunk); err != nil {
		return err
	}
	w := copytext.New()
	defer w.Release()
	for i := range chunk {
		for _, v := range chunk[i].cols {
			w.Value(v)
		}
		w.Time(ingestedAt)
		w.Null()
		w.End()
	}
	if _, err := w.CopyFrom(ctx, tx.Conn().PgConn(), stmt); err != nil {
		return p.copyError(err, p.table.Target.Sanitize())
	}
	source := p.table.Source.Sanitize()
	_, err := tx.CopyFrom(ctx, raw.TableName(p.raw.Source), pollChangeColumns.Names(), pgx.CopyFromSlice(len(chunk), func(i int) ([]any, error) {
		r := &chunk[i]
		op := "insert"
		if r.deleted {
			op = "delete"
		}
		return []any{r.key, r.time, ingestedAt, op, source, r.payload, r.key}, nil
	}))
	if err != nil {
		return p.copyError(err, p.raw.Ident())
	}
	for i := range chunk {
		r := &chunk[i]
		if r.deleted {
			rep.Deleted++
		} else {
			rep.Inserted++
		}
		ledger.Add(p.conf.Source, r.time)
	}
	rep.Merged += int64(len(chunk))
	return nil
}

// pollChangeColumns are the columns of the change rows a poll source
// writes: a row read by its updated_at has no old row or commit LSN.
var pollChangeColumns = raw.ChangeColumns.Without("old_row", "commit_lsn")

// copyError explains a failed COPY of a chunk: a unique violation becomes
// errCopyConflict (and later runs merge), a missing raw partition is
// handled as in a merge.
func (p *Poller) copyError(err error, what string) error {
	var pgErr *pgconn.PgError
	if pgerr.UniqueViolation(err) && errors.As(err, &pgErr) {
		p.mergeOnly = true
		return fmt.Errorf("%w (%s: %s)", errCopyConflict, what, pgErr.Message)
	}
	if pgerr.MissingPartition(err) {
		return p.mergeError(err)
	}
	return fmt.Errorf("copy into %s: %w", what, err)
}

// mergeError explains a failed merge. A raw partition dropped by an
// operator since this process saw it is forgotten, so that the repeated
// run creates it again.
func (p *Poller) mergeError(err error) error {
	if pgerr.MissingPartition(err) {
		p.raw.Forget()
		return fmt.Errorf("%w: %w", raw.ErrMissingPartition, err)
	}
	return fmt.Errorf("merge into %s: %w", p.table.Target.Sanitize(), err)
}

// withDefaults fills the options left empty.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Progress == nil {
		o.Progress = progress.Service(progress.DefaultEvery)
	}
	return o
}

// Run polls on the source's interval until ctx ends, and returns nil. A
// run that stopped at max_rows_per_run is followed at once; a failed run
// is logged and retried after 1s, doubling up to poll.every; a run while
// the source is paused (Options.Paused) is skipped.
func (p *Poller) Run(ctx context.Context) error {
	every := p.conf.Every
	var more bool   // the last run stopped at max_rows_per_run
	var paused bool // the last run was skipped: the source is paused
	job := periodic.Job{
		Name:    "poll run",
		Every:   every,
		Backoff: backoff.Backoff{First: time.Second, Max: every},
		Log:     p.log,
		Run: func(ctx context.Context) error {
			if now := p.isPaused != nil && p.isPaused(p.conf.Source); now != paused {
				paused = now
				if paused {
					p.log.Info("source paused: its poll runs are skipped")
				} else {
					p.log.Info("source resumed: its poll runs go on")
				}
			}
			if paused {
				more = false
				return nil
			}
			rep, err := p.RunOnce(ctx, Window{})
			more = err == nil && rep.More
			if err == nil && rep.Merged > 0 && ctx.Err() == nil {
				p.log.Info("poll run", "read", rep.Read, "merged", rep.Merged, "watermark", rep.Watermark, "more", rep.More)
			}
			return err
		},
		Next: func(_ error, wait time.Duration) time.Duration {
			if more {
				return 0
			}
			return wait
		},
	}
	err := job.Loop(ctx) // no run's error is final
	p.Close()
	return err
}
