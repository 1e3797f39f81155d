package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/status"
)

// TestResyncCommand: tidemark resync asks for a resync of a CDC table
// once while one is under way, says so for a dry run, and refuses a
// source or table the configuration does not name, and --wait with
// --dry-run; --wait, with no reader to copy the table, waits until it is
// interrupted and says so. (The copy itself is cdc's TestResync; the
// wait for a copy, TestResyncWait.)
func TestResyncCommand(t *testing.T) {
	_, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	cfg := cdcConfig(t, whDSN, srcDSN)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no source", []string{"resync", "-c", cfg}, exitUsage, "name the source"},
		{"not a CDC source", []string{"resync", "nope", "-c", cfg}, exitUsage, `"nope" is not a CDC source (configured: shop)`},
		{"a table not configured", []string{"resync", "shop", "items", "-c", cfg}, exitUsage, "sources.shop.cdc.tables does not name public.items (it names: public.orders)"},
		{"wait for a dry run", []string{"resync", "shop", "--dry-run", "--wait", "-c", cfg}, exitUsage, "--wait follows the resyncs asked for, which --dry-run does not ask for"},
		{"dry run", []string{"resync", "shop", "--dry-run", "-c", cfg}, exitOK, "would resync shop public.orders (never resynced)"},
		{"request", []string{"resync", "-c", cfg, "shop"}, exitOK, "shop public.orders asked for (generation 1)"},
		{"again", []string{"resync", "shop", "orders", "-c", cfg}, exitOK, "shop public.orders is being resynced already (pending, 0 chunks, 0 rows copied)"},
		{"dry run under way", []string{"resync", "shop", "--dry-run", "-c", cfg}, exitOK, "a resync is pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := invoke(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Errorf("exit %d, want %d with %q:\n%s%s", code, tc.code, tc.want, out, errOut)
			}
		})
	}
	var n int64
	if err := wh.QueryRow(t.Context(), `SELECT count(*) FROM tidemark.cdc_resyncs WHERE source = 'shop' AND state = 'pending'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d pending resyncs (%v), want 1", n, err)
	}

	// No reader streams shop: --wait waits until it is interrupted.
	t.Setenv(progress.Env, "lines")
	defer func(old time.Duration) { resyncPollEvery = old }(resyncPollEvery)
	resyncPollEvery = 5 * time.Millisecond
	ctx, interrupt := context.WithCancel(t.Context())
	defer interrupt()
	var out, errOut syncbuf.Buffer
	code := make(chan int, 1)
	go func() { code <- run(ctx, []string{"resync", "shop", "--wait", "-c", cfg}, &out, &errOut) }()
	waitfor.Until(t, "the wait to say it waits for the reader", func() bool {
		return strings.Contains(errOut.String(), `msg="resync waits for the reader streaming the source to copy it" source=shop table=public.orders`)
	})
	interrupt()
	if c := <-code; c != exitFailure || !strings.Contains(errOut.String(), "tidemark resync: interrupted while waiting for public.orders; the reader goes on with them") {
		t.Errorf("an interrupted wait: exit %d, want %d:\n%s%s", c, exitFailure, out.String(), errOut.String())
	}
}

// resyncWaitEnv is a source with an orders table of resyncWaitRows
// analysed rows, and `tidemark run --only cdc` streaming it into a
// warehouse.
type resyncWaitEnv struct {
	t   *testing.T
	wh  *pgxpool.Pool
	cfg string
}

const resyncWaitRows = 5000

func newResyncWaitEnv(t *testing.T) *resyncWaitEnv {
	t.Helper()
	src, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	if _, err := src.Exec(t.Context(), fmt.Sprintf(`CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL);
		INSERT INTO orders SELECT i, i FROM generate_series(1, %d) AS i; ANALYZE orders`, resyncWaitRows)); err != nil {
		t.Fatal(err)
	}
	e := &resyncWaitEnv{t: t, wh: wh, cfg: writeFile(t, "resync.yaml", fmt.Sprintf(`warehouse: {dsn: %q}
http: {listen: "off"}
sources:
  shop:
    cdc: {dsn: %q, tables: [orders], snapshot: initial, status_every: 200ms, snapshot_chunk_rows: 1000, resync_chunk_rows: 1000}
    mirror: {table: dw_orders}
`, whDSN, srcDSN))}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var log syncbuf.Buffer
	go func() { done <- run(ctx, []string{"run", "--only", "cdc", "-c", e.cfg}, io.Discard, &log) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("run exited %d:\n%s", code, log.String())
		}
	})
	waitfor.Until(t, "the initial snapshot", func() bool {
		var n int64
		return wh.QueryRow(t.Context(), `SELECT count(*) FROM tidemark.cdc_positions WHERE source = 'shop' AND snapshot = 'done'`).Scan(&n) == nil && n == 1
	})
	return e
}

// gated runs `tidemark resync shop --wait` with its standard error on
// errOut while the test holds a lock on the mirror, which holds back the
// resync's first chunk; while it is held, it calls during (the resync is
// copying, nothing applied yet), and releases the lock once errOut
// matches shown. It returns the exit code and standard output.
func (e *resyncWaitEnv) gated(errOut io.Writer, errText func() string, shown *regexp.Regexp, during func()) (int, string) {
	e.t.Helper()
	ctx := e.t.Context()
	hold, err := e.wh.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(ctx) }()
	if _, err := hold.Exec(ctx, `LOCK TABLE dw_orders IN SHARE MODE`); err != nil {
		e.t.Fatal(err)
	}
	var out syncbuf.Buffer
	code := make(chan int, 1)
	go func() { code <- run(ctx, []string{"resync", "shop", "--wait", "-c", e.cfg}, &out, errOut) }()
	if err := waitfor.Poll(waitfor.Timeout, func() bool { return shown.MatchString(errText()) }); err != nil {
		e.t.Errorf("the wait shows no %s:\n%q", shown, errText())
	}
	during()
	if err := hold.Rollback(ctx); err != nil {
		e.t.Fatal(err)
	}
	return <-code, out.String()
}

// TestResyncWait: tidemark resync --wait follows the copy until it is
// done: elsewhere than on a terminal it logs plain progress lines against
// the rows planned (the source's estimate) while the copy is under way,
// and a last one; on a terminal it draws a bar. Each time it prints the
// copy's end and exits 0. tidemark status shows the copy under way with
// its rows planned, and then done.
func TestResyncWait(t *testing.T) {
	e := newResyncWaitEnv(t)
	defer func(poll, every time.Duration) { resyncPollEvery, progressEvery = poll, every }(resyncPollEvery, progressEvery)
	resyncPollEvery, progressEvery = 5*time.Millisecond, 5*time.Millisecond
	doneLine := regexp.MustCompile(`tidemark resync: shop public.orders done in \S+: 5000 rows copied, 0 removed\n`)

	t.Setenv(progress.Env, "")
	var errOut syncbuf.Buffer
	code, out := e.gated(&errOut, errOut.String,
		regexp.MustCompile(`msg="resync public.orders progress" done=0 total=5000 unit=rows`), func() {
			c, text, stderr := invoke(t, "status", "-c", e.cfg)
			if flat := strings.Join(strings.Fields(text), " "); c != exitOK ||
				!strings.Contains(flat, "resync public.orders copying: 0 of about 5000 rows (0.0%), 0 chunks, since ") {
				t.Errorf("status during the copy: exit %d\n%s%s", c, text, stderr)
			}
			c, text, stderr = invoke(t, "status", "--json", "-c", e.cfg)
			var rep status.Report
			if c != exitOK || json.Unmarshal([]byte(text), &rep) != nil {
				t.Fatalf("status --json: exit %d\n%s%s", c, text, stderr)
			}
			if r := rep.Sources[0].CDC.Resyncs; len(r) != 1 || r[0].State != "copying" || r[0].RowsPlanned == nil || *r[0].RowsPlanned != resyncWaitRows {
				t.Errorf("status --json during the copy: %+v", r)
			}
		})
	if code != exitOK || !doneLine.MatchString(out) ||
		!regexp.MustCompile(`msg="resync public.orders progress" done=5000 total=5000 unit=rows .* finished=true`).MatchString(errOut.String()) {
		t.Errorf("resync --wait, not on a terminal: exit %d\n%s%s", code, out, errOut.String())
	}
	if strings.Contains(errOut.String(), "\r") {
		t.Errorf("resync --wait, not on a terminal, wrote a carriage return:\n%q", errOut.String())
	}
	c, text, _ := invoke(t, "status", "-c", e.cfg)
	if flat := strings.Join(strings.Fields(text), " "); c != exitOK || !strings.Contains(flat, "last resync public.orders done ") ||
		!strings.Contains(flat, ": 5000 rows copied in ") {
		t.Errorf("status after the copy: exit %d\n%s", c, text)
	}

	// On a terminal, a bar.
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
	code, out = e.gated(tty, screen.String, regexp.MustCompile(`resync public.orders +0% \|[^|]*\| \(0/5000, `), func() {})
	if code != exitOK || !doneLine.MatchString(out) {
		t.Errorf("resync --wait on a terminal: exit %d\n%s", code, out)
	}
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		return regexp.MustCompile(`resync public.orders 100% \|[^|]*\| \(5000/5000, `).MatchString(screen.String())
	}); err != nil {
		t.Errorf("the terminal shows no full bar:\n%q", screen.String())
	}
}
