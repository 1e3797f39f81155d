package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/service"
)

// shutdownLimit bounds how long `run` takes to stop after SIGTERM or
// SIGINT. Every step of a shutdown has a bound of its own (about 40s in
// all); if they do not add up, a bug is holding the process, which then
// logs every goroutine's stack, for the report, and exits with status 1.
// The exactly-once bookkeeping makes that as safe as a SIGKILL.
var shutdownLimit = 60 * time.Second

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("run", stderr)
	only := fs.String("only", "", "comma-separated components to run (available: "+strings.Join(service.Components, ", ")+"); default all")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	var comps []string
	if *only != "" {
		for _, c := range strings.Split(*only, ",") {
			c = strings.TrimSpace(c)
			if !slices.Contains(service.Components, c) {
				fmt.Fprintf(stderr, "tidemark run: --only: unknown component %q (available: %s)\n", c, strings.Join(service.Components, ", "))
				return exitUsage
			}
			comps = append(comps, c)
		}
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	log := logger(cfg, stderr)
	setMemoryLimit(cfg, log)
	err := preflightRun(ctx, cfg, comps, log)
	if ctx.Err() != nil {
		// SIGTERM or SIGINT before the service started: nothing was
		// running, and a check it cut short is no failure.
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "tidemark run: %v\n", err)
		return exitFailure
	}
	finished := make(chan struct{})
	defer close(finished)
	go exitIfShutdownHangs(ctx, finished, log, stderr)
	if err := service.Run(ctx, cfg, service.Options{Logger: log, Only: comps, Now: serviceClock}); err != nil {
		log.Error("tidemark stopped with an error", "err", grants.Explain(err))
		return exitFailure
	}
	return exitOK
}

// runtimeReserve is what the process holds besides its sources' memory
// budgets: connections, metrics, the runtime's own (10 MiB idle), and
// room for the collector to work in.
const runtimeReserve = 16 << 20

// setMemoryLimit gives the Go runtime a soft memory limit of the sources'
// memory budgets plus runtimeReserve, unless GOMEMLIMIT sets one. The
// collector then runs before the heap doubles what is live (GOGC's
// default), which is what keeps the process's size near its budgets.
func setMemoryLimit(cfg *config.Config, log *slog.Logger) {
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		return
	}
	limit := cfg.MemoryBudget() + runtimeReserve
	debug.SetMemoryLimit(limit)
	log.Debug("runtime memory limit set from the sources' budgets (GOMEMLIMIT overrides it)", "bytes", limit)
}

// exitIfShutdownHangs ends the process shutdownLimit after ctx is
// cancelled (by a signal) unless finished is closed first.
func exitIfShutdownHangs(ctx context.Context, finished <-chan struct{}, log *slog.Logger, stderr io.Writer) {
	select {
	case <-finished:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(shutdownLimit)
	defer t.Stop()
	select {
	case <-finished:
	case <-t.C:
		log.Error("shutdown did not finish in time; exiting without waiting further (the goroutines follow)", "limit", shutdownLimit)
		_ = pprof.Lookup("goroutine").WriteTo(stderr, 2)
		os.Exit(exitFailure)
	}
}
