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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/connerr"
	"github.com/tidemark-dev/tidemark/lateness"
	"github.com/tidemark-dev/tidemark/pause"
	"github.com/tidemark-dev/tidemark/status"
)

// serveHTTP starts the operator HTTP server on http.listen, reporting a
// failure to serve to sup, and returns the function that shuts it down.
func serveHTTP(cfg *config.Config, h *handler, listening func(string), sup *supervisor) (func(), error) {
	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return nil, fmt.Errorf("http.listen %s: %w", cfg.HTTP.Listen, err)
	}
	srv := &http.Server{Handler: h.mux(), ReadHeaderTimeout: 10 * time.Second}
	h.log.Info("http server listening", "addr", ln.Addr().String())
	if listening != nil {
		listening(ln.Addr().String())
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			sup.fail(fmt.Errorf("http server: %w", err))
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
	}, nil
}

// handler serves the operator endpoints.
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
	pauses      atomic.Pointer[pause.Watch] // set once the schema is ready
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
		for _, st := range in.Stalls() {
			check("source "+st.Source, st)
		}
		if in.UsesRegistry() {
			check("schema_registry", in.RegistryError())
		}
	}
	if pauses := h.pauses.Load(); pauses != nil {
		// A paused source is named, but it does not make the instance
		// unready: it stands still on purpose.
		for _, name := range h.cfg.SourceNames() {
			if p, paused := pauses.Paused(name); paused && checks["source "+name] == "" {
				checks["source "+name] = "paused " + p.String()
			}
		}
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
	if in := h.in.Load(); in != nil {
		if err := in.RegistryError(); err != nil {
			p.SchemaRegistry = err.Error()
		}
		for _, st := range in.Stalls() {
			p.Stalled = append(p.Stalled, status.StalledSource{Name: st.Source, Since: st.Since, Cause: st.Err.Error(), Fix: st.Fix})
		}
		for _, r := range in.Resets() {
			p.Resets = append(p.Resets, status.OffsetReset{At: r.At, What: r.String()})
		}
	}
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
