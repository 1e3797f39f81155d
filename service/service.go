// Package service assembles a running tidemark process from its
// configuration: the warehouse pool, the operator HTTP server (the status
// page /, /metrics, /healthz, /readyz and /status), the migrations, and
// the components the configuration gives work to: the Kafka ingester,
// pollers and their key reconciliation, CDC readers, the reconciler with
// the verification and refresh schedules, and retention. Each component
// declares whether its failure stops the service; a supervisor runs them
// and stops them together. `tidemark run` and the demo both use it.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/pause"
	"github.com/tidemark-dev/tidemark/raw"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/retention"
)

// Components that `tidemark run --only` can select.
const (
	ComponentIngest    = "ingest"    // the Kafka ingester; needs Kafka sources
	ComponentPoll      = "poll"      // timestamp-watermark loads; needs poll sources
	ComponentCDC       = "cdc"       // logical replication readers; needs CDC sources
	ComponentReconcile = "reconcile" // the reconciler; needs aggregates
	ComponentPrune     = "prune"     // retention; runs wherever another component does
)

// Components lists what this version can run.
var Components = []string{ComponentIngest, ComponentPoll, ComponentCDC, ComponentReconcile, ComponentPrune}

// Configured returns the components the configuration gives work to.
func Configured(cfg *config.Config) []string {
	var out []string
	kinds := map[string]bool{}
	for _, name := range cfg.SourceNames() {
		kinds[ComponentIngest] = kinds[ComponentIngest] || cfg.Sources[name].Kind().Kafka()
		kinds[ComponentPoll] = kinds[ComponentPoll] || cfg.Sources[name].Kind() == config.KindPoll
		kinds[ComponentCDC] = kinds[ComponentCDC] || cfg.Sources[name].Kind() == config.KindCDC
	}
	for _, c := range []string{ComponentIngest, ComponentPoll, ComponentCDC} {
		if kinds[c] {
			out = append(out, c)
		}
	}
	if len(cfg.Aggregates) > 0 {
		out = append(out, ComponentReconcile)
	}
	if len(out) > 0 {
		out = append(out, ComponentPrune)
	}
	return out
}

// Options customise a service beyond its configuration.
type Options struct {
	Logger *slog.Logger
	// Now is the service clock; default time.Now.
	Now func() time.Time
	// Only limits the components run; empty means all configured.
	Only []string
	// Registry receives the metrics; a fresh one when nil.
	Registry *prometheus.Registry
	// Listening, when set, is called with the HTTP server's address once
	// it accepts connections.
	Listening func(addr string)
	// KafkaOpts are extra Kafka client options (tests).
	KafkaOpts []kgo.Opt
}

// Version is the build's version, set by the linker or read from the
// module build info.
var Version = ""

// VersionString describes this binary.
func VersionString() string {
	v := Version
	if v == "" {
		v = "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			v = bi.Main.Version
		}
	}
	return v
}

// Pool opens the warehouse pool with tidemark's session settings.
func Pool(ctx context.Context, cfg *config.Config, app string) (*pgxpool.Pool, error) {
	return pgconnect.Pool(ctx, cfg.Warehouse.Settings(), app)
}

// Run runs the service until ctx is cancelled and every component has
// stopped, or until a component whose failure stops the service fails.
// The HTTP server answers from the start, while the service waits for the
// warehouse, and until every component has stopped; migrations are
// applied first unless disabled.
func Run(ctx context.Context, cfg *config.Config, opts Options) error {
	opts = opts.withDefaults()
	running, err := selected(cfg, opts.Only)
	if err != nil {
		return err
	}
	pool, err := Pool(ctx, cfg, "tidemark")
	if err != nil {
		return err
	}
	defer pool.Close()
	registerCollectors(opts.Registry, cfg, pool, opts.Now)
	h := &handler{log: opts.Logger, cfg: cfg, pool: pool, now: opts.Now, reg: opts.Registry}
	if len(cfg.Kafka.Brokers) > 0 {
		cl, err := adminClient(cfg, opts.KafkaOpts)
		if err != nil {
			return err
		}
		defer cl.Close()
		h.adm = kadm.NewClient(cl)
	}
	sup := newSupervisor(ctx, opts.Logger)
	defer sup.stop()
	if cfg.HTTP.Enabled() {
		shutdown, err := serveHTTP(cfg, h, opts.Listening, sup)
		if err != nil {
			return err
		}
		// Runs after the components have stopped, so that /metrics and
		// /healthz answer during the final flush.
		defer shutdown()
	}
	if err := prepareSchema(sup.ctx, cfg, pool, opts.Logger); err != nil {
		if sup.ctx.Err() != nil {
			return nil
		}
		return err
	}
	h.schemaReady.Store(true)
	// The pauses are read before any component starts, so that a paused
	// source is not read even briefly.
	pauses := pause.NewWatch(pool, cfg.SourceNames(), pause.WatchOptions{Logger: opts.Logger, Registerer: opts.Registry})
	if err := loadPauses(sup.ctx, pauses, opts.Logger); err != nil {
		return nil // the service stops while it waits
	}
	h.pauses.Store(pauses)
	comps, err := components(cfg, pool, opts, running, h, pauses)
	if err != nil {
		return err
	}
	for _, c := range comps {
		sup.start(c)
	}
	opts.Logger.Info("tidemark running", "version", VersionString(), "components", running)
	return sup.wait(func() { h.stopping.Store(true) })
}

// loadPauses reads the paused sources, trying again while the warehouse
// cannot answer, until ctx ends (it returns ctx's error then).
func loadPauses(ctx context.Context, w *pause.Watch, log *slog.Logger) error {
	retry := backoff.Backoff{First: time.Second, Max: 30 * time.Second}
	for {
		err := w.Load(ctx)
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		wait := retry.Next()
		log.Warn("reading the paused sources failed; trying again", "err", err, "retry_in", wait)
		if err := backoff.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// withDefaults fills the options left empty.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	return o
}

// selected checks the components asked for against those cfg gives work
// to, and returns those to run: all configured ones when only is empty.
func selected(cfg *config.Config, only []string) ([]string, error) {
	configured := Configured(cfg)
	running := only
	if len(running) == 0 {
		running = configured
	}
	for _, c := range running {
		if !slices.Contains(configured, c) {
			return nil, fmt.Errorf("component %s has nothing to do: configure %s", c, map[string]string{
				ComponentIngest: "a source with a kafka block", ComponentPoll: "a source with a poll block", ComponentCDC: "a source with a cdc block",
				ComponentReconcile: "aggregates", ComponentPrune: "sources"}[c])
		}
	}
	if len(running) == 0 {
		return nil, errors.New("nothing to run: configure Kafka, poll or CDC sources, or aggregates")
	}
	return running, nil
}

// registerCollectors registers the metrics computed at scrape time.
func registerCollectors(reg *prometheus.Registry, cfg *config.Config, pool *pgxpool.Pool, now func() time.Time) {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tidemark_build_info", Help: "Always 1; labels describe the running binary.",
	}, []string{"version"})
	buildInfo.WithLabelValues(VersionString()).Set(1)
	reg.MustRegister(buildInfo)
	reg.MustRegister(raw.NewWatermarkCollector(cfg, pool, now))
	reg.MustRegister(retention.NewCollector(pool))
	if len(cfg.Aggregates) > 0 {
		reg.MustRegister(reconcile.NewCollector(pool, now, cfg.AggregateNames()))
	}
}

// adminClient is the Kafka client that status and readiness use.
func adminClient(cfg *config.Config, extra []kgo.Opt) (*kgo.Client, error) {
	kopts, err := kafka.ClientOptions(cfg.Kafka)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(kopts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka admin client: %w", err)
	}
	return cl, nil
}
