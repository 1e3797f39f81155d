package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

// TestKeysDebezium: `tidemark keys --dry-run` compares a Debezium source's
// mirror with the source table named by mirror.source_dsn and
// source_table, reporting the live mirror rows whose key the source no
// longer has, and never changes the mirror. On a Citus warehouse it runs
// again with the mirror distributed, as tidemark creates one there.
func TestKeysDebezium(t *testing.T) { pgtest.LocalAndDistributed(t, testKeysDebezium) }

func testKeysDebezium(t *testing.T, distributed bool) {
	ctx := context.Background()
	src, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	if _, err := migrate.Up(ctx, whDSN, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Exec(ctx, `CREATE TABLE customers (id integer PRIMARY KEY, name text);
		INSERT INTO customers SELECT i, 'c' || i FROM generate_series(1, 50) AS i`); err != nil {
		t.Fatal(err)
	}
	// The mirror as the source left it: 1 to 50, 51 deleted (flagged),
	// and 52, whose delete was lost.
	if _, err := wh.Exec(ctx, `CREATE SCHEMA dw;
		CREATE TABLE dw.customers (id integer PRIMARY KEY, name text, loaded_at timestamptz NOT NULL, deleted_at timestamptz, source_position bigint[]);
		INSERT INTO dw.customers SELECT i, 'c' || i, now(), CASE WHEN i = 51 THEN now() END, '{1,1,1}' FROM generate_series(1, 52) AS i`); err != nil {
		t.Fatal(err)
	}
	if distributed {
		if _, err := wh.Exec(ctx, `SELECT create_distributed_table('dw.customers', 'id', colocate_with => 'none')`); err != nil {
			t.Fatal(err)
		}
	}
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`warehouse: {dsn: %q, migrate: false}
http: {listen: "off"}
kafka: {brokers: ["127.0.0.1:1"]}
sources:
  customers:
    kafka: {topics: [dbserver1.public.customers]}
    format: debezium
    mirror: {table: dw.customers, source_dsn: %q, source_table: public.customers}
`, whDSN, srcDSN))
	code, stdout, stderr := invoke(t, "keys", "-c", cfg, "--source", "customers", "--dry-run")
	if code != exitFailure || !strings.Contains(stdout, "customers public.customers: 1 missing at the source (dry run, nothing changed) (52)") {
		t.Errorf("keys --dry-run with drift: exit %d, want %d\n%s%s", code, exitFailure, stdout, stderr)
	}
	var live int
	if err := wh.QueryRow(ctx, `SELECT count(*) FROM dw.customers WHERE deleted_at IS NULL`).Scan(&live); err != nil || live != 51 {
		t.Errorf("live mirror rows after a dry run: %d (%v), want 51", live, err)
	}
	if code, _, stderr = invoke(t, "keys", "-c", cfg, "--source", "customers"); code != exitUsage || !strings.Contains(stderr, "is a Debezium source") {
		t.Errorf("keys without --dry-run on a Debezium source: exit %d, want %d\n%s", code, exitUsage, stderr)
	}
}
