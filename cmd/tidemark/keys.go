package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/mirror"
)

// keySources lists the sources whose mirrors key reconciliation checks.
func keySources(cfg *config.Config) []string {
	var names []string
	for _, n := range cfg.SourceNames() {
		if s := cfg.Sources[n]; s.Kind() == config.KindPoll || s.Kind() == config.KindCDC {
			names = append(names, n)
		}
	}
	return names
}

func cmdKeys(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("keys", stderr)
	name := fs.String("source", "", "the poll, CDC or Debezium source whose mirrors to check")
	dryRun := fs.Bool("dry-run", false, "report only; exit 1 when rows are missing at the source")
	force := fs.Bool("force", false, "apply even when more rows are missing at the source than mirror.key_reconcile_max_delete allows (this run only); "+
		"with --dry-run, list everything such a run would apply")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	if src := cfg.Sources[*name]; src.Kind() == config.KindCDC {
		if *force {
			fmt.Fprintf(stderr, "tidemark keys: --force applies to poll sources; key reconciliation never changes the mirrors of CDC source %s\n", *name)
			return exitUsage
		}
		return keysCDC(ctx, cfg, *name, *dryRun, stdout, stderr)
	}
	if src := cfg.Sources[*name]; src.Kind() == config.KindDebezium {
		if *force {
			fmt.Fprintf(stderr, "tidemark keys: --force applies to poll sources; key reconciliation never changes the mirror of Debezium source %s\n", *name)
			return exitUsage
		}
		return keysDebezium(ctx, cfg, *name, *dryRun, stdout, stderr)
	}
	if *name == "" || cfg.Sources[*name].Kind() != config.KindPoll {
		fmt.Fprintf(stderr, "tidemark keys: --source: %q is not a poll or CDC source%s\n", *name, configured("poll or CDC sources", keySources(cfg)))
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, "tidemark keys", stderr, *name)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	// A bar on a terminal, plain lines elsewhere; the log goes through the
	// display around the bar.
	disp := progress.Command(stderr, progressEvery)
	log := logger(cfg, disp.Writer())
	t, err := mirror.FromConfig(cfg.Sources[*name])
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	}
	if *dryRun {
		// A dry run changes nothing, not even the mirror's shape: the
		// mirror must exist already.
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Target.Sanitize()).Scan(&exists); err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			return exitFailure
		}
		if !exists {
			fmt.Fprintf(stderr, "tidemark keys: the mirror %s does not exist yet; run `tidemark poll --once --source %s` first\n", t.Target.Sanitize(), *name)
			return exitFailure
		}
	} else {
		// Preparing the poller checks the source table and creates or
		// extends the mirror, as `tidemark run` does.
		pc, err := poll.ConfigFrom(cfg, *name)
		if err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			return exitFailure
		}
		p, err := poll.New(pc, pool, poll.Options{Logger: log, Now: serviceClock})
		if err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			return exitFailure
		}
		defer p.Close()
		if err := p.Prepare(ctx); err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			if errors.Is(err, poll.ErrSource) || errors.Is(err, mirror.ErrSource) || errors.Is(err, mirror.ErrMirror) {
				return exitUsage
			}
			return exitFailure
		}
		t = p.Mirror()
	}
	k, err := mirror.NewKeyReconciler(t, cfg.Sources[*name].Poll.DSN, pool, mirror.KeyOptions{Logger: log, Now: serviceClock,
		MaxDelete: cfg.Sources[*name].Mirror.KeyReconcileMaxDelete, Progress: disp})
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	}
	runKeys := k.Run
	if *force {
		runKeys = k.RunForced
	}
	rep, err := runKeys(ctx, *dryRun)
	if errors.Is(err, mirror.ErrKeyRefused) {
		printKeyReport(stdout, *name, rep)
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		fmt.Fprintf(stderr, "tidemark keys: check the source table %s first; if these rows were deleted on purpose, apply them with "+
			"`tidemark keys --source %s --force` (this run only), or raise mirror.key_reconcile_max_delete of source %s\n",
			t.Source.Sanitize(), *name, *name)
		return exitFailure
	}
	if err != nil {
		return failed(stderr, "tidemark keys", err)
	}
	printKeyReport(stdout, *name, rep)
	if rep.DryRun && rep.Deleted > 0 {
		return exitFailure
	}
	return exitOK
}

// printKeyReport prints a key reconciliation's result, and a line about
// mirror.key_reconcile_max_delete when the run found more rows missing
// than it allows.
func printKeyReport(stdout io.Writer, label string, rep mirror.KeyReport) {
	action := map[bool]string{false: "flagged", true: "removed"}[rep.Hard]
	switch {
	case rep.DryRun:
		action = "dry run, nothing changed"
	case rep.Refused:
		action = "refused, nothing changed"
	default:
		action = fmt.Sprintf("%d %s", rep.Applied, action)
	}
	missing := fmt.Sprint(rep.Deleted)
	if rep.DeletedAtLeast {
		missing = "at least " + missing
	}
	fmt.Fprintf(stdout, "%s: %d source keys, %d mirror keys; compared %d ranges, transferred %d keys\n",
		label, rep.SourceKeys, rep.MirrorKeys, rep.RangesCompared, rep.KeysTransferred)
	fmt.Fprintf(stdout, "%s: %s missing at the source (%s)%s; %d not yet in the mirror\n",
		label, missing, action, listed(rep.MissingAtSource), rep.MissingInMirror)
	if !rep.OverLimit() {
		return
	}
	limit := fmt.Sprintf("mirror.key_reconcile_max_delete (%s) allows %d of %d mirror rows, %s are missing (%s)",
		rep.MaxDelete, rep.Allowed, rep.MirrorKeys, missing, rep.Share())
	switch {
	case rep.Forced && rep.DryRun:
		fmt.Fprintf(stdout, "%s: %s; a run with --force would apply them\n", label, limit)
	case rep.Forced:
		fmt.Fprintf(stdout, "%s: %s; applied with --force\n", label, limit)
	case rep.DryRun:
		fmt.Fprintf(stdout, "%s: %s; a run would be refused (--force applies anyway)\n", label, limit)
	default:
		fmt.Fprintf(stdout, "%s: %s; refused (--force applies anyway)\n", label, limit)
	}
}

// keysCDC checks the mirrors of a CDC source for drift: a dry run of key
// reconciliation over each of its tables. Deletes reach those mirrors
// through the slot, so nothing is applied here.
func keysCDC(ctx context.Context, cfg *config.Config, name string, dryRun bool, stdout, stderr io.Writer) int {
	if !dryRun {
		fmt.Fprintf(stderr, "tidemark keys: --source %s is a CDC source: its deletes arrive through the replication slot; "+
			"add --dry-run to check its mirrors for drift\n", name)
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, "tidemark keys", stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	cc, err := cdc.ConfigFrom(cfg, name)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	}
	mirrors, err := cdc.Mirrors(ctx, cc)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	}
	// One bar (or series of lines) per mirror, as for a poll source.
	disp := progress.Command(stderr, progressEvery)
	log := logger(cfg, disp.Writer())
	code := exitOK
	for _, t := range mirrors {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Target.Sanitize()).Scan(&exists); err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			return exitFailure
		}
		if !exists {
			fmt.Fprintf(stderr, "tidemark keys: the mirror %s does not exist yet; it is created when the CDC reader of %s starts\n", t.Target.Sanitize(), name)
			return exitFailure
		}
		drift, ok := checkMirrorKeys(ctx, t, cfg.Sources[name].CDC.DSN, pool, mirror.KeyOptions{Logger: log, Now: serviceClock, Progress: disp},
			name, stdout, stderr)
		if !ok {
			return exitFailure
		}
		if drift {
			code = exitFailure
		}
	}
	return code
}

// checkMirrorKeys compares the keys of mirror t with its source at dsn
// without changing anything and prints the report. drift says that the
// mirror holds keys the source does not; ok is false, the error printed,
// when the check could not run.
func checkMirrorKeys(ctx context.Context, t *mirror.Table, dsn string, pool *pgxpool.Pool, opts mirror.KeyOptions,
	name string, stdout, stderr io.Writer) (drift, ok bool) {
	k, err := mirror.NewKeyReconciler(t, dsn, pool, opts)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return false, false
	}
	rep, err := k.Run(ctx, true)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %s: %v\n", t.Source.Sanitize(), grants.Explain(err))
		return false, false
	}
	printKeyReport(stdout, name+" "+t.Source[0]+"."+t.Source[1], rep)
	return rep.Deleted > 0, true
}
