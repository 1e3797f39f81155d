package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// pollSetup creates a source database with src_customers holding rows
// customers stamped one second apart from 2026-10-05 09:00 UTC, and a
// configuration file polling it into an empty warehouse.
func pollSetup(t *testing.T, rows int) (cfgPath string, src, wh *pgxpool.Pool) {
	t.Helper()
	src, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := src.Exec(ctx, `CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, email text NOT NULL,
		tier text NOT NULL, updated_at timestamptz NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Exec(ctx, `INSERT INTO src_customers SELECT i, 'c' || i || '@example.com', 'free',
		timestamptz '2026-10-05 09:00+00' + i * interval '1 second' FROM generate_series(1, $1) AS i`, rows); err != nil {
		t.Fatal(err)
	}
	cfgPath = writeFile(t, "poll.yaml", fmt.Sprintf(`warehouse: {dsn: %q}
http: {listen: "off"}
sources:
  customers:
    poll: {dsn: %q, table: src_customers, key: [customer_id], updated_at: updated_at, chunk_rows: 1000}
    mirror: {table: dw_customers}
`, whDSN, srcDSN))
	return cfgPath, src, wh
}

func scalar(t *testing.T, pool *pgxpool.Pool, sql string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// TestPollOnce runs `tidemark poll --once` like the lesson's
// CALL load_customers(upper, lookback) and checks its usage errors.
func TestPollOnce(t *testing.T) {
	cfg, _, wh := pollSetup(t, 100)
	code, out, errOut := invoke(t, "poll", "--once", "-c", cfg, "--source", "customers", "--upper", "2026-10-05 09:00:50+00")
	if code != exitOK || !strings.Contains(out, "read 50, merged 50 (50 inserted, 0 updated, 0 deleted), watermark 2026-10-05T09:00:50Z") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = invoke(t, "poll", "--once", "-c", cfg, "--source", "customers", "--upper", "2026-10-05T10:00:00Z", "--lookback", "10s")
	if code != exitOK || !strings.Contains(out, "window (2026-10-05T09:00:40Z, 2026-10-05T10:00:00Z]: read 60, merged 50") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if n := scalar(t, wh, "SELECT count(*)::text FROM dw_customers"); n != "100" {
		t.Errorf("mirror rows %s, want 100", n)
	}
	code, out, errOut = invoke(t, "status", "-c", cfg)
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"source customers (poll: src_customers into dw_customers)",
		"high watermark (updated_at) 2026-10-05T09:01:40Z", "runs / rows read / rows merged 2 / 110 / 100", "last key reconciliation never"} {
		if code != exitOK || !strings.Contains(flat, want) {
			t.Errorf("status: exit %d, want %q in\n%s%s", code, want, out, errOut)
		}
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--source", "customers"}, "--once is required"},
		{[]string{"--once", "--source", "nope"}, `--source: "nope" is not a poll source (configured: customers)`},
		{[]string{"--once", "--source", "customers", "--upper", "2026-10-05 10:00"}, "--upper:"},
		{[]string{"--once", "--source", "customers", "--lookback", "soon"}, "--lookback: invalid duration"},
	}
	for _, tt := range tests {
		code, _, errOut := invoke(t, append([]string{"poll", "-c", cfg}, tt.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tt.want) {
			t.Errorf("poll %v: exit %d, stderr %q; want exit 2 and %q", tt.args, code, errOut, tt.want)
		}
	}
}

// TestPollKilledBeforeCommit is acceptance item 3 of the poll issue: a
// `tidemark poll --once` killed after reading rows but before its commit
// leaves the watermark where it was, and the next run loads the same rows
// once.
func TestPollKilledBeforeCommit(t *testing.T) {
	const rows = 30000
	ctx := context.Background()
	cfg, _, wh := pollSetup(t, rows)
	// A first run over an empty window creates the mirror and the state.
	if code, out, errOut := invoke(t, "poll", "--once", "-c", cfg, "--source", "customers", "--upper", "2026-10-05T08:00:00Z"); code != exitOK {
		t.Fatalf("first run: exit %d\n%s%s", code, out, errOut)
	}
	// An old version of customer 25000 in the mirror, locked: the next
	// run merges 24 chunks inside its transaction and then blocks on this
	// row, well after reading and before its commit.
	if _, err := wh.Exec(ctx, `INSERT INTO dw_customers VALUES (25000, 'old', 'old', '2026-10-01 00:00+00', '2026-10-01 00:00+00')`); err != nil {
		t.Fatal(err)
	}
	holder, err := wh.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, "SELECT * FROM dw_customers WHERE customer_id = 25000 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	p := startCommand(t, time.Date(2026, 10, 6, 0, 0, 0, 0, time.UTC), "poll", "--once", "-c", cfg, "--source", "customers", "--upper", "2026-10-06T00:00:00Z")
	waitfor.Until(t, "the poll run to block in its merge", func() bool {
		return scalar(t, wh, `SELECT count(*)::text FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO "public"."dw_customers"%'`) == "1"
	})
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The killed run's backend finishes its statement, finds its client
	// gone and rolls back.
	waitfor.Until(t, "the killed run's backend to end", func() bool {
		return scalar(t, wh, `SELECT count(*)::text FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'tidemark-poll'`) == "0"
	})
	wm := scalar(t, wh, "SELECT high_watermark::text FROM tidemark.poll_watermarks WHERE source = 'customers'")
	if wm != "-infinity" || scalar(t, wh, "SELECT count(*)::text FROM dw_customers") != "1" || scalar(t, wh, "SELECT count(*)::text FROM raw.customers") != "0" {
		t.Fatalf("after the kill: watermark %s, mirror %s rows, raw %s rows; want -infinity, 1 (the old row), 0", wm,
			scalar(t, wh, "SELECT count(*)::text FROM dw_customers"), scalar(t, wh, "SELECT count(*)::text FROM raw.customers"))
	}
	code, out, errOut := invoke(t, "poll", "--once", "-c", cfg, "--source", "customers", "--upper", "2026-10-06T00:00:00Z")
	if code != exitOK || !strings.Contains(out, fmt.Sprintf("read %d, merged %d", rows, rows)) {
		t.Fatalf("run after the kill: exit %d\n%s%s", code, out, errOut)
	}
	for what, sql := range map[string]string{
		"mirror rows":            "SELECT count(*)::text FROM dw_customers",
		"raw change rows":        "SELECT count(*)::text FROM raw.customers",
		"distinct changed keys":  "SELECT count(DISTINCT event_id)::text FROM raw.customers",
		"ledger rows sum":        "SELECT sum(rows)::text FROM tidemark.ingest_ledger WHERE source = 'customers'",
		"rows merged (state)":    "SELECT rows_merged::text FROM tidemark.poll_watermarks WHERE source = 'customers'",
		"rows equal to source's": "SELECT count(*)::text FROM dw_customers WHERE email = 'c' || customer_id || '@example.com'",
	} {
		if got := scalar(t, wh, sql); got != fmt.Sprint(rows) {
			t.Errorf("%s: %s, want %d", what, got, rows)
		}
	}
}

// TestKeysCommand: `tidemark keys` finds rows deleted at the source; a dry
// run reports them with exit status 1 and changes nothing.
func TestKeysCommand(t *testing.T) {
	cfg, src, wh := pollSetup(t, 100)
	if code, out, errOut := invoke(t, "poll", "--once", "-c", cfg, "--source", "customers", "--upper", "2026-10-06T00:00:00Z"); code != exitOK {
		t.Fatalf("poll: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := src.Exec(context.Background(), "DELETE FROM src_customers WHERE customer_id IN (7, 42)"); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := invoke(t, "keys", "-c", cfg, "--source", "customers", "--dry-run")
	if code != exitFailure || !strings.Contains(out, "customers: 2 missing at the source (dry run, nothing changed) (7, 42); 0 not yet in the mirror") {
		t.Errorf("keys --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if n := scalar(t, wh, "SELECT count(*)::text FROM dw_customers WHERE deleted_at IS NOT NULL"); n != "0" {
		t.Errorf("a dry run flagged %s rows", n)
	}
	code, out, errOut = invoke(t, "keys", "-c", cfg, "--source", "customers")
	if code != exitOK || !strings.Contains(out, "customers: 2 missing at the source (2 flagged) (7, 42)") {
		t.Errorf("keys: exit %d\n%s%s", code, out, errOut)
	}
	if got := scalar(t, wh, "SELECT string_agg(customer_id::text, ',' ORDER BY customer_id) FROM dw_customers WHERE deleted_at IS NOT NULL"); got != "7,42" {
		t.Errorf("flagged rows %s, want 7,42", got)
	}
	_, out, _ = invoke(t, "status", "-c", cfg)
	if flat := strings.Join(strings.Fields(out), " "); !strings.Contains(flat, "98 source keys, 100 mirror keys") || !strings.Contains(flat, "2 missing at the source (soft, 2 applied)") {
		t.Errorf("status does not show the key reconciliation:\n%s", out)
	}
	// A dry run against a warehouse without the mirror changes nothing.
	fresh, _, wh2 := pollSetup(t, 10)
	if code, _, errOut := invoke(t, "keys", "-c", fresh, "--source", "customers", "--dry-run"); code != exitFailure || !strings.Contains(errOut, "does not exist yet") {
		t.Errorf("keys --dry-run without a mirror: exit %d, %s", code, errOut)
	}
	if got := scalar(t, wh2, "SELECT (to_regclass('public.dw_customers') IS NULL AND to_regclass('raw.customers') IS NULL)::text"); got != "true" {
		t.Errorf("a dry run created the mirror or the raw table")
	}
	if code, _, errOut := invoke(t, "keys", "-c", cfg, "--source", "nope"); code != exitUsage || !strings.Contains(errOut, `--source: "nope" is not a poll or CDC source`) {
		t.Errorf("keys --source nope: exit %d, %s", code, errOut)
	}
}

// guardConfig writes a copy of the configuration at path with extra keys
// in the mirror block of source customers.
func guardConfig(t *testing.T, path, mirrorKeys string) string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const mirrorBlock = "mirror: {table: dw_customers}"
	if !strings.Contains(string(text), mirrorBlock) {
		t.Fatalf("the configuration lacks %q:\n%s", mirrorBlock, text)
	}
	return writeFile(t, "guard.yaml", strings.Replace(string(text), mirrorBlock, "mirror: {table: dw_customers, "+mirrorKeys+"}", 1))
}

// loadAndTruncate polls the whole source table into the mirror, then
// empties the source table by mistake.
func loadAndTruncate(t *testing.T, cfg string, src *pgxpool.Pool) {
	t.Helper()
	if code, out, errOut := invoke(t, "poll", "--once", "-c", cfg, "--source", "customers", "--upper", "2026-10-06T00:00:00Z"); code != exitOK {
		t.Fatalf("poll: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := src.Exec(context.Background(), "TRUNCATE src_customers"); err != nil {
		t.Fatal(err)
	}
}

// TestKeysCommandGuard: after the source table was emptied by mistake,
// `tidemark keys` refuses with exit status 1 and a message naming
// mirror.key_reconcile_max_delete and --force, and changes nothing; a dry
// run says a run would be refused; --force applies; with
// key_reconcile_max_delete: 100% the run applies without it.
func TestKeysCommandGuard(t *testing.T) {
	cfg, src, wh := pollSetup(t, 100)
	loadAndTruncate(t, cfg, src)
	flagged := func() string {
		t.Helper()
		return scalar(t, wh, "SELECT count(*)::text FROM dw_customers WHERE deleted_at IS NOT NULL")
	}
	for _, step := range []struct {
		name    string
		args    []string
		code    int
		stdout  []string
		stderr  []string
		flagged string
	}{{
		name: "dry run", args: []string{"--dry-run"}, code: exitFailure,
		stdout: []string{"customers: at least 100 missing at the source (dry run, nothing changed); 0 not yet in the mirror",
			"customers: mirror.key_reconcile_max_delete (10%) allows 10 of 100 mirror rows, at least 100 are missing (100%); a run would be refused (--force applies anyway)"},
		flagged: "0",
	}, {
		name: "run", code: exitFailure,
		stdout: []string{"customers: at least 100 missing at the source (refused, nothing changed); 0 not yet in the mirror",
			"customers: mirror.key_reconcile_max_delete (10%) allows 10 of 100 mirror rows, at least 100 are missing (100%); refused (--force applies anyway)"},
		stderr: []string{`level=ERROR msg="key reconciliation refused: more mirror rows are missing at the source than mirror.key_reconcile_max_delete allows; nothing was applied" component=keys source=customers missing_at_source="at least 100" mirror_keys=100 share=100% max_delete=10% allowed=10`,
			"tidemark keys: keys customers: refused by mirror.key_reconcile_max_delete: at least 100 of 100 mirror rows (100%) are missing at the source, more than 10% (10 rows); nothing was applied",
			"`tidemark keys --source customers --force` (this run only), or raise mirror.key_reconcile_max_delete of source customers"},
		flagged: "0",
	}, {
		name: "forced dry run", args: []string{"--dry-run", "--force"}, code: exitFailure,
		stdout: []string{"customers: 100 missing at the source (dry run, nothing changed) (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, … 90 more); 0 not yet in the mirror",
			"customers: mirror.key_reconcile_max_delete (10%) allows 10 of 100 mirror rows, 100 are missing (100%); a run with --force would apply them"},
		flagged: "0",
	}, {
		name: "forced run", args: []string{"--force"}, code: exitOK,
		stdout: []string{"customers: 100 missing at the source (100 flagged) (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, … 90 more)",
			"customers: mirror.key_reconcile_max_delete (10%) allows 10 of 100 mirror rows, 100 are missing (100%); applied with --force"},
		flagged: "100",
	}, {
		name: "run after the forced run", code: exitOK,
		stdout:  []string{"customers: 0 source keys, 0 mirror keys", "customers: 0 missing at the source (0 flagged); 0 not yet in the mirror"},
		flagged: "100",
	}} {
		code, out, errOut := invoke(t, append([]string{"keys", "-c", cfg, "--source", "customers"}, step.args...)...)
		if code != step.code {
			t.Errorf("%s: exit %d, want %d\n%s%s", step.name, code, step.code, out, errOut)
		}
		for _, want := range step.stdout {
			if !strings.Contains(out, want) {
				t.Errorf("%s: stdout lacks %q:\n%s", step.name, want, out)
			}
		}
		for _, want := range step.stderr {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s: stderr lacks %q:\n%s", step.name, want, errOut)
			}
		}
		if got := flagged(); got != step.flagged {
			t.Errorf("%s: %s mirror rows flagged, want %s", step.name, got, step.flagged)
		}
	}
	pgtest.Equal(t, "recorded runs (dry_run, refused, forced, missing_at_source, applied)",
		pgtest.Lines(t, wh, "SELECT dry_run, refused, forced, missing_at_source, applied FROM tidemark.key_reconciliations ORDER BY id"),
		[]string{"true | true | false | 100 | 0", "false | true | false | 100 | 0", "true | false | true | 100 | 0",
			"false | false | true | 100 | 100", "false | false | false | 0 | 0"})

	// With the limit off, the same emptied table is mirrored as emptied.
	cfg2, src2, wh2 := pollSetup(t, 100)
	off := guardConfig(t, cfg2, "deletes: hard, key_reconcile_max_delete: 100%")
	loadAndTruncate(t, off, src2)
	if code, out, errOut := invoke(t, "keys", "-c", off, "--source", "customers"); code != exitOK || !strings.Contains(out, "customers: 100 missing at the source (100 removed)") {
		t.Errorf("keys with key_reconcile_max_delete: 100%%: exit %d\n%s%s", code, out, errOut)
	}
	if n := scalar(t, wh2, "SELECT count(*)::text FROM dw_customers"); n != "0" {
		t.Errorf("%s mirror rows left with the limit off, want 0", n)
	}
	bad := guardConfig(t, cfg2, "key_reconcile_max_delete: 10")
	if code, _, errOut := invoke(t, "keys", "-c", bad, "--source", "customers"); code != exitUsage ||
		!strings.Contains(errOut, `guard.yaml:6: sources.customers.mirror.key_reconcile_max_delete: invalid percentage "10" (use e.g. 10%`) {
		t.Errorf("an invalid key_reconcile_max_delete: exit %d, %s", code, errOut)
	}
	// Key reconciliation never changes a CDC source's mirrors.
	cdcCfg := writeFile(t, "cdc.yaml", "warehouse: {dsn: \"postgres://127.0.0.1:1/w\"}\nsources:\n  shop:\n    cdc: {dsn: \"postgres://127.0.0.1:1/s\", tables: [orders]}\n    mirror: {schema: mirror}\n")
	if code, _, errOut := invoke(t, "keys", "-c", cdcCfg, "--source", "shop", "--dry-run", "--force"); code != exitUsage ||
		!strings.Contains(errOut, "--force applies to poll sources") {
		t.Errorf("keys --force on a CDC source: exit %d, %s", code, errOut)
	}
}

// TestKeysGuardInRun: inside `tidemark run`, scheduled key reconciliation
// of a source table emptied by mistake is refused and recorded, and the
// mirror keeps its rows.
func TestKeysGuardInRun(t *testing.T) {
	base, src, wh := pollSetup(t, 100)
	cfg := guardConfig(t, base, "key_reconcile_every: 1h")
	loadAndTruncate(t, cfg, src)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"run", "--only", "poll", "-c", cfg}, &out, &errOut) }()
	if err := waitfor.Poll(2*time.Minute, func() bool {
		return scalar(t, wh, "SELECT count(*)::text FROM tidemark.key_reconciliations") != "0"
	}); err != nil {
		t.Fatalf("no scheduled key reconciliation within 2 minutes:\n%s", errOut.String())
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("run: exit %d\n%s", code, errOut.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("run did not stop")
	}
	pgtest.Equal(t, "recorded runs (dry_run, refused, forced, missing_at_source, applied)",
		pgtest.Lines(t, wh, "SELECT dry_run, refused, forced, missing_at_source, applied FROM tidemark.key_reconciliations ORDER BY id"),
		[]string{"false | true | false | 100 | 0"})
	if n := scalar(t, wh, "SELECT count(*)::text FROM dw_customers WHERE deleted_at IS NULL"); n != "100" {
		t.Errorf("%s live mirror rows, want 100", n)
	}
	if log := errOut.String(); strings.Count(log, `msg="key reconciliation refused`) != 1 || !strings.Contains(log, "max_delete=10%") {
		t.Errorf("the log does not say once that the run was refused:\n%s", log)
	}
}
