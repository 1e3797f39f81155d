package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/progress"
)

// cmdResync asks the readers of a CDC source to copy tables again while
// their changes stream (an incremental snapshot), without emptying their
// mirrors.
func cmdResync(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark resync"
	fs, path := flags("resync", stderr)
	dryRun := fs.Bool("dry-run", false, "say what would be copied and how long the last copy of each table took; change nothing")
	newSlot := fs.Bool("new-slot", false, "replace a lost or missing slot with a new one and copy every table again (no TABLE)")
	wait := fs.Bool("wait", false, "follow the resyncs until each is done, showing their progress")
	names, code, ok := parseNames(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if *wait && *dryRun {
		fmt.Fprintf(stderr, "%s: --wait follows the resyncs asked for, which --dry-run does not ask for: give one of them\n", app)
		return exitUsage
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	source, tables := names[0], names[1:]
	src := cfg.Sources[source]
	if src == nil || src.Kind() != config.KindCDC {
		fmt.Fprintf(stderr, "%s: %q is not a CDC source%s\n", app, source, configured("CDC sources", cdcSources(cfg)))
		return exitUsage
	}
	known := map[string]bool{}
	var all []string
	for _, t := range src.CDC.Tables {
		s, n := config.SplitTable(t)
		known[s+"."+n] = true
		all = append(all, s+"."+n)
	}
	if *newSlot && (len(tables) > 0 || *dryRun || *wait) {
		fmt.Fprintf(stderr, "%s: --new-slot copies every table of the source again: it takes no TABLE, --dry-run or --wait\n", app)
		return exitUsage
	}
	if len(tables) == 0 {
		tables = all
	}
	for i, t := range tables {
		s, n := config.SplitTable(t)
		tables[i] = s + "." + n
		if !known[tables[i]] {
			fmt.Fprintf(stderr, "%s: sources.%s.cdc.tables does not name %s (it names: %s)\n", app, source, tables[i], strings.Join(all, ", "))
			return exitUsage
		}
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	if *newSlot {
		return askNewSlot(ctx, pool, source, stdout, stderr)
	}
	var asked []cdc.Resync
	for _, t := range tables {
		if *dryRun {
			last, had, err := cdc.LastResync(ctx, pool, source, t)
			if err != nil {
				return failed(stderr, app, err)
			}
			fmt.Fprintf(stdout, "%s: would resync %s %s (%s)\n", app, source, t, lastCopy(last, had))
			continue
		}
		r, isNew, err := cdc.RequestResync(ctx, pool, source, t, osUser(), time.Now())
		if err != nil {
			return failed(stderr, app, err)
		}
		asked = append(asked, r)
		if !isNew {
			fmt.Fprintf(stdout, "%s: %s %s is being resynced already (%s, %d chunks, %d rows copied)\n", app, source, t, r.State, r.Chunks, r.Rows)
			continue
		}
		fmt.Fprintf(stdout, "%s: %s %s asked for (generation %d); the reader streaming the source copies it while the stream goes on\n", app, source, t, r.Generation)
	}
	if *wait && len(asked) > 0 {
		// A bar on a terminal, plain lines elsewhere; the log goes
		// through the display around the bar.
		disp := progress.Command(stderr, progressEvery)
		return waitResyncs(ctx, pool, source, asked, disp, logger(cfg, disp.Writer()), stdout, stderr)
	}
	return exitOK
}

// lastCopy says how the last resync of a table went.
func lastCopy(r cdc.Resync, had bool) string {
	switch {
	case !had:
		return "never resynced"
	case r.State != "done":
		return fmt.Sprintf("a resync is %s: %d chunks, %d rows copied", r.State, r.Chunks, r.Rows)
	case r.StartedAt != nil && r.FinishedAt != nil:
		return fmt.Sprintf("the last copy took %s: %d rows, %d removed", r.FinishedAt.Sub(*r.StartedAt).Round(time.Second), r.Rows, r.Removed)
	}
	return "resynced before"
}

// cdcSources are the names of the CDC sources of cfg.
func cdcSources(cfg *config.Config) []string {
	var out []string
	for _, n := range cfg.SourceNames() {
		if cfg.Sources[n].Kind() == config.KindCDC {
			out = append(out, n)
		}
	}
	return slices.Clip(out)
}

// parseNames parses the flags of a command that takes names as its
// arguments, the first required, before or after the flags.
func parseNames(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) ([]string, int, bool) {
	var names, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case !strings.HasPrefix(a, "-"):
			names = append(names, a)
		case takesValue(fs, a) && i+1 < len(args):
			rest = append(rest, a, args[i+1])
			i++
		default:
			rest = append(rest, a)
		}
	}
	if code, ok := parse(fs, rest, stdout, stderr); !ok {
		return nil, code, false
	}
	if len(names) == 0 {
		fmt.Fprintf(stderr, "%s: name the source: %s SOURCE\n", fs.Name(), fs.Name())
		return nil, exitUsage, false
	}
	return names, 0, true
}
