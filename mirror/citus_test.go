package mirror_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/mirror"
)

// TestDistributeOnCitus: on a Citus warehouse a mirror created with
// Distribute set, by Ensure or EnsureTarget, is distributed by its first
// key column; without it the mirror stays on the coordinator; a mirror
// that exists is not converted.
func TestDistributeOnCitus(t *testing.T) {
	ctx := context.Background()
	conn := pgtest.Conn(t, pgtest.SharedCluster(t).NewDatabase(t, pgtest.ClusterOptions{}))
	cols := []mirror.Column{{Name: "region", Type: "text", NotNull: true}, {Name: "id", Type: "bigint", NotNull: true}, {Name: "name", Type: "text"}}
	own := []mirror.Column{{Name: "loaded_at", Type: "timestamptz", NotNull: true}}
	table := func(name string, distribute bool) *mirror.Table {
		return &mirror.Table{Name: name, Target: pgx.Identifier{"mirror", name}, Key: []string{"region", "id"}, Columns: cols,
			LoadedColumn: "loaded_at", DeletedColumn: "deleted_at", Distribute: distribute}
	}
	for _, tc := range []struct {
		name       string
		distribute bool
		target     bool // created by EnsureTarget, not Ensure
		want       string
	}{
		{"cdc", true, false, "distributed by region"},
		{"cdc_local", false, false, ""},
		{"debezium", true, true, "distributed by region"},
		{"debezium_local", false, true, ""},
	} {
		m := table(tc.name, tc.distribute)
		var err error
		if tc.target {
			err = mirror.EnsureTarget(ctx, conn, m, own)
		} else {
			err = m.Ensure(ctx, conn)
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := pgtest.Placement(t, conn, m.Target.Sanitize()); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	// Ensuring a local mirror that exists, now with Distribute set, adds
	// its missing columns and leaves it where it is.
	again := table("cdc_local", true)
	again.Columns = append(again.Columns, mirror.Column{Name: "email", Type: "text"})
	if err := again.Ensure(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if got := pgtest.Placement(t, conn, again.Target.Sanitize()); got != "" {
		t.Errorf("an existing local mirror was converted: %s", got)
	}
}
