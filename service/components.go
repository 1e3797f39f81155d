package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/pause"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/retention"
)

// component is one part of a running service, run until the service
// stops.
type component struct {
	name string
	// stops says that the component returning, with an error or without,
	// stops the service, with its error: the ingester, a CDC reader (a
	// setup it cannot use), the reconciler (a configuration the
	// warehouse refuses), the HTTP server. The others handle their own
	// failures, retrying them, and return only when the service stops.
	stops bool
	run   func(ctx context.Context) error
}

// components builds the components of running that cfg gives work to.
func components(cfg *config.Config, pool *pgxpool.Pool, opts Options, running []string, h *handler, pauses *pause.Watch) ([]component, error) {
	out := []component{{name: "paused sources", run: pauses.Run}}
	add := func(c ...component) { out = append(out, c...) }
	log, reg, now, paused := opts.Logger, opts.Registry, opts.Now, pauses.IsPaused
	if slices.Contains(running, ComponentIngest) {
		in, err := kafka.New(kafka.ConfigFrom(cfg), kafka.Options{Logger: log, Registerer: reg, Now: now, KafkaOpts: opts.KafkaOpts, Paused: paused})
		if err != nil {
			return nil, err
		}
		h.in.Store(in)
		add(component{name: "ingest", stops: true, run: in.Run})
	}
	for _, name := range cfg.SourceNames() {
		src := cfg.Sources[name]
		switch {
		case src.Kind() == config.KindPoll && slices.Contains(running, ComponentPoll):
			pc, err := poll.ConfigFrom(cfg, name)
			if err != nil {
				return nil, err
			}
			p, err := poll.New(pc, pool, poll.Options{Logger: log, Registerer: reg, Now: now, Paused: paused})
			if err != nil {
				return nil, err
			}
			add(component{name: "poll " + name, run: p.Run})
			if every := src.Mirror.KeyReconcileEvery.Duration(); every > 0 {
				keys := mirror.KeyOptions{Logger: log, Registerer: reg, Now: now, MaxDelete: src.Mirror.KeyReconcileMaxDelete}
				add(component{name: "keys " + name, run: func(ctx context.Context) error {
					keyLoop(ctx, p, src.Poll.DSN, pool, every, keys, paused)
					return nil
				}})
			}
		case src.Kind() == config.KindCDC && slices.Contains(running, ComponentCDC):
			cc, err := cdc.ConfigFrom(cfg, name)
			if err != nil {
				return nil, err
			}
			rd, err := cdc.New(cc, pool, cdc.Options{Logger: log, Registerer: reg, Now: now, Paused: paused})
			if err != nil {
				return nil, err
			}
			add(component{name: "cdc " + name, stops: true, run: rd.Run})
		}
	}
	if slices.Contains(running, ComponentReconcile) {
		c, err := reconcileComponents(cfg, pool, opts)
		if err != nil {
			return nil, err
		}
		add(c...)
	}
	if slices.Contains(running, ComponentPrune) {
		p, err := retention.New(cfg, pool, retention.Options{Logger: log, Registerer: reg, Now: now})
		if err != nil {
			return nil, err
		}
		add(component{name: "prune", run: p.Loop})
	}
	return out, nil
}

// reconcileComponents are the reconciler and the verification and
// refresh schedules of the aggregates that have them.
func reconcileComponents(cfg *config.Config, pool *pgxpool.Pool, opts Options) ([]component, error) {
	r, err := reconcile.New(cfg, pool, reconcile.Options{Logger: opts.Logger, Registerer: opts.Registry, Now: opts.Now})
	if err != nil {
		return nil, err
	}
	out := []component{{name: "reconcile", stops: true, run: r.Run}}
	for _, name := range cfg.AggregateNames() {
		a := cfg.Aggregates[name]
		if a.VerifyEvery == 0 && a.RefreshEvery == 0 {
			continue
		}
		// A reconciler of its own prepares the definition: a reconciler
		// is not safe for concurrent use.
		own, err := reconcile.New(cfg, pool, reconcile.Options{Logger: opts.Logger, Now: opts.Now})
		if err != nil {
			return nil, err
		}
		s := &backfill.Schedule{Pool: pool, Aggregate: name, Definition: own.Definition, VerifyEvery: a.VerifyEvery.Duration(),
			RefreshEvery: a.RefreshEvery.Duration(), Now: opts.Now, Logger: opts.Logger, Registerer: opts.Registry}
		out = append(out, component{name: "schedule " + name, run: s.Run})
	}
	return out, nil
}

// supervisor runs components until its context ends or one that stops
// the service returns.
type supervisor struct {
	ctx    context.Context
	cancel context.CancelFunc
	log    *slog.Logger
	wg     sync.WaitGroup
	errs   chan error
}

func newSupervisor(ctx context.Context, log *slog.Logger) *supervisor {
	ctx, cancel := context.WithCancel(ctx)
	return &supervisor{ctx: ctx, cancel: cancel, log: log, errs: make(chan error, 1)}
}

// start runs c in a goroutine of its own.
func (s *supervisor) start(c component) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := c.run(s.ctx)
		switch {
		case c.stops && err != nil:
			s.fail(err)
		case c.stops:
			s.cancel()
		case err != nil && s.ctx.Err() == nil:
			s.log.Error("component stopped; the others go on", "component", c.name, "err", err)
		}
	}()
}

// fail stops the service with err, as a component that stops it does;
// never blocking: the first failure is the service's, later ones are
// logged.
func (s *supervisor) fail(err error) {
	select {
	case s.errs <- err:
	default:
		s.log.Error("a component failed while the service stops", "err", err)
	}
}

// stop ends the components' context.
func (s *supervisor) stop() { s.cancel() }

// wait blocks until the context ends or a component stops the service,
// calls stopping, stops every component and waits for them, and returns
// the error that stopped the service, if any.
func (s *supervisor) wait(stopping func()) error {
	var failed error
	select {
	case <-s.ctx.Done():
	case failed = <-s.errs:
		s.log.Error("a component failed; stopping", "err", failed)
	}
	s.cancel()
	stopping()
	s.wg.Wait()
	if failed != nil {
		return failed
	}
	select {
	case err := <-s.errs:
		return err
	default:
	}
	return nil
}

// lastKeyCheckSQL is when the source's mirror was last reconciled (not
// counting dry runs), by any instance.
const lastKeyCheckSQL = `SELECT max(finished_at) FROM tidemark.key_reconciliations WHERE source = $1 AND NOT dry_run`

// keyLoop runs key reconciliation of a poll source's mirror every
// interval, counted from the last one recorded in the warehouse, so that
// restarts neither skip nor repeat it. A failure (reading the schedule,
// waiting for the poll source, the run) is retried after a minute; the
// reconciler logs its own. It never forces: a run refused by
// mirror.key_reconcile_max_delete is recorded like any other, so the next
// one comes an interval later and refuses again until an operator runs
// `tidemark keys --force` or the source has its rows back.
func keyLoop(ctx context.Context, p *poll.Poller, dsn string, pool *pgxpool.Pool, every time.Duration, opts mirror.KeyOptions, paused func(string) bool) {
	kl := &keyLoopState{p: p, dsn: dsn, pool: pool, every: every, opts: opts, log: opts.Logger.With("source", p.Name()), paused: paused}
	job := periodic.Job{
		Name: "key reconciliation",
		Run:  kl.turn,
		Next: func(err error, _ time.Duration) time.Duration {
			if err != nil {
				return keyRetry
			}
			return kl.wait
		},
		Final: func(err error) bool { return errors.Is(err, errKeysCannotRun) },
		// No Log: the failures are logged where they happen.
	}
	_ = job.Loop(ctx) // ends with ctx, or with errKeysCannotRun, logged
}

// keyRetry is the wait of keyLoop after a failed turn.
const keyRetry = time.Minute

// errKeysCannotRun ends keyLoop: no key reconciler can be made for the
// poll source's mirror.
var errKeysCannotRun = errors.New("key reconciliation cannot run")

// keyLoopState is what keyLoop keeps between its turns.
type keyLoopState struct {
	p     *poll.Poller
	dsn   string
	pool  *pgxpool.Pool
	every time.Duration
	opts  mirror.KeyOptions
	log   *slog.Logger
	// paused reports whether an operator paused the source: a run due
	// then waits, checking again every keyRetry.
	paused func(source string) bool
	k      *mirror.KeyReconciler // made at the first run
	// wait is how long until the next run is due, as the warehouse
	// recorded the last; once waited, the next turn runs.
	wait time.Duration
}

// turn is one turn of keyLoop: it reads when the next run is due and
// sets kl.wait to the time left, or, when the run is due (or kl.wait was
// just waited), runs it and has the next turn read the schedule again.
func (kl *keyLoopState) turn(ctx context.Context) error {
	if kl.wait <= 0 {
		var last *time.Time
		if err := kl.pool.QueryRow(ctx, lastKeyCheckSQL, kl.p.Name()).Scan(&last); err != nil {
			return fmt.Errorf("read the last key reconciliation: %w", err)
		}
		if last != nil {
			if kl.wait = last.Add(kl.every).Sub(kl.opts.Now()); kl.wait > 0 {
				return nil
			}
		}
	}
	kl.wait = 0
	if kl.paused != nil && kl.paused(kl.p.Name()) {
		kl.wait = keyRetry // the source is paused: its runs wait too
		return nil
	}
	if kl.k == nil {
		// The poller's checks describe the source table and create
		// the mirror; the reconciler shares that description.
		if err := kl.p.Prepare(ctx); err != nil {
			if ctx.Err() == nil {
				kl.log.Warn("key reconciliation waits for the poll source", "err", err, "retry_in", keyRetry)
			}
			return err
		}
		k, err := mirror.NewKeyReconciler(kl.p.Mirror(), kl.dsn, kl.pool, kl.opts)
		if err != nil {
			kl.log.Error("key reconciliation cannot run", "err", err)
			return errKeysCannotRun
		}
		kl.k = k
	}
	_, err := kl.k.Run(ctx, false) // logs its failures
	return err
}
