package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// progressEvery is how often the long commands (backfill, refresh, poll,
// keys) log a progress line when their standard error is not a terminal.
// Tests shorten it.
var progressEvery = progress.DefaultEvery

// rebuildFlags are the flags backfill and refresh share.
type rebuildFlags struct {
	name        *string
	chunk       *string
	concurrency *int
	dryRun      *bool
}

func addRebuildFlags(fs *flag.FlagSet) rebuildFlags {
	return rebuildFlags{
		name:        fs.String("aggregate", "", "the aggregate to rebuild"),
		chunk:       fs.String("chunk", "1d", "span of one chunk, the unit that is planned, retried and recorded (e.g. 1d, 7d, 6h)"),
		concurrency: fs.Int("concurrency", 1, "chunks rebuilt at once"),
		dryRun:      fs.Bool("dry-run", false, "print the plan and change nothing"),
	}
}

// load reads the configuration at path and checks the shared flags
// against it; it prints what is wrong.
func (f rebuildFlags) load(app, path string, stderr io.Writer) (*config.Config, time.Duration, bool) {
	cfg, ok := load(path, stderr)
	if !ok {
		return nil, 0, false
	}
	span, ok := f.check(app, cfg, stderr)
	return cfg, span, ok
}

// check validates the shared flags; it prints what is wrong.
func (f rebuildFlags) check(app string, cfg *config.Config, stderr io.Writer) (time.Duration, bool) {
	if *f.name == "" {
		fmt.Fprintf(stderr, "%s: --aggregate is required%s\n", app, configured("aggregates", cfg.AggregateNames()))
		return 0, false
	}
	if cfg.Aggregates[*f.name] == nil {
		fmt.Fprintf(stderr, "%s: --aggregate: no aggregate named %q%s\n", app, *f.name, configured("aggregates", cfg.AggregateNames()))
		return 0, false
	}
	span, err := config.ParseDuration(*f.chunk)
	if err != nil || span <= 0 {
		fmt.Fprintf(stderr, "%s: --chunk: %q is not a positive duration (e.g. 1d, 7d, 6h)\n", app, *f.chunk)
		return 0, false
	}
	if *f.concurrency < 1 || *f.concurrency > int(cfg.Warehouse.MaxConns)-1 {
		fmt.Fprintf(stderr, "%s: --concurrency: must be between 1 and warehouse.max_conns - 1 (%d), got %d\n",
			app, cfg.Warehouse.MaxConns-1, *f.concurrency)
		return 0, false
	}
	return span, true
}

// parseDays reads --from and --to: dates, the first not after the last.
func parseDays(from, to string) (backfill.Range, error) {
	var r backfill.Range
	for _, d := range []struct {
		flag, text string
		into       *time.Time
	}{{"--from", from, &r.From}, {"--to", to, &r.To}} {
		t, err := time.Parse("2006-01-02", d.text)
		if err != nil {
			return r, fmt.Errorf("%s: %q is not a date (YYYY-MM-DD)", d.flag, d.text)
		}
		*d.into = t
	}
	if r.To.Before(r.From) {
		return r, fmt.Errorf("--to %s is before --from %s", to, from)
	}
	return r, nil
}

func cmdBackfill(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark backfill"
	fs, path := flags("backfill", stderr)
	f := addRebuildFlags(fs)
	from := fs.String("from", "", "first day to rebuild (YYYY-MM-DD, in the aggregate's time zone)")
	to := fs.String("to", "", "last day to rebuild, included")
	reprocess := fs.String("reprocess", "missing", "which chunks to rebuild: missing (never built), failed (also those whose last backfill did not finish), completed (all)")
	shadow := fs.Bool("shadow", false, "build every partition of the range into the aggregate's shadow table and compare it with the published one; publishes nothing")
	publish := fs.Bool("publish", false, "publish what the latest --shadow run built of each partition of the range (exactly what it compared) instead of rebuilding it")
	force := fs.Bool("force", false, "also rebuild archived partitions, whose raw rows retention dropped, from what is left (their published rows are replaced)")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, span, ok := f.load(app, *path, stderr)
	if !ok {
		return exitUsage
	}
	rp, err := backfill.ParseReprocess(*reprocess)
	if err != nil {
		fmt.Fprintf(stderr, "%s: --reprocess: %v\n", app, err)
		return exitUsage
	}
	r, err := parseDays(*from, *to)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", app, err)
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	if *shadow && *publish {
		fmt.Fprintf(stderr, "%s: --shadow builds and compares, --publish publishes what it built: give one of them\n", app)
		return exitUsage
	}
	opts := backfill.Options{Kind: "backfill", Chunk: span, Concurrency: *f.concurrency, Reprocess: rp, Shadow: *shadow, Force: *force,
		Publish: *publish, ShadowMaxAge: cfg.Retention.Ledger.Duration()}
	switch {
	case *shadow:
		opts.Kind, opts.Reprocess = "shadow", backfill.Completed
	case *publish:
		opts.Kind, opts.Reprocess = "publish", backfill.Completed
	}
	return rebuild(ctx, cfg, pool, app, *f.name, r, opts, *f.dryRun, stdout, stderr)
}

func cmdRefresh(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark refresh"
	fs, path := flags("refresh", stderr)
	f := addRebuildFlags(fs)
	full := fs.Bool("full", false, "rebuild every partition the raw table holds events for (required)")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if !*full {
		fmt.Fprintf(stderr, "%s: --full is required; to rebuild a range, use `tidemark backfill --reprocess completed`\n", app)
		return exitUsage
	}
	cfg, span, ok := f.load(app, *path, stderr)
	if !ok {
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	d, err := aggregate.FromConfig(cfg, *f.name)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", app, err)
		return exitUsage
	}
	r, found, err := backfill.FullRange(ctx, pool, d)
	if err != nil {
		return failed(stderr, app, err)
	}
	if !found {
		fmt.Fprintf(stdout, "%s: %s holds no events; nothing to refresh\n", *f.name, d.Raw.Sanitize())
		return exitOK
	}
	opts := backfill.Options{Kind: "refresh", Chunk: span, Concurrency: *f.concurrency, Reprocess: backfill.Completed, SkipArchived: true}
	return rebuild(ctx, cfg, pool, app, *f.name, r, opts, *f.dryRun, stdout, stderr)
}

// rebuild plans (and unless dryRun, runs) a backfill or refresh and
// prints what it did.
func rebuild(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, app, name string, r backfill.Range, opts backfill.Options,
	dryRun bool, stdout, stderr io.Writer) int {
	span, rp, kind := opts.Chunk, opts.Reprocess, opts.Kind
	header := func(plan []backfill.Chunk, d *aggregate.Definition) {
		runs := 0
		for _, c := range plan {
			if c.Run {
				runs++
			}
		}
		fmt.Fprintf(stdout, "%s: %s %s .. %s (%s), chunks of %s: %d chunks, %d to rebuild (--reprocess %s)\n",
			name, kind, r.From.Format("2006-01-02"), r.To.Format("2006-01-02"), d.Calendar.Loc, config.Duration(span), len(plan), runs, rp)
	}
	if dryRun {
		// A dry run only reads: the aggregate is not prepared, which
		// could create its table.
		d, err := aggregate.FromConfig(cfg, name)
		if err != nil {
			return failed(stderr, app, err)
		}
		var plan []backfill.Chunk
		if opts.Publish {
			plan, err = backfill.PlanPublish(ctx, pool, d, r, span, serviceClock(), opts.ShadowMaxAge)
		} else {
			plan, err = backfill.Plan(ctx, pool, d, r, span, rp)
		}
		if err != nil {
			return failed(stderr, app, err)
		}
		header(plan, d)
		for _, c := range plan {
			action := "skip"
			if c.Run {
				action = "run "
			}
			fmt.Fprintf(stdout, "  %s  %-26s %s\n", action, c.Label(), c.Reason)
		}
		return exitOK
	}
	// A bar on a terminal, plain lines elsewhere; the log goes through
	// the display so that its lines do not overwrite the bar.
	disp := progress.Command(stderr, progressEvery)
	log := logger(cfg, disp.Writer())
	rec, err := reconcile.New(cfg, pool, reconcile.Options{Logger: log, Now: serviceClock})
	if err != nil {
		return failed(stderr, app, err)
	}
	d, err := rec.Definition(ctx, name)
	if err != nil {
		return failed(stderr, app, err)
	}
	opts.Now, opts.Logger, opts.Progress = serviceClock, log, disp
	rep, err := backfill.Run(ctx, pool, d, r, opts)
	if rep != nil {
		header(rep.Chunks, d)
		verb := "rebuilt"
		switch {
		case opts.Shadow:
			verb = "built into " + d.ShadowName().Sanitize()
		case opts.Publish:
			verb = "published from " + d.ShadowName().Sanitize()
		}
		fmt.Fprintf(stdout, "run %d: %d chunks %s (%d rows), %d failed, %d skipped\n", rep.RunID, rep.Done, verb, rep.Rows, len(rep.Failed), rep.Skipped)
		for _, f := range rep.Failed {
			fmt.Fprintf(stdout, "  failed %s: %v\n", f.Chunk.Label(), f.Err)
		}
		if opts.Shadow {
			printShadow(stdout, rep.Shadow, name, r)
		}
	}
	switch {
	case err != nil:
		return failed(stderr, app, err)
	case len(rep.Failed) > 0:
		fmt.Fprintf(stderr, "%s: %d chunks failed; %s\n", app, len(rep.Failed), retryHint(rep.Failed, opts))
		return exitFailure
	}
	return exitOK
}

// retryHint says what runs the failed chunks again: the same command with
// --reprocess failed, but for a publish whose shadow builds cannot be
// published, a new shadow run first.
func retryHint(failures []backfill.Failure, opts backfill.Options) string {
	if !opts.Publish {
		return "once the cause is fixed, run again with --reprocess failed"
	}
	for _, f := range failures {
		if errors.Is(f.Err, backfill.ErrNoShadow) || errors.Is(f.Err, backfill.ErrShadowChanged) {
			return "build them again with --shadow over their days, compare, then --publish"
		}
	}
	return "once the cause is fixed, run the same --publish again: it publishes only what it has not"
}

// printShadow lists the partitions whose shadow differs from what is
// published, with both sides' row counts and numeric totals.
func printShadow(w io.Writer, checks []backfill.Check, name string, r backfill.Range) {
	differ := 0
	for _, c := range checks {
		if !c.Differs() {
			continue
		}
		differ++
		var totals []string
		for _, t := range c.Totals {
			if t.Published != t.Fresh {
				totals = append(totals, fmt.Sprintf("%s %s -> %s", t.Column, t.Published, t.Fresh))
			}
		}
		fmt.Fprintf(w, "  %-26s rows %d -> %d (%d only published, %d only in the shadow)", c.Partition.Label(), c.Published, c.Fresh, c.Extra, c.Missing)
		if len(totals) > 0 {
			fmt.Fprintf(w, "; %s", strings.Join(totals, ", "))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d of %d partitions differ from what is published", differ, len(checks))
	archived := 0
	for _, c := range checks {
		if c.Archived {
			archived++
		}
	}
	if differ > 0 {
		force := ""
		if archived > 0 {
			force = " --force"
		}
		fmt.Fprintf(w, "; to publish what was compared: tidemark backfill --aggregate %s --from %s --to %s --publish%s",
			name, r.From.Format("2006-01-02"), r.To.Format("2006-01-02"), force)
	}
	fmt.Fprintln(w)
	if archived > 0 {
		fmt.Fprintf(w, "%d archived partitions were built from the raw rows retention left; publishing them (--force) replaces their published rows with that\n", archived)
	}
}

func cmdVerify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark verify"
	fs, path := flags("verify", stderr)
	name := fs.String("aggregate", "", "the aggregate to verify")
	from := fs.String("from", "", "first day to verify (YYYY-MM-DD); default every built partition")
	to := fs.String("to", "", "last day to verify, included")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	if *name == "" {
		fmt.Fprintf(stderr, "%s: --aggregate is required%s\n", app, configured("aggregates", cfg.AggregateNames()))
		return exitUsage
	}
	if cfg.Aggregates[*name] == nil {
		fmt.Fprintf(stderr, "%s: --aggregate: no aggregate named %q%s\n", app, *name, configured("aggregates", cfg.AggregateNames()))
		return exitUsage
	}
	var r *backfill.Range
	if *from != "" || *to != "" {
		rr, err := parseDays(*from, *to)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v (give both --from and --to, or neither)\n", app, err)
			return exitUsage
		}
		r = &rr
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	rec, err := reconcile.New(cfg, pool, reconcile.Options{Logger: logger(cfg, stderr), Now: serviceClock})
	if err != nil {
		return failed(stderr, app, err)
	}
	d, err := rec.Definition(ctx, *name)
	if err != nil {
		return failed(stderr, app, err)
	}
	started := serviceClock()
	checks, err := backfill.Verify(ctx, pool, d, r)
	if rerr := backfill.RecordVerify(ctx, pool, *name, false, started, serviceClock(), checks, err); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return failed(stderr, app, err)
	}
	compared, unexpected, pending, archived := backfill.Tally(checks)
	drifted := unexpected + pending
	fmt.Fprintf(stdout, "%s: %d partitions verified, %d differ from a rebuild", *name, compared, drifted)
	if archived > 0 {
		fmt.Fprintf(stdout, "; %d archived partitions not compared (retention dropped their raw rows)", archived)
	}
	fmt.Fprintln(stdout)
	for _, c := range checks {
		if !c.Drifted() {
			continue
		}
		note := ""
		switch {
		case c.Queued:
			note = " (queued for the reconciler: expected until it runs)"
		case c.Unread:
			note = " (loads the reconciler has not read yet: expected until it runs)"
		}
		fmt.Fprintf(stdout, "  %-26s %d rows missing, %d rows extra%s\n", c.Partition.Label(), c.Missing, c.Extra, note)
	}
	if drifted > 0 {
		fmt.Fprintf(stderr, "%s: %d partitions differ; `tidemark backfill --aggregate %s --from D --to D --reprocess completed` rebuilds them\n", app, drifted, *name)
		return exitFailure
	}
	return exitOK
}
