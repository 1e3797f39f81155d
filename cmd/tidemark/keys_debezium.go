package main

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/mirror"
)

// keysDebezium checks the mirror of a Debezium source for drift against
// the source table, when the configuration names it (mirror.source_dsn
// and mirror.source_table): a dry run only, as for a CDC source, since its
// deletes arrive as change events.
func keysDebezium(ctx context.Context, cfg *config.Config, name string, dryRun bool, stdout, stderr io.Writer) int {
	m := cfg.Sources[name].Mirror
	switch {
	case !dryRun:
		fmt.Fprintf(stderr, "tidemark keys: --source %s is a Debezium source: its deletes arrive as change events; "+
			"add --dry-run to check its mirror for drift\n", name)
		return exitUsage
	case m.SourceDSN == "":
		fmt.Fprintf(stderr, "tidemark keys: --source %s: set sources.%s.mirror.source_dsn and source_table "+
			"to the PostgreSQL table the connector reads to check its mirror\n", name, name)
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, "tidemark keys", stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	ts, tt := config.SplitTable(m.Table)
	ss, st := config.SplitTable(m.SourceTable)
	t := &mirror.Table{Name: name, Source: pgx.Identifier{ss, st}, Target: pgx.Identifier{ts, tt},
		DeletedColumn: m.DeletedColumn, LoadedColumn: m.LoadedColumn, TableKey: "mirror.source_table", KeyKey: "mirror.table"}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	}
	_, key, exists, err := mirror.ReadTarget(ctx, conn.Conn(), t.Target)
	conn.Release()
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	case !exists:
		fmt.Fprintf(stderr, "tidemark keys: the mirror %s does not exist yet; it is created when the first change events arrive\n", t.Target.Sanitize())
		return exitFailure
	}
	t.Key = key
	disp := progress.Command(stderr, progressEvery)
	drift, ok := checkMirrorKeys(ctx, t, m.SourceDSN, pool, mirror.KeyOptions{Logger: logger(cfg, disp.Writer()), Now: serviceClock, Progress: disp},
		name, stdout, stderr)
	if !ok || drift {
		return exitFailure
	}
	return exitOK
}
