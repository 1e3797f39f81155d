package backfill_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// commentedSelect is the daily_sales query without its FROM clause.
const commentedSelect = `SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*)::int AS event_count`

// TestSQLWithComments: an aggregate's SQL may carry comments anywhere,
// a line comment at its end included. What Prepare accepts, Rebuild,
// Drift and BuildShadow run, and they write and compare the query's rows.
func TestSQLWithComments(t *testing.T) {
	w := newWarehouse(t, "correction")
	w.sale("s01", "2026-09-01 10:00", 1)
	w.sale("s02", "2026-09-02 10:00", 2)
	w.sale("s02b", "2026-09-02 11:00", 4)
	want := []string{"2026-09-01 | 1.00 | 1", "2026-09-02 | 6.00 | 2"}
	days := []aggregate.Partition{w.d.Of(time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)), w.d.Of(time.Date(2026, 9, 2, 12, 0, 0, 0, time.UTC))}

	tests := []struct{ name, sql string }{
		{"trailing line comment", commentedSelect + " FROM {{events}} GROUP BY 1 -- one row per day"},
		{"trailing line comment, second line", commentedSelect + "\nFROM {{events}} GROUP BY 1 -- one row per day"},
		{"comment-only last line", commentedSelect + "\nFROM {{events}} GROUP BY 1\n-- one row per day"},
		{"leading line comment", "-- daily sales\n" + commentedSelect + " FROM {{events}} GROUP BY 1"},
		{"block comments", "/* daily\n sales */ " + commentedSelect + " /* per day */ FROM {{events}} GROUP BY 1 /* one row\n per day */"},
		{"nested block comment last", commentedSelect + " FROM {{events}} GROUP BY 1 /* one /* row */ per day */"},
		{"with, comments everywhere", "-- amounts first\nWITH e AS ( -- the partition's events\n  SELECT (payload->>'amount')::numeric(12,2) AS amount FROM {{events}}\n)\n" +
			"SELECT {{partition}} AS sale_date, sum(amount) AS total, count(*)::int AS event_count FROM e GROUP BY 1 -- one row per day"},
		{"with after a block comment", "/* amounts first */ WITH e AS (SELECT (payload->>'amount')::numeric(12,2) AS amount FROM {{events}})\n" +
			"SELECT {{partition}} AS sale_date, sum(amount) AS total, count(*)::int AS event_count FROM e GROUP BY 1"},
		{"with recursive, trailing comment", "-- a recursive CTE beside {{events}}\nWITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1)\n" +
			commentedSelect + " FROM {{events}}, n GROUP BY 1 -- n has one row"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if pgtest.OnCitus() && strings.Contains(tt.sql, "RECURSIVE") {
				t.Skip("Citus plans a recursive CTE beside a distributed table only with a filter on its distribution column")
			}
			w := w.in(t)
			name := fmt.Sprintf("commented_%d", i)
			_, d := w.aggregate(w.cfg.Warehouse.DSN, name, "{by: day, column: sale_date, time_zone: UTC}", "correction", tt.sql)
			for _, p := range days {
				inTx(t, w, true, func(tx pgx.Tx) error {
					_, err := aggregate.Rebuild(w.ctx, tx, d, p, w.now)
					return err
				})
			}
			pgtest.Equal(t, "rebuilt", w.rows(fmt.Sprintf("SELECT sale_date::text, total::text, event_count FROM %s ORDER BY 1", d.Target.Sanitize())), want)
			for _, p := range days {
				var drift, shadow aggregate.Comparison
				inTx(t, w, false, func(tx pgx.Tx) (err error) {
					drift, err = aggregate.Drift(w.ctx, tx, d, p)
					return err
				})
				inTx(t, w, true, func(tx pgx.Tx) error {
					s, err := aggregate.BuildShadow(w.ctx, tx, d, p)
					shadow = s.Comparison
					return err
				})
				for what, c := range map[string]aggregate.Comparison{"drift": drift, "shadow": shadow} {
					if c.Differs() || c.Published == 0 || c.Fresh != c.Published {
						t.Errorf("%s of %s: %+v, want the published rows", what, p, c)
					}
				}
			}
			pgtest.Equal(t, "shadow", w.rows(fmt.Sprintf("SELECT sale_date::text, total::text, event_count FROM %s ORDER BY 1", d.ShadowName().Sanitize())), want)
		})
	}
}

// TestSQLWithSemicolonBeforeComment: a statement ended by a semicolon and
// followed by a comment is refused when the aggregate is configured or
// prepared, not by every rebuild.
func TestSQLWithSemicolonBeforeComment(t *testing.T) {
	w := newWarehouse(t, "correction")
	tests := []struct{ name, sql string }{
		{"line comment", commentedSelect + " FROM {{events}} GROUP BY 1; -- one row per day"},
		{"comment on the next line", commentedSelect + " FROM {{events}} GROUP BY 1;\n-- one row per day"},
		{"block comment", commentedSelect + " FROM {{events}} GROUP BY 1; /* one row per day */"},
		{"after accented comments", "-- ventes über den Tag\n" + commentedSelect + " /* été */ FROM {{events}} GROUP BY 1; -- fin"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if pgtest.OnCitus() && strings.Contains(tt.sql, "RECURSIVE") {
				t.Skip("Citus plans a recursive CTE beside a distributed table only with a filter on its distribution column")
			}
			w := w.in(t)
			cfg, _, err := w.tryAggregate(w.cfg.Warehouse.DSN, fmt.Sprintf("semicolon_%d", i), "{by: day, column: sale_date, time_zone: UTC}", "correction", tt.sql)
			switch {
			case err == nil:
				t.Fatalf("accepted %q", tt.sql)
			case !strings.Contains(err.Error(), "semicolon"):
				t.Errorf("refused for another reason: %v", err)
			case cfg == nil:
				t.Logf("the configuration refuses it: %v", err)
			default:
				t.Logf("Prepare refuses it: %v", err)
			}
		})
	}
}

// in is w for the subtest t.
func (w *warehouse) in(t *testing.T) *warehouse {
	sub := *w
	sub.t = t
	return &sub
}

// inTx runs f in a transaction of w's pool, committed or rolled back, and
// fails the test on an error.
func inTx(t *testing.T, w *warehouse, commit bool, f func(pgx.Tx) error) {
	t.Helper()
	tx, err := w.pool.Begin(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(w.ctx) }()
	if err := f(tx); err != nil {
		t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(w.ctx); err != nil {
			t.Fatal(err)
		}
	}
}
