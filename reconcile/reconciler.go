package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/raw"
)

// Options customise a Reconciler beyond its configuration.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the service clock: it decides partition states and stamps
	// rebuilds. Default time.Now.
	Now func() time.Time
	// AfterClaim, when set, runs after a claim has committed and before
	// the partitions are rebuilt; an error ends the run there. Tests use
	// it to crash between claim and rebuild.
	AfterClaim func(aggregate string) error
}

// Reconciler keeps the configured aggregates up to date.
type Reconciler struct {
	cfg   *config.Config
	pool  *pgxpool.Pool
	log   *slog.Logger
	now   func() time.Time
	m     *metrics
	defs  map[string]*aggregate.Definition
	names []string
	after func(string) error

	prepared map[string]bool
	exported map[string]map[string]bool // completeness series per aggregate
}

// withDefaults fills the options left empty.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// New builds a Reconciler for every aggregate of cfg.
func New(cfg *config.Config, pool *pgxpool.Pool, opts Options) (*Reconciler, error) {
	opts = opts.withDefaults()
	r := &Reconciler{cfg: cfg, pool: pool, log: opts.Logger.With("component", "reconcile"), now: opts.Now, defs: map[string]*aggregate.Definition{},
		after: opts.AfterClaim, exported: map[string]map[string]bool{}, prepared: map[string]bool{}}
	policies := map[string]string{}
	for _, name := range cfg.AggregateNames() {
		d, err := aggregate.FromConfig(cfg, name)
		if err != nil {
			return nil, err
		}
		r.defs[name] = d
		r.names = append(r.names, name)
		policies[name] = d.Policy
	}
	if len(r.names) == 0 {
		return nil, errors.New("reconcile: no aggregates configured")
	}
	reg := opts.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	r.m = newMetrics(reg, r.names, policies)
	return r, nil
}

// Aggregates returns the aggregate names in order.
func (r *Reconciler) Aggregates() []string { return r.names }

// Prepare checks every aggregate (see prepare). Configuration problems
// come back as errors naming the key to fix.
func (r *Reconciler) Prepare(ctx context.Context) error {
	for _, name := range r.names {
		if err := r.prepare(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// Definition prepares the named aggregate (see Prepare) and returns it:
// backfills and verification rebuild through the same definition.
func (r *Reconciler) Definition(ctx context.Context, name string) (*aggregate.Definition, error) {
	if r.defs[name] == nil {
		return nil, fmt.Errorf("reconcile: no aggregate named %q", name)
	}
	if err := r.prepare(ctx, name); err != nil {
		return nil, err
	}
	return r.defs[name], nil
}

// ensureStateSQL creates an aggregate's load watermark row; stateSourceSQL
// reads the source it was created for. They are two statements so that the
// read sees a row another instance inserted concurrently (a statement's
// snapshot would not).
const (
	ensureStateSQL = `
INSERT INTO tidemark.load_watermarks (aggregate, source) VALUES ($1, $2)
ON CONFLICT (aggregate) DO NOTHING`
	stateSourceSQL = `SELECT source FROM tidemark.load_watermarks WHERE aggregate = $1`
)

// prepare makes sure the raw table of a Kafka, poll or CDC source exists
// (or that a table source's table has the configured columns), checks the aggregate
// against the warehouse (see aggregate.Prepare), creating a missing
// target table, and creates its state.
func (r *Reconciler) prepare(ctx context.Context, name string) error {
	if r.prepared[name] {
		return nil
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	defer conn.Release()
	d := r.defs[name]
	src := r.cfg.Sources[d.Source]
	switch {
	case src.Kind().Kafka(), src.Kind() == config.KindPoll, src.Kind() == config.KindCDC:
		raw := raw.ForSource(r.cfg, d.Source)
		raw.Log = r.log
		if err := raw.Ensure(ctx, conn.Conn()); err != nil {
			return err
		}
	default:
		if err := checkTableSource(ctx, conn.Conn(), d); err != nil {
			return err
		}
	}
	if err := aggregate.Prepare(ctx, conn.Conn(), d); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, ensureStateSQL, d.Name, d.Source); err != nil {
		return fmt.Errorf("reconcile %s: %w", name, err)
	}
	var stored string
	if err := conn.QueryRow(ctx, stateSourceSQL, d.Name).Scan(&stored); err != nil {
		return fmt.Errorf("reconcile %s: %w", name, err)
	}
	if stored != d.Source {
		return fmt.Errorf("aggregates.%s.source: the aggregate was built from source %s, not %s; its state would not match "+
			"the new source: give the aggregate a new name (or remove its state with tidemark forget --aggregate %s "+
			"while no configuration names it, and empty %s)", name, stored, d.Source, name, d.Target.Sanitize())
	}
	var prev aggregate.Registered
	var changed bool
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		prev, changed, err = aggregate.Register(ctx, tx, d, r.now())
		return err
	})
	if err != nil {
		return fmt.Errorf("reconcile %s: %w", name, err)
	}
	if changed && prev.Defined {
		r.log.Info("the aggregate's definition changed; every instance reconciling it should run this configuration",
			"aggregate", name, "partition", d.Calendar.By+" "+d.Calendar.Loc.String(), "lateness_horizon", config.Duration(d.Horizon),
			"beyond_horizon", d.Policy, "was_partition", prev.Calendar.By+" "+zoneName(prev.Calendar.Loc),
			"was_lateness_horizon", config.Duration(prev.Horizon), "was_beyond_horizon", prev.Policy)
	}
	r.prepared[name] = true
	return nil
}

func zoneName(loc *time.Location) string {
	if loc == nil {
		return "?"
	}
	return loc.String()
}

// tableColumnsSQL lists the columns of a table with their types.
const tableColumnsSQL = `
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

// checkTableSource verifies that a table source's table exists and has the
// configured columns, the time columns as timestamptz.
func checkTableSource(ctx context.Context, conn *pgx.Conn, d *aggregate.Definition) error {
	key := "sources." + d.Source + ".table"
	rows, err := conn.Query(ctx, tableColumnsSQL, d.Raw.Sanitize())
	if err != nil {
		return fmt.Errorf("%s.name: %w", key, err)
	}
	cols := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			rows.Close()
			return err
		}
		cols[name] = typ
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(cols) == 0 {
		return fmt.Errorf("%s.name: table %s does not exist", key, d.Raw.Sanitize())
	}
	for _, c := range []struct{ key, col string }{{"event_time", d.EventTime}, {"ingested_at", d.IngestedAt}} {
		switch typ, ok := cols[c.col]; {
		case !ok:
			return fmt.Errorf("%s.%s: %s has no column %q", key, c.key, d.Raw.Sanitize(), c.col)
		case typ != "timestamp with time zone":
			return fmt.Errorf("%s.%s: %s.%s is %s; it must be timestamp with time zone (timestamptz) so that its instants are unambiguous",
				key, c.key, d.Raw.Sanitize(), c.col, typ)
		}
	}
	for i, k := range d.EventKey {
		if _, ok := cols[k]; !ok {
			return fmt.Errorf("%s.key[%d]: %s has no column %q", key, i, d.Raw.Sanitize(), k)
		}
	}
	return nil
}

// Report says what one run of one aggregate did.
type Report struct {
	Aggregate string
	Busy      bool     // another instance held the aggregate (only when not waiting)
	Read      int64    // ledger rows (or table rows) read
	Queued    int      // partitions queued by this run
	Recorded  int64    // events recorded in tidemark.corrections by this run
	Rebuilt   []string // partitions rebuilt by this run, by label, in the order rebuilt
	Failed    []string // partitions whose rebuild failed
	Remaining int64    // partitions still queued after the run, those other instances are rebuilding included
	Failing   int64    // of Remaining, partitions whose last rebuild failed
	Watermark string   // load watermark after the run: an xid, or an ingestion time
}

// lockKey is the session advisory lock that makes one instance at a time
// claim an aggregate's new data and update its partition states.
func lockKey(name string) string { return aggregate.ReconcileLockKey(name) }

// The aggregate's session advisory lock: tried, waited for, released.
const (
	tryLockSQL = `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`
	lockSQL    = `SELECT pg_advisory_lock(hashtextextended($1, 0))`
	unlockSQL  = `SELECT pg_advisory_unlock(hashtextextended($1, 0))`
)

// RunOnce reconciles one aggregate: it claims the new data, rebuilds
// queued partitions and updates partition states, holding the aggregate's
// lock. When another instance holds it, RunOnce without wait returns a
// Busy report at once (Run then calls Help); with wait it first rebuilds
// queued partitions beside that instance, as Help does, then waits for
// the lock and runs.
func (r *Reconciler) RunOnce(ctx context.Context, name string, wait bool) (Report, error) {
	rep := Report{Aggregate: name}
	d, conn, err := r.acquire(ctx, name)
	if err != nil {
		return rep, err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, tryLockSQL, lockKey(name)).Scan(&got); err != nil {
		return rep, fmt.Errorf("reconcile %s: lock: %w", name, err)
	}
	if !got && !wait {
		rep.Busy = true
		r.m.runs.WithLabelValues(name, "busy").Inc()
		return rep, nil
	}
	if !got {
		// Another instance is claiming or rebuilding: rebuild queued
		// partitions beside it (see Help), then wait for it.
		if err := r.rebuildQueued(ctx, conn.Conn(), d, r.now(), &rep); err != nil {
			r.m.runs.WithLabelValues(name, "error").Inc()
			return rep, err
		}
		if _, err := conn.Exec(ctx, lockSQL, lockKey(name)); err != nil {
			pgconnect.Close(ctx, conn.Conn()) // the lock may be held by a cancelled wait
			return rep, fmt.Errorf("reconcile %s: wait for lock: %w", name, err)
		}
	}
	defer func() {
		cctx, cancel := pgconnect.Cleanup(ctx)
		defer cancel()
		if _, err := conn.Exec(cctx, unlockSQL, lockKey(name)); err != nil {
			pgconnect.Close(ctx, conn.Conn())
		}
	}()
	err = r.run(ctx, conn.Conn(), d, &rep)
	result := "ok"
	if err != nil {
		result = "error"
	}
	r.m.runs.WithLabelValues(name, result).Inc()
	return rep, err
}

func (r *Reconciler) run(ctx context.Context, conn *pgx.Conn, d *aggregate.Definition, rep *Report) error {
	now := r.now()
	var w *window
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		if ts := r.cfg.Sources[d.Source].Table; ts != nil {
			var through time.Time
			w, through, err = r.claimTable(ctx, tx, d, ts, now)
			rep.Watermark = through.UTC().Format(time.RFC3339Nano)
		} else {
			w, rep.Watermark, err = r.claimLedger(ctx, tx, d, now)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("reconcile %s: claim: %w", d.Name, err)
	}
	rep.Read, rep.Queued, rep.Recorded = w.rows, len(w.queue), w.recorded
	for label, n := range w.late {
		r.m.late.WithLabelValues(d.Name, label).Add(float64(n))
	}
	r.m.beyond.WithLabelValues(d.Name, d.Policy).Add(float64(w.recorded))
	if rep.Queued > 0 {
		r.log.Info("claimed partitions", "aggregate", d.Name, "read", w.rows, "queued", rep.Queued, "load_watermark", rep.Watermark)
	}
	if r.after != nil {
		if err := r.after(d.Name); err != nil {
			return err
		}
	}
	if err := r.rebuildQueued(ctx, conn, d, now, rep); err != nil {
		return err
	}
	if err := r.updateStates(ctx, conn, d, w); err != nil {
		return err
	}
	return nil
}

const (
	// nextPendingSQL locks the next queued partition to rebuild: one that
	// is due (next_attempt_at is not after the run's start), those that
	// have not failed first, newest first; with $3, only that partition.
	nextPendingSQL = `
SELECT partition_start, attempts FROM tidemark.pending_partitions
WHERE aggregate = $1 AND (next_attempt_at IS NULL OR next_attempt_at <= $2)
  AND ($3::timestamptz IS NULL OR partition_start = $3)
ORDER BY attempts, partition_start DESC
LIMIT 1
FOR UPDATE SKIP LOCKED`

	donePendingSQL = `DELETE FROM tidemark.pending_partitions WHERE aggregate = $1 AND partition_start = $2`

	// failPendingSQL records a failed rebuild. failing_since keeps the
	// first failure in a row; a successful rebuild deletes the row.
	failPendingSQL = `
UPDATE tidemark.pending_partitions
SET attempts = $3, last_error = $4, failing_since = coalesce(failing_since, $5), next_attempt_at = $6
WHERE aggregate = $1 AND partition_start = $2
RETURNING failing_since`

	countPendingSQL = `
SELECT count(*), count(*) FILTER (WHERE attempts > 0)
FROM tidemark.pending_partitions WHERE aggregate = $1`
)

// maxRetryBackoff caps the delay between the rebuilds of a partition that
// keeps failing (unless reconcile.every is longer).
const maxRetryBackoff = time.Hour

// retryBackoff is the delay after the failures-th failed rebuild in a row
// of a partition: every (reconcile.every) after the first, doubled after
// each further one, at most maxRetryBackoff or every, whichever is longer.
// It is stored as the partition's next_attempt_at, so it has no jitter.
func retryBackoff(every time.Duration, failures int) time.Duration {
	return backoff.Delay(every, max(maxRetryBackoff, every), failures)
}

// rebuildOutcome is what rebuildNext did.
type rebuildOutcome struct {
	found    bool      // a partition was picked
	start    time.Time // its start
	rows     int64     // rows written by a successful rebuild
	recorded int64     // events it recorded in tidemark.corrections
	// failed is the error of a rebuild that failed through the partition's
	// fault (aggregate.PartitionFault), recorded in the queue with
	// attempts, failingSince and nextAttempt.
	failed       error
	attempts     int
	failingSince time.Time
	nextAttempt  time.Time
}

// rebuildQueued rebuilds queued partitions that are due, newest first, each
// in its own transaction, up to reconcile.max_partitions_per_run, leaving
// out those that other instances are rebuilding at the time. A
// partition whose rebuild fails through its own fault stays queued, with
// the error, and is left alone until its next attempt (see retryBackoff);
// partitions that are not due are not counted against the limit. A
// deadlock or serialization failure is tried again at once, up to
// aggregate.RebuildAttempts times. Any other failure means that the
// warehouse cannot work: it ends the run without being recorded against
// the partition, which the next run tries again. now is the run's start.
func (r *Reconciler) rebuildQueued(ctx context.Context, conn *pgx.Conn, d *aggregate.Definition, now time.Time, rep *Report) error {
	for range int(r.cfg.Reconcile.MaxPartitionsPerRun) {
		started := time.Now()
		var o rebuildOutcome
		var only *time.Time
		var err error
		for attempt := 1; ; attempt++ {
			last := attempt == aggregate.RebuildAttempts
			o, err = r.rebuildNext(ctx, conn, d, now, only, last)
			if err == nil || last || ctx.Err() != nil || !pgerr.Retryable(err) {
				break
			}
			r.log.Warn("partition rebuild lost a race with another transaction; trying again", "aggregate", d.Name,
				"partition", d.Calendar.At(o.start).Label(), "attempt", attempt, "err", err)
			start := o.start
			only = &start
		}
		if err != nil {
			return fmt.Errorf("reconcile %s: rebuild: %w", d.Name, err)
		}
		if !o.found {
			if only != nil {
				// The partition left the queue between the attempts, or
				// another instance picked it meanwhile.
				continue
			}
			break
		}
		label := d.Calendar.At(o.start).Label()
		if o.failed != nil {
			rep.Failed = append(rep.Failed, label)
			r.m.rebuildErrors.WithLabelValues(d.Name).Inc()
			r.log.Error("partition rebuild failed; it stays queued", "aggregate", d.Name, "partition", label,
				"attempts", o.attempts, "failing_since", o.failingSince, "next_attempt_at", o.nextAttempt, "err", o.failed)
			continue
		}
		rep.Rebuilt = append(rep.Rebuilt, label)
		rep.Recorded += o.recorded
		r.m.beyond.WithLabelValues(d.Name, d.Policy).Add(float64(o.recorded))
		if o.recorded > 0 {
			r.log.Warn("a rebuild left out events beyond the lateness horizon that no claim had recorded; recorded them in tidemark.corrections",
				"aggregate", d.Name, "partition", label, "events", o.recorded, "lateness_horizon", config.Duration(d.Horizon))
		}
		r.log.Debug("rebuilt partition", "aggregate", d.Name, "partition", label, "rows", o.rows)
		r.m.rebuilt.WithLabelValues(d.Name).Inc()
		r.m.rebuildSecs.WithLabelValues(d.Name).Observe(time.Since(started).Seconds())
	}
	if err := conn.QueryRow(ctx, countPendingSQL, d.Name).Scan(&rep.Remaining, &rep.Failing); err != nil {
		return fmt.Errorf("reconcile %s: %w", d.Name, err)
	}
	r.m.queued.WithLabelValues(d.Name).Set(float64(rep.Remaining))
	r.m.failing.WithLabelValues(d.Name).Set(float64(rep.Failing))
	if rep.Remaining > 0 {
		r.log.Info("partitions still queued after this run", "aggregate", d.Name, "queued", rep.Remaining,
			"failing", rep.Failing, "max_partitions_per_run", r.cfg.Reconcile.MaxPartitionsPerRun)
	}
	return nil
}

// Help rebuilds due queued partitions of one aggregate, as a run does
// and at most reconcile.max_partitions_per_run, without taking the
// aggregate's lock: an instance that finds the aggregate held calls it, so
// that several instances share a large queue. It neither claims nor
// updates partition states, which stay with the lock holder. Each
// partition is picked FOR UPDATE SKIP LOCKED and so rebuilt by one
// instance at a time, and a claim that queues a partition while it is
// being rebuilt waits for that rebuild and queues it again
// (queuePartitionsSQL).
func (r *Reconciler) Help(ctx context.Context, name string) (Report, error) {
	rep := Report{Aggregate: name}
	d, conn, err := r.acquire(ctx, name)
	if err != nil {
		return rep, err
	}
	defer conn.Release()
	return rep, r.rebuildQueued(ctx, conn.Conn(), d, r.now(), &rep)
}

// acquire returns aggregate name, prepared, and a connection of the pool
// to work on it with; the caller releases the connection.
func (r *Reconciler) acquire(ctx context.Context, name string) (*aggregate.Definition, *pgxpool.Conn, error) {
	d := r.defs[name]
	if d == nil {
		return nil, nil, fmt.Errorf("reconcile: no aggregate named %q", name)
	}
	if err := r.prepare(ctx, name); err != nil {
		return nil, nil, err
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile %s: %w", name, err)
	}
	return d, conn, nil
}

// rebuildNext rebuilds the next due partition (or only, when set) in one
// transaction that also removes it from the queue. A failure through the
// partition's fault is recorded in the queue, unless it is a retryable one
// and record is false; every other failure is returned and leaves the
// queue as it was.
func (r *Reconciler) rebuildNext(ctx context.Context, conn *pgx.Conn, d *aggregate.Definition, now time.Time, only *time.Time, record bool) (rebuildOutcome, error) {
	var o rebuildOutcome
	if only != nil {
		o.start = *only
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var attempts int
		err := tx.QueryRow(ctx, nextPendingSQL, d.Name, now, only).Scan(&o.start, &attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		o.found = true
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		res, err := aggregate.Rebuild(ctx, sp, d, d.Calendar.At(o.start), r.now())
		if err == nil {
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			o.rows, o.recorded = res.Rows, res.Recorded
			_, err = tx.Exec(ctx, donePendingSQL, d.Name, o.start)
			return err
		}
		if ctx.Err() != nil || !aggregate.PartitionFault(err) || (!record && pgerr.Retryable(err)) {
			// Not the partition's doing, or to be tried again at once.
			return err
		}
		if rbErr := sp.Rollback(ctx); rbErr != nil {
			return fmt.Errorf("%w (rolling back: %w)", err, rbErr)
		}
		o.failed, o.attempts = err, attempts+1
		o.nextAttempt = now.Add(retryBackoff(r.cfg.Reconcile.Every.Duration(), o.attempts))
		return tx.QueryRow(ctx, failPendingSQL, d.Name, o.start, o.attempts, err.Error(), r.now(), o.nextAttempt).Scan(&o.failingSince)
	})
	if err != nil {
		o.failed = nil
	}
	return o, err
}

// prepareRetry is the wait before Prepare is tried again when the
// warehouse could not work (see waitable).
const prepareRetry = 5 * time.Second

// Run prepares every aggregate (see prepareAll), then reconciles them in
// passes every reconcile.every, measured from the start of each pass, until
// ctx is cancelled (see pass). It returns an error only when the
// configuration does not fit the warehouse.
func (r *Reconciler) Run(ctx context.Context) error {
	if err := r.prepareAll(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	job := periodic.Job{Name: "reconcile", Every: r.cfg.Reconcile.Every.Duration(), FromStart: true, Log: r.log,
		Run: func(ctx context.Context) error {
			r.pass(ctx)
			return nil // pass logs each aggregate's failure
		}}
	return job.Loop(ctx)
}

// prepareAll runs Prepare, each attempt within reconcile.run_timeout, until
// it succeeds or ctx ends (nil), or fails through the configuration (that
// error). A warehouse that cannot work, or refuses the connection, is
// waited out, prepareRetry between attempts.
func (r *Reconciler) prepareAll(ctx context.Context) error {
	retry := backoff.Backoff{First: prepareRetry, Max: prepareRetry}
	for {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.Reconcile.RunTimeout.Duration())
		err := r.Prepare(pctx)
		cancel()
		switch {
		case err == nil, ctx.Err() != nil:
			return nil
		case !waitable(err):
			return err
		}
		r.log.Warn("cannot prepare aggregates; retrying", "err", err)
		if retry.Wait(ctx) != nil {
			return nil
		}
	}
}

// pass reconciles every aggregate once, in name order, each within
// reconcile.run_timeout. For an aggregate that another instance is
// reconciling, it only rebuilds queued partitions beside it (see Help). A
// failed run is logged and left to the next pass; when ctx ends, the pass
// ends without a word.
func (r *Reconciler) pass(ctx context.Context) {
	for _, name := range r.names {
		rctx, cancel := context.WithTimeout(ctx, r.cfg.Reconcile.RunTimeout.Duration())
		rep, err := r.RunOnce(rctx, name, false)
		busy := err == nil && rep.Busy
		if busy {
			rep, err = r.Help(rctx, name)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && busy:
			r.log.Error("rebuilding beside another instance failed", "aggregate", name, "err", err)
		case err != nil:
			r.log.Error("reconcile run failed", "aggregate", name, "err", err)
		case busy && len(rep.Rebuilt) > 0:
			r.log.Info("another instance is reconciling; rebuilt queued partitions beside it", "aggregate", name,
				"rebuilt", len(rep.Rebuilt), "queued", rep.Remaining)
		case busy:
			r.log.Debug("another instance is reconciling; standing by", "aggregate", name)
		}
	}
}

// waitable reports whether a failed Prepare is waited out rather than
// ending Run: the warehouse cannot work now (pgerr.Unavailable: it cannot
// be reached, is starting up, shutting down or out of connections, or the
// run timed out), or it refused the connection itself
// (pgerr.ConnectFailure). Any other error is the configuration's: an SQL
// error (a query that does not parse, a table of another shape) or a
// check of the configuration against the warehouse.
func waitable(err error) bool { return pgerr.Unavailable(err) || pgerr.ConnectFailure(err) }
