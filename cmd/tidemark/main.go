// Command tidemark loads Kafka events and PostgreSQL tables into a
// PostgreSQL warehouse exactly once, keeps its state there, and rebuilds
// aggregates by event date.
//
//	tidemark run       [-c tidemark.yaml] [--only ingest,poll,cdc,reconcile,prune]
//	tidemark migrate   [-c tidemark.yaml]
//	tidemark reconcile --once [-c tidemark.yaml] [--aggregate NAME]
//	tidemark backfill  --aggregate NAME --from D --to D [-c tidemark.yaml] [--chunk 1d] [--concurrency N]
//	                   [--reprocess missing|failed|completed] [--dry-run] [--shadow | --publish] [--force]
//	tidemark verify    --aggregate NAME [-c tidemark.yaml] [--from D --to D]
//	tidemark refresh   --aggregate NAME --full [-c tidemark.yaml] [--chunk 1d] [--concurrency N] [--dry-run]
//	tidemark poll      --once --source NAME [-c tidemark.yaml] [--upper T] [--lookback D]
//	tidemark keys      --source NAME [-c tidemark.yaml] [--dry-run] [--force]
//	tidemark prune     [-c tidemark.yaml] [--dry-run]
//	tidemark forget    --aggregate NAME [-c tidemark.yaml] [--dry-run]
//	tidemark dead-letters list [-c tidemark.yaml] [--source NAME]
//	tidemark dead-letters replay --source NAME [-c tidemark.yaml] [--reason R] [--since T] [--dry-run]
//	tidemark status    [-c tidemark.yaml] [--json]
//	tidemark check     [-c tidemark.yaml] [--source NAME]
//	tidemark lateness  --source NAME [-c tidemark.yaml] [--since 30d] [--until T] [--target 99.9%] [--timeout 10m] [--json]
//	tidemark grants    [-c tidemark.yaml] [--migration-role R] [--runtime-role R] [--poll-role R] [--cdc-role R]
//	tidemark demo      [-v] [--serve] [--citus]
//	tidemark version
//
// Exit codes: 0 success, 1 failure, 2 bad usage or configuration.
// docs/commands.md documents every command and flag.
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
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	// The zone database, for hosts and images that have none: aggregate
	// calendars and poll time zones name IANA zones.
	_ "time/tzdata"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/cmd/tidemark/demo"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/mirror"
	"github.com/tidemark-dev/tidemark/reconcile"
	"github.com/tidemark-dev/tidemark/service"
	"github.com/tidemark-dev/tidemark/status"
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

// shutdownLimit bounds how long `run` takes to stop after SIGTERM or
// SIGINT. Every step of a shutdown has a bound of its own (about 40s in
// all); if they do not add up, a bug is holding the process, which then
// logs every goroutine's stack, for the report, and exits with status 1.
// The exactly-once bookkeeping makes that as safe as a SIGKILL.
var shutdownLimit = 60 * time.Second

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

const usage = `tidemark: load Kafka events and PostgreSQL tables into a PostgreSQL warehouse.

Usage:
  tidemark run       [-c FILE] [--only COMPONENTS]        run the service until SIGINT/SIGTERM
  tidemark migrate   [-c FILE]                            apply the warehouse schema migrations
  tidemark reconcile --once [-c FILE] [--aggregate NAME]  reconcile aggregates once (for cron)
  tidemark backfill  --aggregate NAME --from D --to D [-c FILE] [--chunk 1d] [--concurrency N]
                     [--reprocess missing|failed|completed] [--dry-run] [--shadow | --publish] [--force]
                                                          rebuild a range of partitions in chunks
  tidemark verify    --aggregate NAME [-c FILE] [--from D --to D]
                                                          compare partitions with a rebuild; exit 1 on drift
  tidemark refresh   --aggregate NAME --full [-c FILE] [--chunk 1d] [--concurrency N] [--dry-run]
                                                          rebuild every partition of the raw table
  tidemark poll      --once --source NAME [-c FILE] [--upper T] [--lookback D]
                                                          load one timestamp-watermark window
  tidemark keys      --source NAME [-c FILE] [--dry-run] [--force]
                                                          find rows deleted at the source (key reconciliation)
  tidemark prune     [-c FILE] [--dry-run]                remove what retention no longer keeps
  tidemark forget    --aggregate NAME [-c FILE] [--dry-run]
                                                          remove the state of an aggregate no longer configured
  tidemark dead-letters list [-c FILE] [--source NAME]    count dead letters by source and reason
  tidemark dead-letters replay --source NAME [-c FILE] [--reason R] [--since T] [--dry-run]
                                                          load the dead letters that decode with the configuration now
  tidemark status    [-c FILE] [--json]                   offsets, lag, watermarks, partitions
  tidemark check     [-c FILE] [--source NAME]            check CDC sources and their slots' failover; exit 1 on a problem
  tidemark lateness  --source NAME [-c FILE] [--since 30d] [--until T] [--target 99.9%] [--timeout 10m] [--json]
                                                          how late events arrive; the horizon that keeps a target share
  tidemark grants    [-c FILE] [--migration-role R] [--runtime-role R] [--poll-role R] [--cdc-role R]
                                                          print the SQL of least-privilege database roles
  tidemark demo      [-v] [--serve] [--citus]             run a self-contained demonstration
  tidemark version                                        print the version

The configuration file defaults to $TIDEMARK_CONFIG, then tidemark.yaml.
Exit codes: 0 success, 1 failure, 2 bad usage or configuration.
`

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

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("run", stderr)
	only := fs.String("only", "", "comma-separated components to run (available: "+strings.Join(service.Components, ", ")+"); default all")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	var comps []string
	if *only != "" {
		for _, c := range strings.Split(*only, ",") {
			c = strings.TrimSpace(c)
			if !slices.Contains(service.Components, c) {
				fmt.Fprintf(stderr, "tidemark run: --only: unknown component %q (available: %s)\n", c, strings.Join(service.Components, ", "))
				return exitUsage
			}
			comps = append(comps, c)
		}
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	log := logger(cfg, stderr)
	err := preflightRun(ctx, cfg, comps, log)
	if ctx.Err() != nil {
		// SIGTERM or SIGINT before the service started: nothing was
		// running, and a check it cut short is no failure.
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "tidemark run: %v\n", err)
		return exitFailure
	}
	finished := make(chan struct{})
	defer close(finished)
	go exitIfShutdownHangs(ctx, finished, log, stderr)
	if err := service.Run(ctx, cfg, service.Options{Logger: log, Only: comps, Now: serviceClock}); err != nil {
		log.Error("tidemark stopped with an error", "err", grants.Explain(err))
		return exitFailure
	}
	return exitOK
}

// exitIfShutdownHangs ends the process shutdownLimit after ctx is
// cancelled (by a signal) unless finished is closed first.
func exitIfShutdownHangs(ctx context.Context, finished <-chan struct{}, log *slog.Logger, stderr io.Writer) {
	select {
	case <-finished:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(shutdownLimit)
	defer t.Stop()
	select {
	case <-finished:
	case <-t.C:
		log.Error("shutdown did not finish in time; exiting without waiting further (the goroutines follow)", "limit", shutdownLimit)
		_ = pprof.Lookup("goroutine").WriteTo(stderr, 2)
		os.Exit(exitFailure)
	}
}

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

func cmdReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("reconcile", stderr)
	once := fs.Bool("once", false, "run once for each aggregate (or --aggregate), waiting for any other instance, then exit")
	only := fs.String("aggregate", "", "reconcile only this aggregate")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if !*once {
		fmt.Fprintln(stderr, "tidemark reconcile: --once is required; the periodic reconciler runs inside `tidemark run`")
		return exitUsage
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	names := cfg.AggregateNames()
	if *only != "" {
		if cfg.Aggregates[*only] == nil {
			fmt.Fprintf(stderr, "tidemark reconcile: --aggregate: no aggregate named %q%s\n", *only, configured("aggregates", names))
			return exitUsage
		}
		names = []string{*only}
	}
	if len(names) == 0 {
		fmt.Fprintln(stderr, "tidemark reconcile: no aggregates configured")
		return exitUsage
	}
	log := logger(cfg, stderr)
	if cfg.Warehouse.Migrate {
		if _, err := migrate.Up(ctx, cfg.Warehouse.DSN, log); err != nil {
			fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
			return exitFailure
		}
	}
	pool, err := service.Pool(ctx, cfg, "tidemark-reconcile")
	if err != nil {
		fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
		return exitFailure
	}
	defer pool.Close()
	if err := migrate.Check(ctx, pool); err != nil {
		fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
		return exitFailure
	}
	if err := checkGrants(ctx, pool, cfg, nil, log); err != nil {
		fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
		return exitFailure
	}
	r, err := reconcile.New(cfg, pool, reconcile.Options{Logger: log, Now: serviceClock})
	if err != nil {
		fmt.Fprintf(stderr, "tidemark reconcile: %v\n", err)
		return exitFailure
	}
	code := exitOK
	for _, name := range names {
		rep, err := r.RunOnce(ctx, name, true)
		if err != nil {
			return failed(stderr, "tidemark reconcile", err)
		}
		wm := rep.Watermark
		if wm == "" || strings.HasPrefix(wm, "0001-01-01") {
			wm = "- (nothing read yet)"
		}
		fmt.Fprintf(stdout, "%s: read %d, queued %d, rebuilt %d%s, %d still queued, load watermark %s\n",
			name, rep.Read, rep.Queued, len(rep.Rebuilt), listed(rep.Rebuilt), rep.Remaining, wm)
		if len(rep.Failed) > 0 {
			fmt.Fprintf(stderr, "tidemark reconcile: %s: rebuilding %s failed; they stay queued (see tidemark.pending_partitions.last_error)\n",
				name, strings.Join(rep.Failed, ", "))
			code = exitFailure
		}
	}
	return code
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

// keySources lists the sources whose mirrors key reconciliation checks.
func keySources(cfg *config.Config) []string {
	var names []string
	for _, n := range cfg.SourceNames() {
		if s := cfg.Sources[n]; s.Kind() == config.KindPoll || s.Kind() == config.KindCDC {
			names = append(names, n)
		}
	}
	return names
}

// pollSources lists the configured poll sources.
func pollSources(cfg *config.Config) []string {
	var names []string
	for _, n := range cfg.SourceNames() {
		if cfg.Sources[n].Kind() == config.KindPoll {
			names = append(names, n)
		}
	}
	return names
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

func cmdPoll(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("poll", stderr)
	once := fs.Bool("once", false, "load one window and exit")
	name := fs.String("source", "", "the poll source to load")
	upperFlag := fs.String("upper", "", "upper bound of the window (default: now() - safety_lag on the source's clock)")
	lookbackFlag := fs.String("lookback", "", "re-read this much before the watermark (default: poll.lookback)")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if !*once {
		fmt.Fprintln(stderr, "tidemark poll: --once is required; periodic polling runs inside `tidemark run`")
		return exitUsage
	}
	var run poll.Window
	if *upperFlag != "" {
		t, err := parseUpper(*upperFlag)
		if err != nil {
			fmt.Fprintf(stderr, "tidemark poll: --upper: %v\n", err)
			return exitUsage
		}
		run.Upper = t
	}
	if *lookbackFlag != "" {
		d, err := config.ParseDuration(*lookbackFlag)
		if err != nil || d < 0 {
			fmt.Fprintf(stderr, "tidemark poll: --lookback: invalid duration %q (use e.g. 30m, 2h)\n", *lookbackFlag)
			return exitUsage
		}
		run.Lookback = &d
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	names := pollSources(cfg)
	if *name == "" || cfg.Sources[*name].Kind() != config.KindPoll {
		fmt.Fprintf(stderr, "tidemark poll: --source: %q is not a poll source%s\n", *name, configured("poll sources", names))
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, "tidemark poll", stderr, *name)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	// A first load shows its progress: a bar on a terminal, plain lines
	// elsewhere; the log goes through the display around the bar.
	disp := progress.Command(stderr, progressEvery)
	p, err := poll.New(cfg, *name, pool, poll.Options{Logger: logger(cfg, disp.Writer()), Now: serviceClock, Progress: disp})
	if err != nil {
		fmt.Fprintf(stderr, "tidemark poll: %v\n", err)
		return exitFailure
	}
	defer p.Close()
	rep, err := p.RunOnce(ctx, run)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark poll: %v\n", grants.Explain(err))
		if errors.Is(err, poll.ErrSource) || errors.Is(err, mirror.ErrSource) || errors.Is(err, mirror.ErrMirror) {
			return exitUsage
		}
		return exitFailure
	}
	low, wm := "-infinity", "- (nothing loaded yet)"
	if !rep.Low.IsZero() {
		low = rep.Low.UTC().Format(time.RFC3339Nano)
	}
	if !rep.Watermark.IsZero() {
		wm = rep.Watermark.UTC().Format(time.RFC3339Nano)
	}
	more := ""
	if rep.More {
		more = "; stopped at poll.max_rows_per_run, more rows wait"
	}
	fmt.Fprintf(stdout, "%s: window (%s, %s]: read %d, merged %d (%d inserted, %d updated, %d deleted), watermark %s%s\n",
		*name, low, rep.Upper.UTC().Format(time.RFC3339Nano), rep.Read, rep.Merged, rep.Inserted, rep.Updated, rep.Deleted, wm, more)
	return exitOK
}

func cmdKeys(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, path := flags("keys", stderr)
	name := fs.String("source", "", "the poll, CDC or Debezium source whose mirrors to check")
	dryRun := fs.Bool("dry-run", false, "report only; exit 1 when rows are missing at the source")
	force := fs.Bool("force", false, "apply even when more rows are missing at the source than mirror.key_reconcile_max_delete allows (this run only); "+
		"with --dry-run, list everything such a run would apply")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	if src := cfg.Sources[*name]; src.Kind() == config.KindCDC {
		if *force {
			fmt.Fprintf(stderr, "tidemark keys: --force applies to poll sources; key reconciliation never changes the mirrors of CDC source %s\n", *name)
			return exitUsage
		}
		return keysCDC(ctx, cfg, *name, *dryRun, stdout, stderr)
	}
	if src := cfg.Sources[*name]; src.Kind() == config.KindDebezium {
		if *force {
			fmt.Fprintf(stderr, "tidemark keys: --force applies to poll sources; key reconciliation never changes the mirror of Debezium source %s\n", *name)
			return exitUsage
		}
		return keysDebezium(ctx, cfg, *name, *dryRun, stdout, stderr)
	}
	if *name == "" || cfg.Sources[*name].Kind() != config.KindPoll {
		fmt.Fprintf(stderr, "tidemark keys: --source: %q is not a poll or CDC source%s\n", *name, configured("poll or CDC sources", keySources(cfg)))
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, "tidemark keys", stderr, *name)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	// A bar on a terminal, plain lines elsewhere; the log goes through the
	// display around the bar.
	disp := progress.Command(stderr, progressEvery)
	log := logger(cfg, disp.Writer())
	t, err := mirror.FromConfig(cfg.Sources[*name])
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	}
	if *dryRun {
		// A dry run changes nothing, not even the mirror's shape: the
		// mirror must exist already.
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Target.Sanitize()).Scan(&exists); err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			return exitFailure
		}
		if !exists {
			fmt.Fprintf(stderr, "tidemark keys: the mirror %s does not exist yet; run `tidemark poll --once --source %s` first\n", t.Target.Sanitize(), *name)
			return exitFailure
		}
	} else {
		// Preparing the poller checks the source table and creates or
		// extends the mirror, as `tidemark run` does.
		p, err := poll.New(cfg, *name, pool, poll.Options{Logger: log, Now: serviceClock})
		if err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			return exitFailure
		}
		defer p.Close()
		if err := p.Prepare(ctx); err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			if errors.Is(err, poll.ErrSource) || errors.Is(err, mirror.ErrSource) || errors.Is(err, mirror.ErrMirror) {
				return exitUsage
			}
			return exitFailure
		}
		t = p.Mirror()
	}
	k, err := mirror.NewKeyReconciler(t, cfg.Sources[*name].Poll.DSN, pool, mirror.KeyOptions{Logger: log, Now: serviceClock,
		MaxDelete: cfg.Sources[*name].Mirror.KeyReconcileMaxDelete, Progress: disp})
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	}
	runKeys := k.Run
	if *force {
		runKeys = k.RunForced
	}
	rep, err := runKeys(ctx, *dryRun)
	if errors.Is(err, mirror.ErrKeyRefused) {
		printKeyReport(stdout, *name, rep)
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		fmt.Fprintf(stderr, "tidemark keys: check the source table %s first; if these rows were deleted on purpose, apply them with "+
			"`tidemark keys --source %s --force` (this run only), or raise mirror.key_reconcile_max_delete of source %s\n",
			t.Source.Sanitize(), *name, *name)
		return exitFailure
	}
	if err != nil {
		return failed(stderr, "tidemark keys", err)
	}
	printKeyReport(stdout, *name, rep)
	if rep.DryRun && rep.Deleted > 0 {
		return exitFailure
	}
	return exitOK
}

// printKeyReport prints a key reconciliation's result, and a line about
// mirror.key_reconcile_max_delete when the run found more rows missing
// than it allows.
func printKeyReport(stdout io.Writer, label string, rep mirror.KeyReport) {
	action := map[bool]string{false: "flagged", true: "removed"}[rep.Hard]
	switch {
	case rep.DryRun:
		action = "dry run, nothing changed"
	case rep.Refused:
		action = "refused, nothing changed"
	default:
		action = fmt.Sprintf("%d %s", rep.Applied, action)
	}
	missing := fmt.Sprint(rep.Deleted)
	if rep.DeletedAtLeast {
		missing = "at least " + missing
	}
	fmt.Fprintf(stdout, "%s: %d source keys, %d mirror keys; compared %d ranges, transferred %d keys\n",
		label, rep.SourceKeys, rep.MirrorKeys, rep.RangesCompared, rep.KeysTransferred)
	fmt.Fprintf(stdout, "%s: %s missing at the source (%s)%s; %d not yet in the mirror\n",
		label, missing, action, listed(rep.MissingAtSource), rep.MissingInMirror)
	if !rep.OverLimit() {
		return
	}
	limit := fmt.Sprintf("mirror.key_reconcile_max_delete (%s) allows %d of %d mirror rows, %s are missing (%s)",
		rep.MaxDelete, rep.Allowed, rep.MirrorKeys, missing, rep.Share())
	switch {
	case rep.Forced && rep.DryRun:
		fmt.Fprintf(stdout, "%s: %s; a run with --force would apply them\n", label, limit)
	case rep.Forced:
		fmt.Fprintf(stdout, "%s: %s; applied with --force\n", label, limit)
	case rep.DryRun:
		fmt.Fprintf(stdout, "%s: %s; a run would be refused (--force applies anyway)\n", label, limit)
	default:
		fmt.Fprintf(stdout, "%s: %s; refused (--force applies anyway)\n", label, limit)
	}
}

// keysCDC checks the mirrors of a CDC source for drift: a dry run of key
// reconciliation over each of its tables. Deletes reach those mirrors
// through the slot, so nothing is applied here.
func keysCDC(ctx context.Context, cfg *config.Config, name string, dryRun bool, stdout, stderr io.Writer) int {
	if !dryRun {
		fmt.Fprintf(stderr, "tidemark keys: --source %s is a CDC source: its deletes arrive through the replication slot; "+
			"add --dry-run to check its mirrors for drift\n", name)
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, "tidemark keys", stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	mirrors, err := cdc.Mirrors(ctx, cfg, name)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return exitFailure
	}
	// One bar (or series of lines) per mirror, as for a poll source.
	disp := progress.Command(stderr, progressEvery)
	log := logger(cfg, disp.Writer())
	code := exitOK
	for _, t := range mirrors {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Target.Sanitize()).Scan(&exists); err != nil {
			fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
			return exitFailure
		}
		if !exists {
			fmt.Fprintf(stderr, "tidemark keys: the mirror %s does not exist yet; it is created when the CDC reader of %s starts\n", t.Target.Sanitize(), name)
			return exitFailure
		}
		drift, ok := checkMirrorKeys(ctx, t, cfg.Sources[name].CDC.DSN, pool, mirror.KeyOptions{Logger: log, Now: serviceClock, Progress: disp},
			name, stdout, stderr)
		if !ok {
			return exitFailure
		}
		if drift {
			code = exitFailure
		}
	}
	return code
}

// checkMirrorKeys compares the keys of mirror t with its source at dsn
// without changing anything and prints the report. drift says that the
// mirror holds keys the source does not; ok is false, the error printed,
// when the check could not run.
func checkMirrorKeys(ctx context.Context, t *mirror.Table, dsn string, pool *pgxpool.Pool, opts mirror.KeyOptions,
	name string, stdout, stderr io.Writer) (drift, ok bool) {
	k, err := mirror.NewKeyReconciler(t, dsn, pool, opts)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %v\n", err)
		return false, false
	}
	rep, err := k.Run(ctx, true)
	if err != nil {
		fmt.Fprintf(stderr, "tidemark keys: %s: %v\n", t.Source.Sanitize(), grants.Explain(err))
		return false, false
	}
	printKeyReport(stdout, name+" "+t.Source[0]+"."+t.Source[1], rep)
	return rep.Deleted > 0, true
}
