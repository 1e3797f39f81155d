package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/backoff"
	"github.com/tidemark-dev/tidemark/migrate"
)

// prepareSchema applies the migrations (warehouse.migrate: true) or checks
// that the schema is current (false), waiting while the warehouse cannot be
// reached rather than exiting, so that a service started before its
// database comes up by itself.
func prepareSchema(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, log *slog.Logger) error {
	b := backoff.Backoff{First: time.Second, Max: 30 * time.Second, Jitter: 0.2}
	for {
		var err error
		if cfg.Warehouse.Migrate {
			var res migrate.Result
			if res, err = migrate.Up(ctx, cfg.Warehouse.DSN, log); err == nil {
				log.Info("warehouse schema ready", "version", res.Current, "applied", len(res.Applied))
			}
		} else {
			// Migrations are left to the operator; refuse to run against a
			// schema this binary does not match.
			err = migrate.Check(ctx, pool)
		}
		var connErr *pgconn.ConnectError
		if err == nil || !errors.As(err, &connErr) || ctx.Err() != nil {
			return err
		}
		delay := b.Next()
		log.Warn("warehouse unreachable; waiting for it", "err", err, "retry_in", delay.Round(time.Millisecond))
		if err := backoff.Sleep(ctx, delay); err != nil {
			return err
		}
	}
}
