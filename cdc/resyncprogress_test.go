package cdc

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestPlannedRows: the rows a resync expects are the source's estimate,
// summed over the leaves of a partitioned table, and unknown (nil) for a
// table, or a partition, never analysed (autovacuum kept off them), and
// for one that is not found.
func TestPlannedRows(t *testing.T) {
	src, _ := pgtest.NewPool(t)
	ctx := t.Context()
	if _, err := src.Exec(ctx, `
CREATE TABLE plain (id int PRIMARY KEY); INSERT INTO plain SELECT generate_series(1, 1000); ANALYZE plain;
CREATE TABLE fresh (id int PRIMARY KEY) WITH (autovacuum_enabled = false); INSERT INTO fresh SELECT generate_series(1, 10);
CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id);
CREATE TABLE parted_a PARTITION OF parted FOR VALUES FROM (0) TO (500);
CREATE TABLE parted_b PARTITION OF parted FOR VALUES FROM (500) TO (10000) PARTITION BY RANGE (id);
CREATE TABLE parted_b1 PARTITION OF parted_b FOR VALUES FROM (500) TO (10000);
INSERT INTO parted SELECT generate_series(1, 2000); ANALYZE parted;
CREATE TABLE "Half Done" (id int PRIMARY KEY) PARTITION BY RANGE (id);
CREATE TABLE half_a PARTITION OF "Half Done" FOR VALUES FROM (0) TO (500);
CREATE TABLE half_b PARTITION OF "Half Done" FOR VALUES FROM (500) TO (1000) WITH (autovacuum_enabled = false);
INSERT INTO "Half Done" SELECT generate_series(1, 900); ANALYZE half_a`); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		table string
		want  string
	}{
		{"plain", "1000"},
		{"fresh", "nil"},
		{"parted", "2000"},
		{"parted_b", "1501"},
		{"parted_a", "499"},
		{"Half Done", "nil"},
		{"gone", "nil"},
	} {
		n, err := plannedRows(ctx, src, pgx.Identifier{"public", tt.table})
		if err != nil {
			t.Fatalf("%s: %v", tt.table, err)
		}
		got := "nil"
		if n != nil {
			got = fmt.Sprint(*n)
		}
		if got != tt.want {
			t.Errorf("planned rows of %s: %s, want %s", tt.table, got, tt.want)
		}
	}
}
