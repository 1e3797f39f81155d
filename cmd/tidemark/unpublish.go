package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
)

// cmdUnpublish drops tables that a CDC source no longer tracks from its
// publication, so that the source stops sending their changes.
func cmdUnpublish(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark unpublish"
	fs, path := flags("unpublish", stderr)
	dryRun := fs.Bool("dry-run", false, "print the statement; change nothing")
	names, code, ok := parseNames(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	source, tables := names[0], names[1:]
	if src := cfg.Sources[source]; src == nil || src.Kind() != config.KindCDC {
		fmt.Fprintf(stderr, "%s: %q is not a CDC source%s\n", app, source, configured("CDC sources", cdcSources(cfg)))
		return exitUsage
	}
	c, err := cdc.ConfigFrom(cfg, source)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", app, err)
		return exitUsage
	}
	for i, t := range tables {
		s, n := config.SplitTable(t)
		tables[i] = s + "." + n
		for _, tracked := range c.Tables {
			if tracked.Source[0] == s && tracked.Source[1] == n {
				fmt.Fprintf(stderr, "%s: sources.%s.cdc.tables names %s: remove it from the configuration first\n", app, source, tables[i])
				return exitUsage
			}
		}
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	streamed, err := cdc.StreamedTables(ctx, pool, source)
	if err != nil {
		return failed(stderr, app, err)
	}
	u, err := cdc.Unpublish(ctx, c, tables, streamed, *dryRun)
	switch {
	case errors.Is(err, cdc.ErrUnpublish):
		fmt.Fprintf(stderr, "%s: %v\n", app, err)
		return exitFailure
	case err != nil:
		return failed(stderr, app, err)
	case u.Statement == "":
		fmt.Fprintf(stdout, "%s: publication %s publishes no table that sources.%s.cdc.tables does not name\n", app, c.Publication, source)
	case *dryRun:
		fmt.Fprintf(stdout, "%s: would run %s\n", app, u.Statement)
	default:
		fmt.Fprintf(stdout, "%s: ran %s; the source no longer sends the changes of %s; their mirrors and raw change rows are kept\n",
			app, u.Statement, strings.Join(u.Tables, ", "))
	}
	return exitOK
}
