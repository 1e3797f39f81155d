package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/lateness"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/service"
)

// cmdLateness prints how late a source's events arrived and the smallest
// lateness horizon that would have kept a target share of them, per
// aggregate. It reads the warehouse only.
func cmdLateness(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("lateness", stderr)
	name := fs.String("source", "", "the source whose raw rows to measure")
	sinceFlag := fs.String("since", "30d", "measure events with event times this far back from --until")
	untilFlag := fs.String("until", "", "end of the event times measured (default: now)")
	targetFlag := fs.String("target", "99.9%", "share of events the recommended horizon keeps (99.9% or 0.999)")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	since, err := config.ParseDuration(*sinceFlag)
	if err != nil || since <= 0 {
		fmt.Fprintf(stderr, "tidemark lateness: --since: %q is not a positive duration (e.g. 7d, 30d, 12h)\n", *sinceFlag)
		return exitUsage
	}
	target, err := parseShare(*targetFlag)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark lateness: --target: %v\n", err)
		return exitUsage
	}
	until := time.Now()
	if *untilFlag != "" {
		if until, err = parseUpper(*untilFlag); err != nil {
			fmt.Fprintf(stderr, "tidemark lateness: --until: %v\n", err)
			return exitUsage
		}
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	if *name == "" || cfg.Sources[*name] == nil {
		fmt.Fprintf(stderr, "tidemark lateness: --source: %s\n", noSuchSource(*name, cfg.SourceNames()))
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	pool, err := service.Pool(ctx, cfg, "tidemark-lateness")
	if err != nil {
		return failed(stderr, "tidemark lateness", err)
	}
	defer pool.Close()
	// It reads the warehouse only: the schema must be there, not applied.
	if _, err := migrate.Version(ctx, pool); err != nil {
		return failed(stderr, "tidemark lateness", err)
	}
	rep, err := lateness.Measure(ctx, pool, cfg, *name, lateness.Options{Since: until.Add(-since), Until: until, Target: target})
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w (--timeout %s; a shorter --since reads fewer rows)", err, *timeout)
	}
	err = schemaHint(ctx, pool, err)
	if err != nil {
		return failed(stderr, "tidemark lateness", err)
	}
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return failed(stderr, "tidemark lateness", err)
	}
	return exitOK
}

// parseShare reads a share as a percentage ("99.9%") or a fraction
// ("0.999") in (0, 1].
func parseShare(s string) (float64, error) {
	v, pct := strings.CutSuffix(strings.TrimSpace(s), "%")
	f, err := strconv.ParseFloat(v, 64)
	if err == nil && pct {
		f /= 100
	}
	if err != nil || f <= 0 || f > 1 {
		return 0, fmt.Errorf("%q is not a share in (0, 100%%] (e.g. 99.9%% or 0.999)", s)
	}
	return f, nil
}

// noSuchSource says that name is not a configured source, and which are.
func noSuchSource(name string, names []string) string {
	if name == "" {
		return "name the source to measure" + configured("sources", names)
	}
	return fmt.Sprintf("no source named %q%s", name, configured("sources", names))
}
