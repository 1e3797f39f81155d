package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/tidemark-dev/tidemark/cmd/tidemark/demo"
)

func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tidemark demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	verbose := fs.Bool("v", false, "show the service log")
	serve := fs.Bool("serve", false, "keep the service and its status page running at the end, until Ctrl-C")
	onCitus := fs.Bool("citus", false, "put the warehouse on a Citus cluster (a coordinator and two workers); needs Citus installed for the PostgreSQL server binaries")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	level := slog.LevelError + 4
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := demo.Run(ctx, stdout, demo.Options{Logger: log, Serve: *serve, Citus: *onCitus}); err != nil {
		fmt.Fprintf(stderr, "tidemark demo: %v\n", err)
		return exitFailure
	}
	return exitOK
}
