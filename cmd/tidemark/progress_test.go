package main

import (
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestProgressOutput runs `tidemark poll --once` (a first load),
// `backfill` and `keys` with their standard error on a pseudo-terminal,
// where each draws a bar with its count, a rate and the time left, and
// their log lines land between bars; then `backfill` and `keys` with it
// in a buffer, as under a service manager or in a pipe, where they log
// plain progress lines every interval and at the end, and write no
// terminal control characters.
func TestProgressOutput(t *testing.T) {
	t.Setenv(progress.Env, "")
	defer func(old time.Duration) { progressEvery = old }(progressEvery)
	progressEvery = 2 * time.Millisecond
	ctx := context.Background()
	cfgPath, src, wh := pollSetup(t, 3000)
	if _, err := src.Exec(ctx, "ANALYZE src_customers"); err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "progress.yaml", string(base)+`aggregates:
  daily_changes:
    source: customers
    table: daily_changes
    partition: {by: day, column: day}
    sql: |
      SELECT {{partition}} AS day, count(*)::int AS changes FROM {{events}} GROUP BY 1
`)

	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	var screen syncbuf.Buffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(&screen, ptmx)
	}()
	defer func() {
		tty.Close()
		ptmx.Close()
		<-copied
	}()
	onTerminal := func(want *regexp.Regexp, args ...string) {
		t.Helper()
		var out strings.Builder
		if code := run(ctx, append(args, "-c", cfg), &out, tty); code != exitOK {
			t.Fatalf("%v: exit %d\n%s\nterminal: %q", args, code, out.String(), screen.String())
		}
		if waitfor.Poll(waitfor.Timeout, func() bool { return want.MatchString(screen.String()) }) != nil {
			t.Fatalf("%v: the terminal shows no %s:\n%q", args, want, screen.String())
		}
	}
	// A bar part way, with count/total, rate and [elapsed:left].
	onTerminal(regexp.MustCompile(`poll first load +\d+% \|[^|]*\| \([12]000/3000, \d+ rows/(s|min|hr)\) \[\d\S*:\d\S*\]`),
		"poll", "--once", "--source", "customers", "--upper", "2026-10-06T00:00:00Z")
	onTerminal(regexp.MustCompile(`poll first load 100% \|[^|]*\| \(3000/3000, `), "poll", "--once", "--source", "customers", "--upper", "2026-10-06T00:00:00Z")
	onTerminal(regexp.MustCompile(`backfill +\d+% \|[^|]*\| \([1-9]/10, \d+ chunks/(s|min|hr)\) \[\d\S*:\d\S*\]`),
		"backfill", "--aggregate", "daily_changes", "--from", "2026-10-01", "--to", "2026-10-10")
	onTerminal(regexp.MustCompile(`backfill 100% \|[^|]*\| \(10/10, `), "backfill", "--aggregate", "daily_changes", "--from", "2026-10-01", "--to", "2026-10-10")
	// The command's log lines are whole lines, not drawn over by the bar.
	onTerminal(regexp.MustCompile(`\ntime=\S+ level=INFO msg="backfill started" [^\r\n]*\r?\n`), "backfill", "--aggregate", "daily_changes", "--from", "2026-10-01", "--to", "2026-10-10")
	onTerminal(regexp.MustCompile(`keys +\d+% \|[^|]*\| \(\d+/\d+, \d+ ranges/(s|min|hr)\) \[\d\S*:\d\S*\]`), "keys", "--source", "customers", "--dry-run")

	// Not a terminal: plain lines, every progressEvery and at the end.
	// The fifth write of a backfill (in its third chunk or later) waits
	// for an advisory lock the test holds until a periodic line has come,
	// however late the interval fires on a busy machine.
	if _, err := wh.Exec(ctx, `CREATE SEQUENCE slow_writes;
		CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			IF nextval('slow_writes') = 5 THEN PERFORM pg_advisory_lock_shared(4242); PERFORM pg_advisory_unlock_shared(4242); END IF;
			RETURN NULL; END $$;
		CREATE TRIGGER slow BEFORE INSERT OR DELETE ON daily_changes FOR EACH STATEMENT EXECUTE FUNCTION slow()`); err != nil {
		t.Fatal(err)
	}
	// gated runs a command while the lock is held, and releases it once
	// its standard error shows a line matching periodic (or after
	// waitfor.Timeout, leaving the failure to the checks of its output).
	gated := func(periodic *regexp.Regexp, args ...string) (int, string, string) {
		t.Helper()
		hold, err := wh.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Release()
		if _, err := hold.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		var errOut syncbuf.Buffer
		code := make(chan int, 1)
		go func() { code <- run(ctx, args, &out, &errOut) }()
		_ = waitfor.Poll(waitfor.Timeout, func() bool { return periodic.MatchString(errOut.String()) })
		if _, err := hold.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
			t.Error(err)
		}
		c := <-code
		return c, out.String(), errOut.String()
	}
	for _, tt := range []struct {
		args     []string
		periodic *regexp.Regexp
		final    *regexp.Regexp
		gated    bool
	}{
		{[]string{"backfill", "--aggregate", "daily_changes", "--from", "2026-10-01", "--to", "2026-10-10", "--reprocess", "completed"},
			regexp.MustCompile(`level=INFO msg="backfill progress" aggregate=daily_changes run=\d+ done=[1-9] total=10 unit=chunks rate="[0-9.]+ chunks/s" eta=\S+ elapsed=\S+\n`),
			regexp.MustCompile(`level=INFO msg="backfill progress" aggregate=daily_changes run=\d+ done=10 total=10 unit=chunks .*finished=true\n`), true},
		{[]string{"keys", "--source", "customers", "--dry-run"},
			regexp.MustCompile(`level=INFO msg="keys progress" component=keys source=customers done=\d+ total=\d+ unit=ranges rate="[0-9.]+ ranges/s" eta=\S+ elapsed=\S+\n`),
			regexp.MustCompile(`level=INFO msg="keys progress" component=keys source=customers done=(\d+) total=(\d+) unit=ranges .*finished=true\n`), false},
	} {
		var code int
		var out, errOut string
		if tt.gated {
			code, out, errOut = gated(tt.periodic, append(tt.args, "-c", cfg)...)
		} else {
			code, out, errOut = invoke(t, append(tt.args, "-c", cfg)...)
		}
		if code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", tt.args, code, out, errOut)
		}
		if !tt.periodic.MatchString(errOut) {
			t.Errorf("%v: no periodic progress line (%s) in\n%s", tt.args, tt.periodic, errOut)
		}
		if m := tt.final.FindStringSubmatch(errOut); m == nil || (len(m) == 3 && m[1] != m[2]) {
			t.Errorf("%v: no last progress line with everything done (%s) in\n%s", tt.args, tt.final, errOut)
		}
		if strings.ContainsAny(errOut, "\r\x1b") || strings.Contains(errOut, "%|") {
			t.Errorf("%v: standard error, not a terminal, holds a bar or terminal control characters: %q", tt.args, errOut)
		}
	}
}
