package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/service"
)

func cmdReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("reconcile", stderr)
	once := fs.Bool("once", false, "run once for each aggregate (or --aggregate), waiting for any other instance, then exit")
	only := fs.String("aggregate", "", "reconcile only this aggregate")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if !*once {
		fmt.Fprintln(stderr, "tidemark reconcile: --once is required; the periodic reconciler runs inside `tidemark run`")
		return exitUsage
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	names := cfg.AggregateNames()
	if *only != "" {
		if cfg.Aggregates[*only] == nil {
			fmt.Fprintf(stderr, "tidemark reconcile: --aggregate: no aggregate named %q%s\n", *only, configured("aggregates", names))
			return exitUsage
		}
		names = []string{*only}
	}
	if len(names) == 0 {
		fmt.Fprintln(stderr, "tidemark reconcile: no aggregates configured")
		return exitUsage
	}
	log := logger(cfg, stderr)
	if cfg.Warehouse.Migrate {
		if _, err := migrate.Up(ctx, cfg.Warehouse.DSN, log); err != nil {
			fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
			return exitFailure
		}
	}
	pool, err := service.Pool(ctx, cfg, "tidemark-reconcile")
	if err != nil {
		fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
		return exitFailure
	}
	defer pool.Close()
	if err := migrate.Check(ctx, pool); err != nil {
		fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
		return exitFailure
	}
	if err := checkGrants(ctx, pool, cfg, nil, log); err != nil {
		fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
		return exitFailure
	}
	r, err := reconcile.New(cfg, pool, reconcile.Options{Logger: log, Now: serviceClock})
	if err != nil {
		fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
		return exitFailure
	}
	code := exitOK
	for _, name := range names {
		rep, err := r.RunOnce(ctx, name, true)
		if err != nil {
			return failed(stderr, "tidemark reconcile", err)
		}
		wm := rep.Watermark
		if wm == "" || strings.HasPrefix(wm, "0001-01-01") {
			wm = "- (nothing read yet)"
		}
		fmt.Fprintf(stdout, "%s: read %d, queued %d, rebuilt %d%s, %d still queued, load watermark %s\n",
			name, rep.Read, rep.Queued, len(rep.Rebuilt), listed(rep.Rebuilt), rep.Remaining, wm)
		if len(rep.Failed) > 0 {
			fmt.Fprintf(stderr, "tidemark reconcile: %s: rebuilding %s failed; they stay queued (see tidemark.pending_partitions.last_error)\n",
				name, strings.Join(rep.Failed, ", "))
			code = exitFailure
		}
	}
	return code
}
