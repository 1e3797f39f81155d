package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// cliConfig is a configuration with a Kafka source, an aggregate over it
// and a poll source, whose warehouse is dsn; migrate sets
// warehouse.migrate.
func cliConfig(t *testing.T, dsn string, migrate bool) string {
	t.Helper()
	return writeFile(t, "cli.yaml", fmt.Sprintf(`warehouse: {dsn: %q, migrate: %t}
http: {listen: "off"}
log: {format: json}
kafka: {brokers: ["127.0.0.1:1"]}
sources:
  app_events:
    kafka: {topics: [app-events]}
    event_id: /event_id
    event_time: /event_time
  customers:
    poll: {dsn: "postgres://u@127.0.0.1:1/source", table: customers, key: [id], updated_at: updated_at}
    mirror: {table: dw_customers}
aggregates:
  daily:
    source: app_events
    table: daily
    partition: {by: day, column: day}
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
`, dsn, migrate))
}

// TestUnreachableWarehouse: a warehouse that refuses connections is
// reported in one line that names warehouse.dsn, the address and the
// reason, once, by every command that needs it, whether it migrates
// first or goes straight to the pool, and in run's log.
func TestUnreachableWarehouse(t *testing.T) {
	addr := freeAddr(t)
	// No sslmode: the driver tries with TLS, then without, and reports
	// both refusals.
	dsn := "postgres://tidemark@" + addr + "/warehouse"
	want := "warehouse.dsn: cannot connect to " + addr + " (127.0.0.1): connection refused"
	for _, migrate := range []bool{true, false} {
		cfg := cliConfig(t, dsn, migrate)
		for _, args := range [][]string{
			{"migrate"},
			{"status"},
			{"reconcile", "--once"},
			{"poll", "--once", "--source", "customers"},
			{"keys", "--source", "customers"},
			{"backfill", "--aggregate", "daily", "--from", "2026-10-01", "--to", "2026-10-02"},
			{"verify", "--aggregate", "daily"},
			{"refresh", "--aggregate", "daily", "--full"},
			{"lateness", "--source", "app_events"},
			{"prune"},
		} {
			t.Run(fmt.Sprintf("%s/migrate=%t", strings.Join(args, " "), migrate), func(t *testing.T) {
				code, stdout, stderr := invoke(t, append(args, "-c", cfg)...)
				if wantErr := "tidemark " + args[0] + ": " + want + "\n"; code != exitFailure || stderr != wantErr {
					t.Errorf("exit %d, stderr:\n%s\nwant exit 1, stderr:\n%s\nstdout:\n%s", code, stderr, wantErr, stdout)
				}
			})
		}
	}
	t.Run("run", func(t *testing.T) {
		r := startRunning(t, "-c", cliConfig(t, dsn, true))
		if got := r.logged(t, "warehouse unreachable; waiting for it"); got != want {
			t.Errorf("run's log: err=%q, want %q", got, want)
		}
	})
}

// TestFailedPrefixOnce: a command's failure names the command once, also
// when the error comes from the package of the same name.
func TestFailedPrefixOnce(t *testing.T) {
	for _, tt := range []struct {
		app  string
		err  error
		want string
	}{
		{"tidemark migrate", errors.New("migrate: the database has schema version 99"), "tidemark migrate: the database has schema version 99\n"},
		{"tidemark status", errors.New("migrate: read schema version: boom"), "tidemark status: migrate: read schema version: boom\n"},
		{"tidemark migrate", errors.New("warehouse.dsn: cannot connect"), "tidemark migrate: warehouse.dsn: cannot connect\n"},
	} {
		var stderr strings.Builder
		if code := failed(&stderr, tt.app, tt.err); code != exitFailure || stderr.String() != tt.want {
			t.Errorf("failed(%q, %q): exit %d, %q, want 1, %q", tt.app, tt.err, code, stderr.String(), tt.want)
		}
	}
}

// TestSubcommandHelp: `tidemark CMD -h` and `--help` print the command's
// flags to standard output and exit 0; a usage error prints the error and
// the flags to standard error and exits 2.
func TestSubcommandHelp(t *testing.T) {
	for _, name := range sortedKeys(commands) {
		if name == "help" || name == "version" {
			continue // no flags
		}
		for _, h := range []string{"-h", "--help"} {
			t.Run(name+" "+h, func(t *testing.T) {
				code, stdout, stderr := invoke(t, name, h)
				if code != exitOK || !strings.HasPrefix(stdout, "Usage of tidemark "+name+":\n") || stderr != "" {
					t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 0 and the usage on stdout only", code, stdout, stderr)
				}
			})
		}
		t.Run(name+" --bogus", func(t *testing.T) {
			code, stdout, stderr := invoke(t, name, "--bogus")
			if code != exitUsage || stdout != "" ||
				!strings.HasPrefix(stderr, "flag provided but not defined: -bogus\nUsage of tidemark "+name+":\n") {
				t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 2 and the error and usage on stderr only", code, stdout, stderr)
			}
		})
	}
}

// TestNoSuchSource: naming a source or an aggregate that is not
// configured lists those that are, or says that there are none.
func TestNoSuchSource(t *testing.T) {
	// A Kafka source only: no poll source, no aggregate.
	kafkaOnly := writeFile(t, "kafka.yaml", validConfig)
	full := cliConfig(t, "postgres://tidemark@127.0.0.1:1/warehouse", true)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"poll", "--once", "--source", "x", "-c", kafkaOnly},
			`tidemark poll: --source: "x" is not a poll source; no poll sources are configured`},
		{[]string{"poll", "--once", "--source", "x", "-c", full},
			`tidemark poll: --source: "x" is not a poll source (configured: customers)`},
		{[]string{"keys", "--source", "x", "-c", kafkaOnly},
			`tidemark keys: --source: "x" is not a poll or CDC source; no poll or CDC sources are configured`},
		{[]string{"keys", "--source", "app_events", "-c", full},
			`tidemark keys: --source: "app_events" is not a poll or CDC source (configured: customers)`},
		{[]string{"reconcile", "--once", "--aggregate", "x", "-c", kafkaOnly},
			`tidemark reconcile: --aggregate: no aggregate named "x"; no aggregates are configured`},
		{[]string{"reconcile", "--once", "--aggregate", "x", "-c", full},
			`tidemark reconcile: --aggregate: no aggregate named "x" (configured: daily)`},
		{[]string{"backfill", "--aggregate", "x", "--from", "2026-10-01", "--to", "2026-10-02", "-c", kafkaOnly},
			`tidemark backfill: --aggregate: no aggregate named "x"; no aggregates are configured`},
		{[]string{"verify", "-c", kafkaOnly}, `tidemark verify: --aggregate is required; no aggregates are configured`},
		{[]string{"refresh", "--full", "--aggregate", "x", "-c", full},
			`tidemark refresh: --aggregate: no aggregate named "x" (configured: daily)`},
		{[]string{"lateness", "--source", "x", "-c", kafkaOnly},
			`tidemark lateness: --source: no source named "x" (configured: app_events)`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:len(tt.args)-2], " ")+" "+map[bool]string{true: "none", false: "some"}[tt.args[len(tt.args)-1] == kafkaOnly],
			func(t *testing.T) {
				code, _, stderr := invoke(t, tt.args...)
				if code != exitUsage || stderr != tt.want+"\n" {
					t.Errorf("exit %d, stderr:\n%s\nwant exit 2, stderr:\n%s", code, stderr, tt.want)
				}
			})
	}
}
