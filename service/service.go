// Package service assembles a running tidemark process from its
// configuration: migrations, the warehouse pool, the enabled components
// (the Kafka ingester and the reconciler) and the operator HTTP server with
// /metrics, /healthz, /readyz and /status. `tidemark run` and the demo both
// use it.
package service

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/raw"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/connerr"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/lateness"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/retention"
	"github.com/tidemark-dev/tidemark/status"
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
		kinds[ComponentIngest] = kinds[ComponentIngest] || cfg.Sources[name].Kafka != nil
		kinds[ComponentPoll] = kinds[ComponentPoll] || cfg.Sources[name].Poll != nil
		kinds[ComponentCDC] = kinds[ComponentCDC] || cfg.Sources[name].CDC != nil
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
// stopped. Migrations are applied first unless disabled.
func Run(ctx context.Context, cfg *config.Config, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	configured := Configured(cfg)
	running := opts.Only
	if len(running) == 0 {
		running = configured
	}
	for _, c := range running {
		if !slices.Contains(configured, c) {
			return fmt.Errorf("component %s has nothing to do: configure %s", c, map[string]string{
				ComponentIngest: "a source with a kafka block", ComponentPoll: "a source with a poll block", ComponentCDC: "a source with a cdc block",
				ComponentReconcile: "aggregates", ComponentPrune: "sources"}[c])
		}
	}
	if len(running) == 0 {
		return errors.New("nothing to run: configure Kafka, poll or CDC sources, or aggregates")
	}
	enabled := func(c string) bool { return slices.Contains(running, c) }

	pool, err := Pool(ctx, cfg, "tidemark")
	if err != nil {
		return err
	}
	defer pool.Close()

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

	var adm *kadm.Client
	if len(cfg.Kafka.Brokers) > 0 {
		kopts, err := kafka.ClientOptions(cfg.Kafka)
		if err != nil {
			return err
		}
		cl, err := kgo.NewClient(append(kopts, opts.KafkaOpts...)...)
		if err != nil {
			return fmt.Errorf("kafka admin client: %w", err)
		}
		defer cl.Close()
		adm = kadm.NewClient(cl)
	}

	h := &handler{log: log, cfg: cfg, pool: pool, adm: adm, now: now, reg: reg}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, len(cfg.Sources)+4) // every component can report once without blocking
	if cfg.HTTP.Enabled() {
		ln, err := net.Listen("tcp", cfg.HTTP.Listen)
		if err != nil {
			return fmt.Errorf("http.listen %s: %w", cfg.HTTP.Listen, err)
		}
		srv := &http.Server{Handler: h.mux(), ReadHeaderTimeout: 10 * time.Second}
		log.Info("http server listening", "addr", ln.Addr().String())
		if opts.Listening != nil {
			opts.Listening(ln.Addr().String())
		}
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("http server: %w", err)
			}
		}()
		// Runs after the components have stopped, so /metrics and /healthz
		// answer during the final flush.
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			<-served
		}()
	}
	// The HTTP server answers while the service waits for the warehouse:
	// /healthz succeeds and /readyz says what is missing.
	if err := prepareSchema(runCtx, cfg, pool, log); err != nil {
		if runCtx.Err() != nil {
			return nil
		}
		return err
	}
	h.schemaReady.Store(true)

	var wg sync.WaitGroup
	if enabled(ComponentIngest) {
		in, err := kafka.New(cfg, kafka.Options{Logger: log, Registerer: reg, Now: now, KafkaOpts: opts.KafkaOpts})
		if err != nil {
			return err
		}
		h.in.Store(in)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := in.Run(runCtx); err != nil {
				errs <- err
			}
			stop()
		}()
	}
	if enabled(ComponentPoll) {
		for _, name := range cfg.SourceNames() {
			if cfg.Sources[name].Poll == nil {
				continue
			}
			p, err := poll.New(cfg, name, pool, poll.Options{Logger: log, Registerer: reg, Now: now})
			if err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = p.Run(runCtx) // logs and retries its own failures
			}()
			if every := cfg.Sources[name].Mirror.KeyReconcileEvery.D(); every > 0 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					keyLoop(runCtx, p, cfg.Sources[name].Poll.DSN, pool, every, mirror.KeyOptions{Logger: log, Registerer: reg, Now: now,
						MaxDelete: cfg.Sources[name].Mirror.KeyReconcileMaxDelete})
				}()
			}
		}
	}
	if enabled(ComponentCDC) {
		for _, name := range cfg.SourceNames() {
			if cfg.Sources[name].CDC == nil {
				continue
			}
			rd, err := cdc.New(cfg, name, pool, cdc.Options{Logger: log, Registerer: reg, Now: now})
			if err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Connection failures are retried inside; a setup the
				// reader cannot use stops the service with its reason.
				if err := rd.Run(runCtx); err != nil {
					errs <- err
				}
			}()
		}
	}
	if enabled(ComponentReconcile) {
		r, err := reconcile.New(cfg, pool, reconcile.Options{Logger: log, Registerer: reg, Now: now})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(runCtx); err != nil {
				errs <- err
			}
		}()
		for _, name := range cfg.AggregateNames() {
			a := cfg.Aggregates[name]
			if a.VerifyEvery == 0 && a.RefreshEvery == 0 {
				continue
			}
			// A reconciler of its own prepares the definition: a
			// reconciler is not safe for concurrent use.
			own, err := reconcile.New(cfg, pool, reconcile.Options{Logger: log, Now: now})
			if err != nil {
				return err
			}
			s := &backfill.Schedule{Pool: pool, Aggregate: name, Definition: own.Definition, VerifyEvery: a.VerifyEvery.D(),
				RefreshEvery: a.RefreshEvery.D(), Now: now, Logger: log, Registerer: reg}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = s.Run(runCtx) // logs and counts its own failures
			}()
		}
	}
	if enabled(ComponentPrune) {
		p, err := retention.New(cfg, pool, retention.Options{Logger: log, Registerer: reg, Now: now})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = p.Loop(runCtx) // logs and retries its own failures
		}()
	}
	log.Info("tidemark running", "version", VersionString(), "components", running)
	var failed error
	select {
	case <-runCtx.Done():
	case failed = <-errs:
		log.Error("a component failed; stopping", "err", failed)
	}
	stop()
	h.stopping.Store(true)
	wg.Wait()
	if failed != nil {
		return failed
	}
	select {
	case err := <-errs:
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
// restarts neither skip nor repeat it. Failures are logged and retried
// after a minute. It never forces: a run refused by
// mirror.key_reconcile_max_delete is recorded like any other, so the next
// one comes an interval later and refuses again until an operator runs
// `tidemark keys --force` or the source has its rows back.
func keyLoop(ctx context.Context, p *poll.Poller, dsn string, pool *pgxpool.Pool, every time.Duration, opts mirror.KeyOptions) {
	log := opts.Logger.With("source", p.Name())
	var k *mirror.KeyReconciler
	for {
		wait := time.Minute
		var last *time.Time
		err := pool.QueryRow(ctx, lastKeyCheckSQL, p.Name()).Scan(&last)
		if err == nil {
			wait = 0
			if last != nil {
				wait = last.Add(every).Sub(opts.Now())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, 0)):
		}
		if err != nil {
			continue
		}
		if k == nil {
			// The poller's checks describe the source table and create
			// the mirror; the reconciler shares that description.
			if err := p.Prepare(ctx); err != nil {
				if ctx.Err() == nil {
					log.Warn("key reconciliation waits for the poll source", "err", err)
				}
				continue
			}
			if k, err = mirror.NewKeyReconciler(p.Mirror(), dsn, pool, opts); err != nil {
				log.Error("key reconciliation cannot run", "err", err)
				return
			}
		}
		if _, err := k.Run(ctx, false); err != nil && ctx.Err() == nil {
			// Run logged the error; try again in a minute, not at once.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Minute):
			}
		}
	}
}

// prepareSchema applies the migrations (warehouse.migrate: true) or checks
// that the schema is current (false), waiting while the warehouse cannot be
// reached rather than exiting, so that a service started before its
// database comes up by itself.
func prepareSchema(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, log *slog.Logger) error {
	delay := time.Second
	for {
		var err error
		if cfg.Warehouse.MigrateOnStart() {
			var res migrate.Result
			if res, err = migrate.Up(ctx, cfg.Warehouse.DSN, log); err == nil {
				log.Info("warehouse schema ready", "version", res.Current, "applied", len(res.Applied))
			}
		} else {
			// Migrations are left to the operator; refuse to run against a
			// schema this binary does not match.
			err = migrate.Check(ctx, pool)
		}
		var connErr *pgconn.ConnectError
		if err == nil || !errors.As(err, &connErr) || ctx.Err() != nil {
			return err
		}
		log.Warn("warehouse unreachable; waiting for it", "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

type handler struct {
	log         *slog.Logger
	cfg         *config.Config
	pool        *pgxpool.Pool
	in          atomic.Pointer[kafka.Ingester] // set once the schema is ready
	schemaReady atomic.Bool
	adm         *kadm.Client
	now         func() time.Time
	reg         *prometheus.Registry
	stopping    atomic.Bool
	lateness    latenessCache
}

func (h *handler) mux() *http.ServeMux {
	m := http.NewServeMux()
	// ContinueOnError: a collector that cannot reach the warehouse must
	// not hide every other series (write errors, lag) during an outage.
	m.Handle("GET /metrics", promhttp.HandlerFor(h.reg, promhttp.HandlerOpts{
		Registry: h.reg, ErrorHandling: promhttp.ContinueOnError, ErrorLog: promLogger{h.log}}))
	m.HandleFunc("GET /healthz", h.healthz)
	m.HandleFunc("GET /readyz", h.readyz)
	m.Handle("GET /status", h.private(http.HandlerFunc(h.status)))
	m.Handle("GET /{$}", h.private(http.HandlerFunc(h.page)))
	return m
}

// private requires http.token, when set, as a bearer token: the pages for
// people show table names, errors and positions that not everyone who can
// reach the port should read. Probes and /metrics stay open.
func (h *handler) private(next http.Handler) http.Handler {
	token := h.cfg.HTTP.Token
	if token == "" {
		return next
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tidemark"`)
			http.Error(w, "this page needs the bearer token of http.token\n", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearerToken returns the credentials of an Authorization header value of
// the Bearer scheme. The scheme is matched without regard to case and
// separated from the credentials by one or more spaces (RFC 9110, section
// 11: auth-scheme 1*SP token68); the server has already trimmed the
// value's surrounding white space.
func bearerToken(header string) (string, bool) {
	scheme, rest, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(rest, " "), true
}

// healthz is liveness: the process serves requests and is not stopping.
func (h *handler) healthz(w http.ResponseWriter, _ *http.Request) {
	if h.stopping.Load() {
		http.Error(w, "stopping\n", http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// readyz is readiness: the warehouse and the brokers answer, and the
// ingester's last write did not fail.
func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	checks := map[string]string{}
	ok := true
	check := func(name string, err error) {
		if err != nil {
			checks[name] = err.Error()
			ok = false
			return
		}
		checks[name] = "ok"
	}
	if err := h.pool.Ping(ctx); err != nil {
		check("warehouse", fmt.Errorf("warehouse.dsn: %w", connerr.Explain(err)))
	} else {
		check("warehouse", nil)
	}
	if !h.schemaReady.Load() {
		check("schema", errors.New("waiting for the warehouse schema"))
	}
	if in := h.in.Load(); in != nil {
		check("kafka", in.Ping(ctx))
		check("ingest_writes", in.LastError())
	}
	if h.stopping.Load() {
		check("process", errors.New("stopping"))
	}
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(checks)
}

func (h *handler) status(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	rep, err := status.Gather(ctx, h.pool, h.cfg, h.adm, h.now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = rep.WriteJSON(w)
}

// page serves the status page: the report as HTML, with the lateness
// charts, arrival curves and partition grid.
func (h *handler) page(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	now := h.now()
	rep, err := status.Gather(ctx, h.pool, h.cfg, h.adm, now)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	p := status.BuildPage(ctx, h.pool, h.cfg, rep, func(ctx context.Context, source string) (*lateness.Report, error) {
		return h.lateness.get(ctx, h.pool, h.cfg, source, now)
	})
	p.Slots = cdc.SlotReadings(h.reg)
	if n, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && n > 0 {
		p.Refresh = max(n, 5)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := p.WriteHTML(w); err != nil {
		h.log.Warn("status page", "err", err)
	}
}

// latenessCache keeps each source's lateness, or the error measuring it,
// for latenessTTL: measuring reads up to status.LatenessRows raw rows, too
// much for every reload of the page. Sources are measured independently,
// each by one request at a time; a request waits for another's
// measurement only as long as its context allows.
type latenessCache struct {
	mu      sync.Mutex
	entries map[string]*latenessEntry
}

type latenessEntry struct {
	busy  chan struct{} // holds one token while the source is measured
	at    time.Time     // real time of the measurement
	until time.Time     // its service-clock end
	rep   *lateness.Report
	err   error
}

// latenessTTL is how long the page reuses a measurement.
const latenessTTL = time.Minute

func (c *latenessCache) get(ctx context.Context, q lateness.Querier, cfg *config.Config, source string, now time.Time) (*lateness.Report, error) {
	c.mu.Lock()
	if c.entries == nil {
		c.entries = map[string]*latenessEntry{}
	}
	e := c.entries[source]
	if e == nil {
		e = &latenessEntry{busy: make(chan struct{}, 1)}
		c.entries[source] = e
	}
	c.mu.Unlock()
	select {
	case e.busy <- struct{}{}:
		defer func() { <-e.busy }()
	case <-ctx.Done():
		return nil, fmt.Errorf("lateness of %s: %w", source, ctx.Err())
	}
	since, until := status.LatenessRange(cfg, source, now)
	if !e.at.IsZero() && time.Since(e.at) < latenessTTL && until.Sub(e.until).Abs() < latenessTTL {
		return e.rep, e.err
	}
	e.rep, e.err = lateness.Measure(ctx, q, cfg, source, lateness.Options{Since: since, Until: until, MaxRows: status.LatenessRows})
	e.at, e.until = time.Now(), until
	return e.rep, e.err
}

// promLogger sends the metrics handler's errors to the service log.
type promLogger struct{ log *slog.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn("metrics: " + fmt.Sprint(v...)) }
