package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/tidemark-dev/tidemark/retention"
)

func cmdPrune(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark prune"
	fs, path := flags("prune", stderr)
	dryRun := fs.Bool("dry-run", false, "print what retention would remove and change nothing")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	p, err := retention.New(cfg, pool, retention.Options{Logger: logger(cfg, stderr), Now: serviceClock})
	if err != nil {
		return failed(stderr, app, err)
	}
	rep, err := p.Run(ctx, *dryRun)
	if rep != nil {
		if werr := writePruneReport(stdout, rep); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		return failed(stderr, app, err)
	}
	return exitOK
}

// writePruneReport prints per table what a run removed (or would
// remove), then per source the raw partitions dropped and why the next
// one is kept, and the aggregate partitions archived.
func writePruneReport(w io.Writer, rep *retention.Report) error {
	verb := "removed"
	head := fmt.Sprintf("prune at %s", rep.At.UTC().Format(time.RFC3339))
	if rep.DryRun {
		verb = "would remove"
		head += " (dry run: nothing changed)"
	}
	fmt.Fprintln(w, head)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "table\trows\tpartitions\tbytes\t\n")
	removed := false
	for _, t := range rep.Tables {
		if t.Rows == 0 && t.Partitions == 0 {
			continue
		}
		removed = true
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t\n", t.Name, t.Rows, t.Partitions, t.Bytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !removed {
		fmt.Fprintf(w, "nothing to remove\n")
	}
	for _, s := range rep.Sources {
		if n := len(s.Dropped); n > 0 {
			fmt.Fprintf(w, "raw.%s: %s %d partitions, %s .. %s\n", s.Name, verb, n,
				s.Dropped[0].Start.UTC().Format(time.DateOnly), s.Dropped[n-1].End.Add(-time.Nanosecond).UTC().Format(time.DateOnly))
		}
		if !s.RetainedFrom.IsZero() {
			fmt.Fprintf(w, "raw.%s: event times before %s dropped; aggregate partitions starting before it are archived\n",
				s.Name, s.RetainedFrom.UTC().Format(time.RFC3339))
		}
		if s.Kept != "" {
			fmt.Fprintf(w, "raw.%s: %s\n", s.Name, s.Kept)
		}
	}
	names := make([]string, 0, len(rep.Archived))
	for n := range rep.Archived {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if rep.Archived[n] > 0 {
			fmt.Fprintf(w, "aggregate %s: %d partitions archived\n", n, rep.Archived[n])
		}
	}
	return nil
}
