package raw_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
)

// TestDistributeOnCitus: on a Citus warehouse the raw tables of Kafka,
// Debezium and CDC sources are created distributed by event_id, and their
// partitions with them, colocated with each other (not with a table
// distributed before them); a poll source's and every table under
// warehouse.distribute: false stay on the coordinator, and Ensure does
// not convert a table that exists.
func TestDistributeOnCitus(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.SharedCluster(t).NewDatabase(t, pgtest.ClusterOptions{})
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Conn(t, dsn)
	citusKind := func(table string) string { return pgtest.Placement(t, conn, table) }
	day := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	const sources = `
kafka: {brokers: ["127.0.0.1:1"]}
sources:
  events: {kafka: {topics: [events]}, event_id: /id, event_time: /at}
  dbz: {kafka: {topics: [dbz]}, format: debezium, mirror: {table: dbz_mirror}}
  shop: {cdc: {dsn: "postgres://127.0.0.1:1/shop", tables: [orders]}, mirror: {table: shop_orders}}
  customers:
    poll: {dsn: "postgres://127.0.0.1:1/shop", table: customers, key: [id], updated_at: updated_at}
    mirror: {table: dw_customers}
`
	parse := func(yaml string) *config.Config {
		t.Helper()
		cfg, err := config.Parse("citus.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	// A table distributed first by a text column of another collation,
	// as a mirror with a text key is: Citus would choose its colocation
	// group for a raw table by type and shard count, then refuse it for
	// the collation.
	if _, err := conn.Exec(ctx, `CREATE TABLE first_mirror (k text COLLATE "C" PRIMARY KEY, v int);
		SELECT create_distributed_table('first_mirror', 'k', colocate_with => 'none')`); err != nil {
		t.Fatal(err)
	}
	cfg := parse("warehouse: {dsn: \"postgres://127.0.0.1:1/w\"}" + sources)
	local := parse("warehouse: {dsn: \"postgres://127.0.0.1:1/w\", distribute: false}" + strings.NewReplacer(
		"events:", "local_events:", "dbz:", "local_dbz:", "shop:", "local_shop:", "customers:", "local_customers:").Replace(sources))
	for _, tc := range []struct {
		table *raw.Table
		want  string
	}{
		{raw.ForSource(cfg, "events"), "distributed by event_id"},
		{raw.ForSource(cfg, "dbz"), "distributed by event_id"},
		{raw.ForSource(cfg, "shop"), "distributed by event_id"},
		{raw.ForSource(cfg, "customers"), ""},
		{raw.ForSource(local, "local_events"), ""},
		{raw.ForSource(local, "local_dbz"), ""},
		{raw.ForSource(local, "local_shop"), ""},
		{raw.ForSource(local, "local_customers"), ""},
	} {
		if err := tc.table.Ensure(ctx, conn); err != nil {
			t.Fatalf("%s: %v", tc.table.Ident(), err)
		}
		if err := tc.table.EnsurePartitions(ctx, conn, []time.Time{day}); err != nil {
			t.Fatalf("%s: %v", tc.table.Ident(), err)
		}
		partition := pgx.Identifier{"raw", tc.table.PartitionName(day)}.Sanitize()
		for _, name := range []string{tc.table.Ident(), partition} {
			if got := citusKind(name); got != tc.want {
				t.Errorf("%s: %q, want %q", name, got, tc.want)
			}
		}
	}
	// The raw tables are colocated with each other, not with the table
	// distributed before them.
	groups := pgtest.Rows(t, conn, `SELECT string_agg(logicalrelid::text, ' ' ORDER BY logicalrelid::text) FROM pg_dist_partition
		WHERE logicalrelid::text IN ('first_mirror', 'raw.events', 'raw.dbz', 'raw.shop') GROUP BY colocationid ORDER BY 1`)
	if want := []string{"first_mirror", "raw.dbz raw.events raw.shop"}; strings.Join(groups, "\n") != strings.Join(want, "\n") {
		t.Errorf("colocation groups %q, want %q", groups, want)
	}
	// A second Ensure of a table that exists changes nothing.
	again := raw.NewTable("local_events", "day")
	if err := again.Ensure(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := citusKind(again.Ident()); got != "" {
		t.Errorf("an existing local table was converted: %s", got)
	}
}
