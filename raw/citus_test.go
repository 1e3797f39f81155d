package raw_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/raw"
)

// TestDistributeOnCitus: on a Citus warehouse a Kafka source's raw table
// is created distributed by event_id, and its partitions with it; a table
// of row changes and a table created with Local stay on the coordinator,
// and Ensure does not convert a table that exists.
func TestDistributeOnCitus(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.SharedCluster(t).NewDatabase(t, pgtest.ClusterOptions{})
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Conn(t, dsn)
	// citusKind is how Citus knows the table: "" when it does not.
	citusKind := func(table string) string {
		t.Helper()
		var kind string
		err := conn.QueryRow(ctx, `SELECT coalesce((SELECT citus_table_type || ' by ' || distribution_column FROM citus_tables WHERE table_name = $1::regclass), '')`, table).Scan(&kind)
		if err != nil {
			t.Fatal(err)
		}
		return kind
	}
	day := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		table *raw.Table
		want  string
	}{
		{raw.NewTable("events", "day"), "distributed by event_id"},
		{func() *raw.Table { t := raw.NewTable("local_events", "day"); t.Local = true; return t }(), ""},
		{raw.NewChangeTable("changes", "day"), ""},
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
	// A second Ensure of a table that exists changes nothing.
	again := raw.NewTable("local_events", "day")
	if err := again.Ensure(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := citusKind(again.Ident()); got != "" {
		t.Errorf("an existing local table was converted: %s", got)
	}
}
