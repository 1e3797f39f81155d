package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

// TestCommandsSayRunMigrate: the commands that read the warehouse, run
// against one without tidemark's schema (or with a schema behind this
// binary) and with warehouse.migrate: false, say to run `tidemark
// migrate` rather than which relation does not exist, and exit 1. A
// missing table of a current schema is reported as it is.
func TestCommandsSayRunMigrate(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 1, "events")
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q, migrate: false}
http: {listen: "off"}
kafka: {brokers: [%q], group: schema-hint-test, session_timeout: 1s}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /id
    event_time: /ts
aggregates:
  daily:
    source: app_events
    table: daily
    partition: {by: day, column: day}
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
`, dsn, kc.ListenAddrs()[0]))
	commands := [][]string{
		{"status"},
		{"status", "--json"},
		{"lateness", "--source", "app_events"},
		{"dead-letters", "list"},
		{"dead-letters", "replay", "--source", "app_events"},
		{"verify", "--aggregate", "daily"},
	}
	check := func(t *testing.T, args []string, want string) {
		t.Helper()
		code, stdout, stderr := invoke(t, append(args, "-c", cfg)...)
		app := "tidemark " + args[0]
		if args[0] == "dead-letters" {
			app += " " + args[1]
		}
		if code != exitFailure || !strings.HasPrefix(stderr, app+": "+want) || strings.Contains(stderr, "does not exist") {
			t.Errorf("%v: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 1 and %q", args, code, stdout, stderr, app+": "+want)
		}
	}
	latest := migrate.Latest()
	for _, args := range commands {
		t.Run("no schema/"+strings.Join(args, " "), func(t *testing.T) {
			check(t, args, fmt.Sprintf("the warehouse has no tidemark schema (this binary's is version %d): run `tidemark migrate` first\n", latest))
		})
	}

	if _, err := migrate.Up(context.Background(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	// A missing table of a current schema (no event of the source
	// loaded yet) is not a reason to migrate.
	code, _, stderr := invoke(t, "lateness", "--source", "app_events", "-c", cfg)
	if strings.Contains(stderr, "migrate") {
		t.Errorf("lateness of a source with no raw table: exit %d: %s", code, stderr)
	}

	if _, err := pool.Exec(context.Background(), "DELETE FROM tidemark.schema_migrations WHERE version = $1", latest); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"dead-letters", "list"}, {"verify", "--aggregate", "daily"}} {
		t.Run("behind/"+strings.Join(args, " "), func(t *testing.T) {
			check(t, args, fmt.Sprintf("the warehouse's tidemark schema is at version %d, behind this binary's %d: run `tidemark migrate` first\n", latest-1, latest))
		})
	}
}
