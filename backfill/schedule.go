package backfill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/promreg"
)

// Schedule runs an aggregate's safety nets inside `tidemark run`: a
// verification of every partition every VerifyEvery, and a full refresh
// every RefreshEvery (zero runs none). Intervals are measured on the
// service clock from the last scheduled verification and the last full
// refresh recorded in the warehouse, so restarts neither skip nor repeat
// them, and several instances run each once: a verification takes an
// advisory lock, a refresh the backfill's own.
type Schedule struct {
	Pool      *pgxpool.Pool
	Aggregate string
	// Definition returns the aggregate prepared (reconcile.Reconciler's
	// Definition).
	Definition                func(ctx context.Context, name string) (*aggregate.Definition, error)
	VerifyEvery, RefreshEvery time.Duration
	Now                       func() time.Time
	Logger                    *slog.Logger
	Registerer                prometheus.Registerer
	// Check is how often the schedule looks whether a run is due, in
	// real time; default 30 seconds.
	Check time.Duration

	// holdUntil puts a kind of run off after a failure that left no record
	// to measure its interval from.
	holdUntil map[string]time.Time
}

// failedWait is how long a run that failed before it was recorded waits
// before it is tried again.
const failedWait = 5 * time.Minute

type scheduleMetrics struct {
	verifies  *prometheus.CounterVec
	drifted   *prometheus.GaugeVec
	verified  *prometheus.GaugeVec
	refreshes *prometheus.CounterVec
}

func newScheduleMetrics(reg prometheus.Registerer) *scheduleMetrics {
	return &scheduleMetrics{
		verifies: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_verify_runs_total",
			Help: "Scheduled verifications by result: ok, drift (a partition differs from a rebuild and no pending work explains it), error.",
		}, []string{"aggregate", "result"})),
		drifted: promreg.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_verify_drifted_partitions",
			Help: "Partitions the last scheduled verification found different from a rebuild, not counting those with loads the reconciler has yet to read or rebuild.",
		}, []string{"aggregate"})),
		verified: promreg.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_verify_last_run_timestamp_seconds",
			Help: "Service time at which the last scheduled verification finished.",
		}, []string{"aggregate"})),
		refreshes: promreg.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tidemark_refresh_runs_total",
			Help: "Scheduled full refreshes by result: ok, failed (some chunks failed), error.",
		}, []string{"aggregate", "result"})),
	}
}

const (
	lastVerifySQL  = `SELECT max(started_at) FROM tidemark.verify_runs WHERE aggregate = $1 AND scheduled`
	lastRefreshSQL = `SELECT max(started_at) FROM tidemark.backfill_runs WHERE aggregate = $1 AND kind = 'refresh'`
	tryVerifySQL   = `SELECT pg_try_advisory_lock(hashtextextended('tidemark.verify.' || $1, 0))`
	untryVerifySQL = `SELECT pg_advisory_unlock(hashtextextended('tidemark.verify.' || $1, 0))`
)

// Run runs the schedule until ctx ends: every Check, measured from the
// start of each look, it runs what is due (see tick). Failures are logged
// and counted, and tried again when the next run is due.
func (s *Schedule) Run(ctx context.Context) error {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "reconcile", "aggregate", s.Aggregate)
	now := s.Now
	if now == nil {
		now = time.Now
	}
	reg := s.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := newScheduleMetrics(reg)
	check := s.Check
	if check <= 0 {
		check = 30 * time.Second
	}
	s.holdUntil = map[string]time.Time{}
	job := periodic.Job{Name: "schedule", Every: check, FromStart: true, Log: log,
		Run: func(ctx context.Context) error {
			s.tick(ctx, log, m, now)
			return nil // verify and refresh log and count their own failures
		}}
	return job.Loop(ctx)
}

// tick runs a verification and a full refresh when they are due.
func (s *Schedule) tick(ctx context.Context, log *slog.Logger, m *scheduleMetrics, now func() time.Time) {
	if s.VerifyEvery > 0 && s.due(ctx, lastVerifySQL, s.VerifyEvery, now()) {
		s.verify(ctx, log, m, now)
	}
	if s.RefreshEvery > 0 && time.Now().After(s.holdUntil["refresh"]) && s.due(ctx, lastRefreshSQL, s.RefreshEvery, now()) {
		s.refresh(ctx, log, m, now)
	}
}

// due reports whether the last run that sql finds is every or more behind
// now, or there was none.
func (s *Schedule) due(ctx context.Context, sql string, every time.Duration, now time.Time) bool {
	var last *time.Time
	if err := s.Pool.QueryRow(ctx, sql, s.Aggregate).Scan(&last); err != nil {
		return false
	}
	return last == nil || !now.Before(last.Add(every))
}

func (s *Schedule) verify(ctx context.Context, log *slog.Logger, m *scheduleMetrics, now func() time.Time) {
	conn, err := s.Pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, tryVerifySQL, s.Aggregate).Scan(&got); err != nil || !got {
		return
	}
	defer func() {
		cctx, cancel := pgconnect.Cleanup(ctx)
		defer cancel()
		if _, err := conn.Exec(cctx, untryVerifySQL, s.Aggregate); err != nil {
			pgconnect.Close(ctx, conn.Conn())
		}
	}()
	// Another instance may have run it while this one waited.
	if !s.due(ctx, lastVerifySQL, s.VerifyEvery, now()) {
		return
	}
	started := now()
	var checks []Check
	d, err := s.Definition(ctx, s.Aggregate)
	if err == nil {
		checks, err = Verify(ctx, s.Pool, d, nil)
	}
	if ctx.Err() != nil {
		return
	}
	if rerr := RecordVerify(ctx, s.Pool, s.Aggregate, true, started, now(), checks, err); rerr != nil {
		log.Error("cannot record the scheduled verification", "err", rerr)
	}
	compared, drifted, pending, archived := Tally(checks)
	switch {
	case err != nil:
		m.verifies.WithLabelValues(s.Aggregate, "error").Inc()
		log.Error("scheduled verification failed; tried again at the next interval", "err", err, "verify_every", s.VerifyEvery)
		return
	case drifted > 0:
		m.verifies.WithLabelValues(s.Aggregate, "drift").Inc()
		var labels []string
		for _, c := range checks {
			if c.Unexpected() && len(labels) < 10 {
				labels = append(labels, c.Partition.Label())
			}
		}
		log.Error("scheduled verification found partitions that differ from a rebuild", "drifted", drifted, "partitions", labels,
			"fix", fmt.Sprintf("tidemark backfill --aggregate %s --from D --to D --reprocess completed", s.Aggregate))
	default:
		m.verifies.WithLabelValues(s.Aggregate, "ok").Inc()
		log.Info("scheduled verification found no drift", "partitions", compared, "pending", pending, "archived", archived)
	}
	m.drifted.WithLabelValues(s.Aggregate).Set(float64(drifted))
	m.verified.WithLabelValues(s.Aggregate).Set(float64(now().Unix()))
}

func (s *Schedule) refresh(ctx context.Context, log *slog.Logger, m *scheduleMetrics, now func() time.Time) {
	d, err := s.Definition(ctx, s.Aggregate)
	var rep *Report
	if err == nil {
		var r Range
		var found bool
		r, found, err = FullRange(ctx, s.Pool, d)
		if err == nil && !found {
			return
		}
		if err == nil {
			rep, err = Run(ctx, s.Pool, d, r, Options{Kind: "refresh", Reprocess: Completed, SkipArchived: true, Now: now, Logger: log})
		}
	}
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, ErrBusy):
		log.Info("scheduled full refresh put off: another backfill or refresh of the aggregate is running")
	case err != nil:
		m.refreshes.WithLabelValues(s.Aggregate, "error").Inc()
		if rep == nil {
			s.holdUntil["refresh"] = time.Now().Add(failedWait)
		}
		log.Error("scheduled full refresh failed; tried again later", "err", err, "refresh_every", s.RefreshEvery)
	case len(rep.Failed) > 0:
		m.refreshes.WithLabelValues(s.Aggregate, "failed").Inc()
		log.Error("scheduled full refresh: chunks failed", "run", rep.RunID, "failed", len(rep.Failed))
	default:
		m.refreshes.WithLabelValues(s.Aggregate, "ok").Inc()
		log.Info("scheduled full refresh done", "run", rep.RunID, "chunks", rep.Done, "rows", rep.Rows)
	}
}
