package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/service"
)

// cmdGrants prints the psql script that sets up the database roles of the
// configuration with least privilege.
func cmdGrants(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("grants", stderr)
	roles := grants.DefaultRoles
	fs.StringVar(&roles.Migration, "migration-role", roles.Migration, "the role that owns tidemark's schemas and runs `tidemark migrate`")
	fs.StringVar(&roles.Runtime, "runtime-role", roles.Runtime, "the warehouse role of `tidemark run` and the other commands")
	fs.StringVar(&roles.Poll, "poll-role", roles.Poll, "the role of poll sources on their databases")
	fs.StringVar(&roles.CDC, "cdc-role", roles.CDC, "the role of CDC sources on their databases")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	plan, err := grants.FromConfig(cfg, roles)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark grants: %v\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return exitUsage
	}
	fmt.Fprint(stdout, grants.Script(plan))
	return exitOK
}

// checkGrants checks, on pool, that the warehouse role holds what the
// configuration needs, and that the roles of the named sources hold what
// they need, and reports every missing privilege at once.
func checkGrants(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, sources []string, log *slog.Logger) error {
	return grants.Join(grants.Check(ctx, pool, grants.Warehouse(cfg, "")), grants.CheckSources(ctx, cfg, sources, log))
}

// preflightRun checks the privileges `tidemark run` needs before the
// service starts, when the warehouse can be reached and its schema is
// current; otherwise the service waits for the warehouse, or applies the
// migrations, and a missing privilege shows when it is used.
func preflightRun(ctx context.Context, cfg *config.Config, only []string, log *slog.Logger) error {
	pool, err := service.Pool(ctx, cfg, "tidemark")
	if err != nil {
		return nil
	}
	defer pool.Close()
	if migrate.Check(ctx, pool) != nil {
		return nil
	}
	running := only
	if len(running) == 0 {
		running = service.Configured(cfg)
	}
	var sources []string
	for _, name := range cfg.SourceNames() {
		s := cfg.Sources[name]
		if (s.Kind() == config.KindPoll && slices.Contains(running, service.ComponentPoll)) || (s.Kind() == config.KindCDC && slices.Contains(running, service.ComponentCDC)) {
			sources = append(sources, name)
		}
	}
	return preflightVerdict(checkGrants(ctx, pool, cfg, sources, log), log)
}

// preflightVerdict says what the preflight check's result means for
// `tidemark run`: missing privileges stop it; a check that could not
// finish (a connection lost in the middle, say to a server restarting)
// does not, as when the warehouse cannot be reached at all: the service
// starts, retries its connections, and a missing privilege shows when it
// is used.
func preflightVerdict(err error, log *slog.Logger) error {
	var missing *grants.MissingError
	if err == nil || errors.As(err, &missing) {
		return err
	}
	log.Warn("cannot check privileges now; starting anyway, and a missing privilege will show when it is used", "err", err)
	return nil
}
