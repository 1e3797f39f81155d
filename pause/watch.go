package pause

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/internal/periodic"
	"github.com/tidemark-dev/tidemark/internal/promreg"
)

// DefaultEvery is how often a Watch reads the paused sources: every
// instance obeys a pause or a resume within about this long.
const DefaultEvery = 2 * time.Second

// WatchOptions are a Watch's options.
type WatchOptions struct {
	// Every is how often the table is read; default DefaultEvery.
	Every      time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Watch is what one instance knows of the paused sources. Load reads the
// table once, Run every Every; Paused answers from memory, so components
// may ask it as often as they like. While the warehouse cannot be read,
// the Watch keeps what it last read.
type Watch struct {
	db      Lister
	sources []string
	opts    WatchOptions

	mu sync.Mutex
	by map[string]Pause

	paused *prometheus.GaugeVec
	since  *prometheus.GaugeVec
}

// NewWatch returns a Watch of the pauses of sources, the configured
// sources, read through db. Its gauges have a series for each of them.
func NewWatch(db Lister, sources []string, opts WatchOptions) *Watch {
	if opts.Every <= 0 {
		opts.Every = DefaultEvery
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Watch{db: db, sources: sources, opts: opts, by: map[string]Pause{},
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_source_paused",
			Help: "1 while the source is paused (tidemark pause) as this instance last read it, 0 otherwise.",
		}, []string{"source"}),
		since: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tidemark_source_paused_since_timestamp_seconds",
			Help: "When the paused source was paused, in Unix seconds; no series while it is not paused.",
		}, []string{"source"}),
	}
	if opts.Registerer != nil {
		w.paused = promreg.Shared(opts.Registerer, w.paused)
		w.since = promreg.Shared(opts.Registerer, w.since)
	}
	for _, s := range sources {
		w.paused.WithLabelValues(s).Set(0)
	}
	return w
}

// Load reads the paused sources once.
func (w *Watch) Load(ctx context.Context) error {
	list, err := List(ctx, w.db)
	if err != nil {
		return err
	}
	by := make(map[string]Pause, len(list))
	for _, p := range list {
		by[p.Source] = p
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if maps.EqualFunc(by, w.by, func(a, b Pause) bool { return a.Since.Equal(b.Since) && a.By == b.By && a.Reason == b.Reason }) {
		return nil
	}
	for s, p := range by {
		if _, ok := w.by[s]; !ok {
			w.opts.Logger.Info("source paused: it stands still until tidemark resume", "source", s, "since", p.Since, "by", p.By, "reason", p.Reason)
		}
		w.paused.WithLabelValues(s).Set(1)
		w.since.WithLabelValues(s).Set(float64(p.Since.UnixNano()) / 1e9)
	}
	for s := range w.by {
		if _, ok := by[s]; !ok {
			w.opts.Logger.Info("source resumed", "source", s)
			w.paused.WithLabelValues(s).Set(0)
			w.since.DeleteLabelValues(s)
		}
	}
	w.by = by
	return nil
}

// Run reads the paused sources every Every until ctx ends; a failed read
// is logged and tried again after a backoff, and the last read stands.
func (w *Watch) Run(ctx context.Context) error {
	job := periodic.Job{Name: "paused sources", Every: w.opts.Every, FromStart: true, Timeout: 10 * w.opts.Every,
		Backoff: backoff.Backoff{First: w.opts.Every, Max: 30 * time.Second}, Log: w.opts.Logger, Run: w.Load}
	return job.Loop(ctx)
}

// Paused reports whether source is paused, and its pause.
func (w *Watch) Paused(source string) (Pause, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.by[source]
	return p, ok
}

// IsPaused reports whether source is paused: the form the components'
// options take.
func (w *Watch) IsPaused(source string) bool {
	_, ok := w.Paused(source)
	return ok
}
