package main

import (
	"context"
	"fmt"
	"io"

	"github.com/tidemark-dev/tidemark/migrate"
)

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("migrate", stderr)
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	res, err := migrate.Up(ctx, cfg.Warehouse.DSN, logger(cfg, stderr))
	if err != nil {
		return failed(stderr, "tidemark migrate", err)
	}
	for _, m := range res.Applied {
		fmt.Fprintf(stdout, "applied %04d_%s\n", m.Version, m.Name)
	}
	fmt.Fprintf(stdout, "warehouse schema at version %d\n", res.Current)
	return exitOK
}
