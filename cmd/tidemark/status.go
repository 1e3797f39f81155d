package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/service"
	"github.com/tidemark-dev/tidemark/status"
)

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("status", stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := service.Pool(ctx, cfg, "tidemark-status")
	if err != nil {
		return failed(stderr, "tidemark status", err)
	}
	defer pool.Close()
	var adm *kadm.Client
	if len(cfg.Kafka.Brokers) > 0 {
		kopts, err := kafka.ClientOptions(cfg.Kafka)
		if err != nil {
			return failed(stderr, "tidemark status", err)
		}
		cl, err := kgo.NewClient(kopts...)
		if err != nil {
			fmt.Fprintf(stderr, "tidemark status: kafka client: %v\n", err)
			return exitFailure
		}
		defer cl.Close()
		adm = kadm.NewClient(cl)
	}
	rep, err := status.Gather(ctx, pool, cfg, adm, time.Now())
	if err != nil {
		return failed(stderr, "tidemark status", schemaHint(ctx, pool, err))
	}
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return failed(stderr, "tidemark status", err)
	}
	return exitOK
}
