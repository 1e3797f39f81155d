package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/tidemark-dev/tidemark/pause"
)

// cmdPause pauses a source for every instance: its Kafka topics are not
// fetched, its CDC slot is not read, its poll runs are skipped, until
// tidemark resume.
func cmdPause(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark pause"
	fs, path := flags("pause", stderr)
	reason := fs.String("reason", "", "why the source is paused, shown with the pause")
	name, code, ok := parseSource(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	if cfg.Sources[name] == nil {
		fmt.Fprintf(stderr, "%s: no source is named %q%s\n", app, name, configured("sources", cfg.SourceNames()))
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	p, added, err := pause.Set(ctx, pool, pause.Pause{Source: name, Since: time.Now(), By: osUser(), Reason: *reason})
	if err != nil {
		return failed(stderr, app, err)
	}
	if !added {
		fmt.Fprintf(stdout, "%s: source %s is already paused (%s)\n", app, name, p)
		return exitOK
	}
	fmt.Fprintf(stdout, "%s: source %s paused (%s); every instance stops reading it within a few seconds\n", app, name, p)
	return exitOK
}

// cmdResume resumes a paused source.
func cmdResume(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const app = "tidemark resume"
	fs, path := flags("resume", stderr)
	name, code, ok := parseSource(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	cfg, ok := load(*path, stderr)
	if !ok {
		return exitUsage
	}
	pool, ok := prepareWarehouse(ctx, cfg, app, stderr)
	if !ok {
		return exitFailure
	}
	defer pool.Close()
	p, was, err := pause.Clear(ctx, pool, name)
	if err != nil {
		return failed(stderr, app, err)
	}
	if !was {
		fmt.Fprintf(stdout, "%s: source %s is not paused\n", app, name)
		return exitOK
	}
	fmt.Fprintf(stdout, "%s: source %s resumed after %s (%s)\n", app, name, time.Since(p.Since).Round(time.Second), p)
	return exitOK
}

// parseSource parses the flags of a command that takes one source name as
// its argument, before or after the flags.
func parseSource(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (string, int, bool) {
	names, code, ok := parseNames(fs, args, stdout, stderr)
	if !ok {
		return "", code, false
	}
	if len(names) > 1 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q: name one source\n", fs.Name(), names[1])
		return "", exitUsage, false
	}
	return names[0], 0, true
}

// takesValue reports whether arg is a flag of fs given without "=" that
// takes the next argument as its value.
func takesValue(fs *flag.FlagSet, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// osUser names who runs the command: the operating-system user.
func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "unknown"
}
