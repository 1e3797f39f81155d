package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/mirror"
)

// pollSources lists the configured poll sources.
func pollSources(cfg *config.Config) []string {
	var names []string
	for _, n := range cfg.SourceNames() {
		if cfg.Sources[n].Kind() == config.KindPoll {
			names = append(names, n)
		}
	}
	return names
}

func cmdPoll(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("poll", stderr)
	once := fs.Bool("once", false, "load one window and exit")
	name := fs.String("source", "", "the poll source to load")
	upperFlag := fs.String("upper", "", "upper bound of the window (default: now() - safety_lag on the source's clock)")
	lookbackFlag := fs.String("lookback", "", "re-read this much before the watermark (default: poll.lookback)")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if !*once {
		fmt.Fprintln(stderr, "tidemark poll: --once is required; periodic polling runs inside `tidemark run`")
		return exitUsage
	}
	var run poll.Window
	if *upperFlag != "" {
		t, err := parseUpper(*upperFlag)
		if err != nil {
			fmt.Fprintf(stderr, "tidemark poll: --upper: %v\n", err)
			return exitUsage
		}
		run.Upper = t
	}
	if *lookbackFlag != "" {
		d, err := config.ParseDuration(*lookbackFlag)
		if err != nil || d < 0 {
			fmt.Fprintf(stderr, "tidemark poll: --lookback: invalid duration %q (use e.g. 30m, 2h)\n", *lookbackFlag)
			return exitUsage
		}
		run.Lookback = &d
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	names := pollSources(cfg)
	if *name == "" || cfg.Sources[*name].Kind() != config.KindPoll {
		fmt.Fprintf(stderr, "tidemark poll: --source: %q is not a poll source%s\n", *name, configured("poll sources", names))
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, "tidemark poll", stderr, *name)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	// A first load shows its progress: a bar on a terminal, plain lines
	// elsewhere; the log goes through the display around the bar.
	disp := progress.Command(stderr, progressEvery)
	pc, err := poll.ConfigFrom(cfg, *name)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark poll: %v\n", err)
		return exitFailure
	}
	p, err := poll.New(pc, pool, poll.Options{Logger: logger(cfg, disp.Writer()), Now: serviceClock, Progress: disp})
	if err != nil {
		fmt.Fprintf(stderr, "tidemark poll: %v\n", err)
		return exitFailure
	}
	defer p.Close()
	rep, err := p.RunOnce(ctx, run)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark poll: %v\n", grants.Explain(err))
		if errors.Is(err, poll.ErrSource) || errors.Is(err, mirror.ErrSource) || errors.Is(err, mirror.ErrMirror) {
			return exitUsage
		}
		return exitFailure
	}
	low, wm := "-infinity", "- (nothing loaded yet)"
	if !rep.Low.IsZero() {
		low = rep.Low.UTC().Format(time.RFC3339Nano)
	}
	if !rep.Watermark.IsZero() {
		wm = rep.Watermark.UTC().Format(time.RFC3339Nano)
	}
	more := ""
	if rep.More {
		more = "; stopped at poll.max_rows_per_run, more rows wait"
	}
	fmt.Fprintf(stdout, "%s: window (%s, %s]: read %d, merged %d (%d inserted, %d updated, %d deleted), watermark %s%s\n",
		*name, low, rep.Upper.UTC().Format(time.RFC3339Nano), rep.Read, rep.Merged, rep.Inserted, rep.Updated, rep.Deleted, wm, more)
	return exitOK
}
