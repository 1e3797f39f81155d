package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestPrepareStateReads checks that Prepare refuses a query that reads
// tidemark's own tables, however it names them, and accepts one that
// only mentions them in text or reads other tables of the warehouse.
func TestPrepareStateReads(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
CREATE TABLE sales (id int, amount numeric, region int, occurred_at timestamptz, loaded_at timestamptz);
CREATE TABLE regions (id int, name text);
CREATE VIEW rebuilds AS SELECT aggregate, rebuilds FROM tidemark.partitions;
CREATE VIEW region_names AS SELECT id, name FROM regions`); err != nil {
		t.Fatal(err)
	}
	const head = "SELECT {{partition}} AS day, count(*) AS n"
	tests := []struct {
		name, policy, searchPath, sql string
		reads                         string // "" when the query is accepted
	}{
		{"events only", "correction", "", head + " FROM {{events}} GROUP BY 1", ""},
		{"events under the arrival policy", "arrival", "", head + " FROM {{events}} GROUP BY 1", ""},
		{"a reference table", "correction", "", head + ", max(r.name) AS region FROM {{events}} e JOIN regions r ON r.id = e.region GROUP BY 1", ""},
		{"a view over a reference table", "correction", "", head + ", max(r.name) AS region FROM {{events}} e JOIN region_names r ON r.id = e.region GROUP BY 1", ""},
		{"the name in a string literal", "correction", "", head + ", 'tidemark.partitions' AS note FROM {{events}} GROUP BY 1", ""},
		{"the name in a comment", "correction", "", "-- not tidemark.corrections\n" + head + " FROM {{events}} GROUP BY 1 /* tidemark.partitions */", ""},
		{"an alias named tidemark", "correction", "", "SELECT {{partition}} AS day, count(tidemark.id) AS n FROM {{events}} tidemark GROUP BY 1", ""},
		{"a join", "correction", "", head + " FROM {{events}} JOIN tidemark.partitions p ON p.aggregate = 'x' GROUP BY 1", "tidemark.partitions"},
		{"a scalar subquery", "correction", "", head + ", (SELECT count(*) FROM tidemark.corrections) AS c FROM {{events}} GROUP BY 1", "tidemark.corrections"},
		{"a subquery under the arrival policy", "arrival", "", head + ", (SELECT count(*) FROM tidemark.corrections) AS c FROM {{events}} GROUP BY 1", "tidemark.corrections"},
		{"quoted names", "correction", "", head + `, (SELECT count(*) FROM "tidemark"."partitions") AS c FROM {{events}} GROUP BY 1`, "tidemark.partitions"},
		{"upper-case names", "correction", "", head + ", (SELECT count(*) FROM TIDEMARK.PARTITIONS) AS c FROM {{events}} GROUP BY 1", "tidemark.partitions"},
		{"found through search_path", "correction", "tidemark, public", head + ", (SELECT count(*) FROM partitions) AS c FROM {{events}} GROUP BY 1", "tidemark.partitions"},
		{"through a view", "correction", "", head + ", (SELECT max(rebuilds) FROM rebuilds) AS r FROM {{events}} GROUP BY 1", "tidemark.partitions"},
		{"two tables", "correction", "", head + ", (SELECT count(*) FROM tidemark.partitions, tidemark.corrections) AS c FROM {{events}} GROUP BY 1",
			"tidemark.corrections, tidemark.partitions"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := connect(t, dsn, tt.searchPath)
			err := prepare(t, conn, dsn, fmt.Sprintf("agg_%d", i), tt.policy, tt.sql)
			switch {
			case tt.reads == "" && err != nil:
				t.Fatalf("Prepare: %v", err)
			case tt.reads != "" && !errors.Is(err, aggregate.ErrReadsState):
				t.Fatalf("Prepare = %v, want %v", err, aggregate.ErrReadsState)
			case tt.reads != "" && !strings.HasPrefix(err.Error(), fmt.Sprintf("aggregates.agg_%d.sql: ", i)) ||
				tt.reads != "" && !strings.HasSuffix(err.Error(), ": it reads "+tt.reads):
				t.Errorf("Prepare = %q, want the key and the tables %s", err, tt.reads)
			}
			// The check leaves nothing behind in the session.
			var left *string
			if err := conn.QueryRow(ctx, "SELECT to_regclass('pg_temp.tidemark_prepare')::text").Scan(&left); err != nil || left != nil {
				t.Errorf("temporary view after Prepare: %v, %v", left, err)
			}
		})
	}
}

// connect opens a session of its own with search_path, when given.
func connect(t *testing.T, dsn, searchPath string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if searchPath != "" {
		if _, err := conn.Exec(ctx, "SET search_path TO "+searchPath); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// prepare prepares aggregate name over the table source sales, with
// policy and sql, on conn.
func prepare(t *testing.T, conn *pgx.Conn, dsn, name, policy, sql string) error {
	t.Helper()
	yaml := fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  sales:
    table: {name: public.sales, key: [id], event_time: occurred_at, ingested_at: loaded_at}
aggregates:
  %s:
    source: sales
    table: %s
    partition: {by: day, column: day}
    beyond_horizon: %s
    sql: %q
`, dsn, name, name, policy, sql)
	cfg, err := config.Parse("test.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	d, err := aggregate.FromConfig(cfg, name)
	if err != nil {
		t.Fatal(err)
	}
	return aggregate.Prepare(context.Background(), conn, d)
}
