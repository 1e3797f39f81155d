package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
)

// deadLetterFlags are the flags of `tidemark dead-letters`, shared by its
// subcommands.
type deadLetterFlags struct {
	path, source, reason, since *string
	dryRun                      *bool
}

// cmdDeadLetters lists the stored dead letters (list) or loads those that
// decode with the current configuration (replay).
func cmdDeadLetters(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark dead-letters"
	fs, path := flags("dead-letters", stderr)
	f := deadLetterFlags{
		path:   path,
		source: fs.String("source", "", "the source (list: all sources when empty; replay: required, a Kafka source)"),
		reason: fs.String("reason", "", "replay: only dead letters stored with this reason"),
		since:  fs.String("since", "", "replay: only dead letters that arrived since this RFC 3339 time, or this long ago (e.g. 7d)"),
		dryRun: fs.Bool("dry-run", false, "replay: report what would load and write nothing"),
	}
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	switch sub {
	case "list":
		for _, name := range []string{"reason", "since", "dry-run"} {
			if isSet(fs, name) {
				fmt.Fprintf(stderr, "%s list: --%s applies to replay only\n", app, name)
				return exitUsage
			}
		}
		return deadLettersList(ctx, f, stdout, stderr)
	case "replay":
		return deadLettersReplay(ctx, f, stdout, stderr)
	case "":
		fmt.Fprintf(stderr, "%s: a subcommand is required, before the flags: list or replay\n", app)
	default:
		fmt.Fprintf(stderr, "%s: unknown subcommand %q: list or replay\n", app, sub)
	}
	return exitUsage
}

// isSet reports whether the flag name of fs was given.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// deadLettersList prints the dead letters' counts by source and reason.
func deadLettersList(ctx context.Context, f deadLetterFlags, stdout, stderr io.Writer) int {
	const app = "tidemark dead-letters list"
	cfg, ok := load(*f.path, stderr)
	if !ok {
		return exitUsage
	}
	if *f.source != "" && cfg.Sources[*f.source] == nil {
		fmt.Fprintf(stderr, "%s: --source: %q is not a configured source%s\n", app, *f.source, configured("sources", cfg.SourceNames()))
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	counts, err := kafka.ListDeadLetters(ctx, pool, *f.source)
	if err != nil {
		return failed(stderr, app, err)
	}
	if len(counts) == 0 {
		fmt.Fprintln(stdout, "no dead letters")
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "source\treason\tnot replayed\treplayed\toldest\tnewest")
	for _, c := range counts {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", c.Source, c.Reason, c.NotReplayed, c.Replayed,
			c.Oldest.UTC().Format(time.RFC3339), c.Newest.UTC().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return failed(stderr, app, err)
	}
	return exitOK
}

// deadLettersReplay loads the dead letters of a Kafka source that now
// decode, and prints a summary.
func deadLettersReplay(ctx context.Context, f deadLetterFlags, stdout, stderr io.Writer) int {
	const app = "tidemark dead-letters replay"
	cfg, ok := load(*f.path, stderr)
	if !ok {
		return exitUsage
	}
	opts, msg := replayOptions(cfg, f)
	if msg != "" {
		fmt.Fprintf(stderr, "%s: %s\n", app, msg)
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return failed(stderr, app, err)
	}
	defer conn.Release()
	opts.Logger = logger(cfg, stderr)
	rep, err := kafka.Replay(ctx, conn.Conn(), kafka.ConfigFrom(cfg), opts)
	if errors.Is(err, decode.ErrRegistryUnavailable) {
		return replayRegistryDown(stdout, stderr, cfg.SchemaRegistry.URL, opts.Source, rep, err)
	}
	printReplay(stdout, rep)
	if err != nil {
		return failed(stderr, app, err)
	}
	return exitOK
}

// replayRegistryDown reports a replay that stopped because the schema
// registry did not answer (err wraps decode.ErrRegistryUnavailable): why,
// what the chunks before the outage did, if anything, and that the other
// dead letters are unchanged. It returns exitFailure.
func replayRegistryDown(stdout, stderr io.Writer, url, source string, rep kafka.ReplayReport, err error) int {
	const app = "tidemark dead-letters replay"
	state := "is unavailable"
	if errors.Is(err, decode.ErrRegistryCredentials) {
		state = "refused the credentials"
	}
	why := err.Error()
	if _, after, ok := strings.Cut(why, decode.ErrRegistryUnavailable.Error()+": "); ok {
		why = after
	}
	fmt.Fprintf(stderr, "%s: the schema registry at %s %s: %s\n", app, url, state, why)
	switch {
	case rep.Read == 0:
		fmt.Fprintf(stderr, "%s: nothing was changed: the dead letters of %s stay as they were; replay again once the registry answers\n", app, source)
	case rep.DryRun:
		printReplay(stdout, rep)
		fmt.Fprintf(stderr, "%s: the counts above are of the %d dead letters read before the registry stopped answering (dry run: nothing written); replay again once it answers\n", app, rep.Read)
	default:
		printReplay(stdout, rep)
		fmt.Fprintf(stderr, "%s: the counts above are of the %d dead letters replayed before the registry stopped answering; the others are unchanged: replay again once it answers\n", app, rep.Read)
	}
	return exitFailure
}

// replayOptions checks the replay flags against the configuration: it
// returns the options, or a message naming the flag that is wrong.
func replayOptions(cfg *config.Config, f deadLetterFlags) (kafka.ReplayOptions, string) {
	opts := kafka.ReplayOptions{Source: *f.source, Reason: *f.reason, DryRun: *f.dryRun, Now: serviceClock}
	var kafkaSources []string
	for _, name := range cfg.SourceNames() {
		if cfg.Sources[name].Kind().Kafka() {
			kafkaSources = append(kafkaSources, name)
		}
	}
	switch {
	case opts.Source == "":
		return opts, "--source is required"
	case !cfg.Sources[opts.Source].Kind().Kafka():
		return opts, fmt.Sprintf("--source: %q is not a Kafka source%s", opts.Source, configured("Kafka sources", kafkaSources))
	case opts.Reason != "" && !slices.Contains(decode.Reasons, opts.Reason):
		return opts, fmt.Sprintf("--reason: %q is not a dead-letter reason (%s)", opts.Reason, strings.Join(decode.Reasons, ", "))
	}
	if *f.since != "" {
		since, err := parseSince(*f.since, serviceClock())
		if err != nil {
			return opts, "--since: " + err.Error()
		}
		opts.Since = since
	}
	return opts, ""
}

// parseSince reads --since: a time with a zone offset, or a positive
// duration back from now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := parseUpper(s); err == nil {
		return t, nil
	}
	if d, err := config.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (e.g. 2026-10-05T10:00:00Z) nor a positive duration (e.g. 7d, 12h)", s)
}

// printReplay prints what a replay did, or would do, at a glance.
func printReplay(w io.Writer, rep kafka.ReplayReport) {
	verb, note := "loaded", ""
	if rep.DryRun {
		verb, note = "would load", " (dry run: nothing written)"
	}
	fmt.Fprintf(w, "%s: read %d dead letters not yet replayed%s\n", rep.Source, rep.Read, note)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	loaded := fmt.Sprintf("  %s\t%d", verb, rep.Loaded)
	if rep.Loaded > 0 {
		loaded += fmt.Sprintf("\tevent times %s to %s", rep.First.UTC().Format(time.RFC3339), rep.Last.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(tw, loaded)
	fmt.Fprintf(tw, "  already stored\t%d\n", rep.AlreadyStored)
	failing, reasons := 0, make([]string, 0, len(rep.Failing))
	for reason, n := range rep.Failing {
		failing += n
		reasons = append(reasons, fmt.Sprintf("%s %d", reason, n))
	}
	sort.Strings(reasons)
	fmt.Fprintf(tw, "  still failing\t%d\t%s\n", failing, strings.Join(reasons, ", "))
	_ = tw.Flush()
}
