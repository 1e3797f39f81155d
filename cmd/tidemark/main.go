// Command tidemark loads Kafka events and PostgreSQL tables into a
// PostgreSQL warehouse exactly once, keeps its state there, and rebuilds
// aggregates by event date.
//
// tidemark help prints the synopsis of every command (synopses, in
// synopsis.go); docs/commands.md documents every command and flag.
// Exit codes: 0 success, 1 failure, 2 bad usage or configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	// The zone database, for hosts and images that have none: aggregate
	// calendars and poll time zones name IANA zones.
	_ "time/tzdata"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/service"
)

// serviceClock is the clock `tidemark run` gives the service. Tests of the
// command replace it to run the service at a fixed date.
var serviceClock = time.Now

// failed reports err as the command app's failure, with the hint to
// `tidemark grants` when the warehouse refused a privilege, and returns
// the exit status for it.
func failed(stderr io.Writer, app string, err error) int {
	msg := grants.Explain(err).Error()
	// The errors of a package named like the command (migrate) begin
	// with its name too: say it once.
	msg = strings.TrimPrefix(msg, strings.TrimPrefix(app, "tidemark ")+": ")
	fmt.Fprintf(stderr, "%s: %s\n", app, msg)
	return exitFailure
}

// schemaCurrent returns nil when the warehouse's tidemark schema is at
// this binary's version (or later), and otherwise an error saying to run
// `tidemark migrate`: the one message of every command that finds the
// schema missing or behind.
func schemaCurrent(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	v, err := migrate.Version(ctx, q)
	switch {
	case err != nil:
		return err
	case v == 0:
		return fmt.Errorf("the warehouse has no tidemark schema (this binary's is version %d): run `tidemark migrate` first", migrate.Latest())
	case v < migrate.Latest():
		return fmt.Errorf("the warehouse's tidemark schema is at version %d, behind this binary's %d: run `tidemark migrate` first", v, migrate.Latest())
	}
	return nil
}

// schemaHint returns err, or, when err is a missing table
// (pgerr.UndefinedTable) of a warehouse whose tidemark schema is missing
// or behind, the error of schemaCurrent: a command that only reads, and
// so applies no migration, says what to run rather than which relation
// does not exist.
func schemaHint(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, err error) error {
	if !pgerr.UndefinedTable(err) {
		return err
	}
	// The command's own deadline may have passed meanwhile.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if serr := schemaCurrent(ctx, q); serr != nil {
		return serr
	}
	return err
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	name := args[0]
	if alias, ok := commandAliases[name]; ok {
		name = alias
	}
	if cmd := commands[name]; cmd != nil {
		return cmd(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "tidemark: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// commands are the commands by name; run dispatches through this table.
var commands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) int{
	"run":          cmdRun,
	"migrate":      cmdMigrate,
	"status":       cmdStatus,
	"check":        cmdCheck,
	"lateness":     cmdLateness,
	"reconcile":    cmdReconcile,
	"backfill":     cmdBackfill,
	"verify":       cmdVerify,
	"refresh":      cmdRefresh,
	"poll":         cmdPoll,
	"keys":         cmdKeys,
	"prune":        cmdPrune,
	"forget":       cmdForget,
	"pause":        cmdPause,
	"resume":       cmdResume,
	"resync":       cmdResync,
	"unpublish":    cmdUnpublish,
	"dead-letters": cmdDeadLetters,
	"grants":       cmdGrants,
	"demo":         cmdDemo,
	"version": func(_ context.Context, _ []string, stdout, _ io.Writer) int {
		fmt.Fprintf(stdout, "tidemark %s (%s)\n", service.VersionString(), runtime.Version())
		return exitOK
	},
	"help": func(_ context.Context, _ []string, stdout, _ io.Writer) int {
		fmt.Fprint(stdout, usage)
		return exitOK
	},
}

// commandAliases are other names of commands.
var commandAliases = map[string]string{"--version": "version", "-h": "help", "--help": "help"}

// printFlags prints the usage of fs to w, as the flag package does.
func printFlags(fs *flag.FlagSet, w io.Writer) {
	out := fs.Output()
	fs.SetOutput(w)
	fmt.Fprintf(w, "Usage of %s:\n", fs.Name())
	fs.PrintDefaults()
	fs.SetOutput(out)
}

// flags makes a command's flag set with the shared -c/--config flag.
func flags(name string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("tidemark "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := os.Getenv("TIDEMARK_CONFIG")
	if def == "" {
		def = "tidemark.yaml"
	}
	path := new(string)
	fs.StringVar(path, "config", def, "configuration file")
	fs.StringVar(path, "c", def, "configuration file (shorthand)")
	return fs, path
}

// parse parses flags; it returns false with the exit code when the command
// must stop: help (-h, --help), printed to standard output with exit
// status 0, or a usage error, printed with the usage to standard error
// with status 2.
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (int, bool) {
	out := fs.Output()
	fs.SetOutput(io.Discard) // the error and the usage are printed below, each where it belongs
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printFlags(fs, stdout)
		return exitOK, false
	case err != nil:
		fmt.Fprintln(out, err)
		printFlags(fs, out)
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return exitUsage, false
	}
	return 0, true
}

// configured ends a message about a name that a flag got wrong with the
// names it could have been: " (configured: a, b)", or "; no KIND are
// configured" when there are none.
func configured(kind string, names []string) string {
	if len(names) == 0 {
		return "; no " + kind + " are configured"
	}
	return " (configured: " + strings.Join(names, ", ") + ")"
}

// load reads the configuration; on failure it prints every problem and
// returns false.
func load(path string, stderr io.Writer) (*config.Config, bool) {
	cfg, err := config.Load(path)
	if err != nil {
		var errs config.Errors
		if errors.As(err, &errs) {
			fmt.Fprintf(stderr, "tidemark: invalid configuration (%d problem(s)):\n%s\n", len(errs), errs)
		} else {
			fmt.Fprintf(stderr, "tidemark: %v\n", err)
		}
		return nil, false
	}
	return cfg, true
}

func logger(cfg *config.Config, stderr io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(grants.LogHandler(slog.NewJSONHandler(stderr, opts)))
	}
	return slog.New(grants.LogHandler(slog.NewTextHandler(stderr, opts)))
}

func listed(labels []string) string {
	if len(labels) == 0 {
		return ""
	}
	if len(labels) > 10 {
		return fmt.Sprintf(" (%s, … %d more)", strings.Join(labels[:10], ", "), len(labels)-10)
	}
	return " (" + strings.Join(labels, ", ") + ")"
}

// prepareWarehouse applies or checks the migrations, opens the pool and
// checks the privileges of the warehouse role and of the roles of sources.
func prepareWarehouse(ctx context.Context, cfg *config.Config, app string, stderr io.Writer, sources ...string) (*pgxpool.Pool, bool) {
	if cfg.Warehouse.Migrate {
		if _, err := migrate.Up(ctx, cfg.Warehouse.DSN, logger(cfg, stderr)); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", app, grants.Explain(err))
			return nil, false
		}
	}
	pool, err := service.Pool(ctx, cfg, strings.ReplaceAll(app, " ", "-"))
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", app, err)
		return nil, false
	}
	if err := schemaCurrent(ctx, pool); err != nil {
		pool.Close()
		fmt.Fprintf(stderr, "%s: %v\n", app, err)
		return nil, false
	}
	if err := checkGrants(ctx, pool, cfg, sources, logger(cfg, stderr)); err != nil {
		pool.Close()
		fmt.Fprintf(stderr, "%s: %v\n", app, err)
		return nil, false
	}
	return pool, true
}

// parseUpper reads --upper: RFC 3339, or "2006-01-02 15:04[:05]" with a
// zone offset such as +00.
func parseUpper(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05Z07:00", "2006-01-02 15:04Z07:00", "2006-01-02 15:04:05Z07", "2006-01-02 15:04Z07"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time with a zone offset (e.g. 2026-10-05T10:00:00Z or \"2026-10-05 10:00+00\")", s)
}
