package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
)

// cmdForget removes the state of an aggregate that no configuration names
// any more: retention keeps the raw rows and ledger rows every registered
// aggregate needs, so an aggregate removed for good holds them back until
// it is forgotten.
func cmdForget(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark forget"
	fs, path := flags("forget", stderr)
	name := fs.String("aggregate", "", "the aggregate, no longer configured, whose state to remove")
	dryRun := fs.Bool("dry-run", false, "print what would be removed and change nothing")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	switch {
	case *name == "":
		fmt.Fprintf(stderr, "%s: --aggregate is required\n", app)
		return exitUsage
	case cfg.Aggregates[*name] != nil:
		fmt.Fprintf(stderr, "%s: --aggregate: %s is in the configuration (aggregates.%s): remove it there first, from every instance's configuration\n",
			app, *name, *name)
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	var gone []aggregate.Forgotten
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		gone, err = aggregate.Forget(ctx, tx, *name, serviceClock(), *dryRun)
		if err == nil && *dryRun {
			err = errDryRun
		}
		return err
	})
	if err != nil && !errors.Is(err, errDryRun) {
		return failed(stderr, app, err)
	}
	verb := "removed"
	if *dryRun {
		verb = "would remove"
	}
	fmt.Fprintf(stdout, "%s: %s the state of aggregate %s\n", app, verb, *name)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "table\trows\t\n")
	for _, g := range gone {
		fmt.Fprintf(tw, "%s\t%d\t\n", g.Table, g.Rows)
	}
	if err := tw.Flush(); err != nil {
		return failed(stderr, app, err)
	}
	fmt.Fprintf(stdout, "its table and shadow table are left as they are; drop them when no longer needed\n")
	return exitOK
}

// errDryRun rolls back a transaction that only counted.
var errDryRun = errors.New("dry run")
