package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestUnpublishCommand: tidemark unpublish drops from the publication the
// tables cdc.tables does not name (or those named), prints the statement
// for a dry run, and refuses a tracked table and one not published.
func TestUnpublishCommand(t *testing.T) {
	src, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	if _, err := src.Exec(t.Context(), `CREATE TABLE orders (id bigint PRIMARY KEY); CREATE TABLE items (id bigint PRIMARY KEY);
		CREATE TABLE notes (id bigint PRIMARY KEY); CREATE PUBLICATION tidemark_shop FOR TABLE orders, items, notes`); err != nil {
		t.Fatal(err)
	}
	cfg := cdcConfig(t, whDSN, srcDSN)
	published := func() []string {
		return pgtest.Rows(t, src, `SELECT tablename::text FROM pg_publication_tables WHERE pubname = 'tidemark_shop' ORDER BY 1`)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
		left []string
	}{
		{"tracked table", []string{"unpublish", "shop", "orders", "-c", cfg}, exitUsage,
			"sources.shop.cdc.tables names public.orders: remove it from the configuration first", []string{"items", "notes", "orders"}},
		{"dry run", []string{"unpublish", "shop", "--dry-run", "-c", cfg}, exitOK,
			`would run ALTER PUBLICATION "tidemark_shop" DROP TABLE "public"."items", "public"."notes"`, []string{"items", "notes", "orders"}},
		{"streamed by the reader", []string{"unpublish", "shop", "items", "-c", cfg}, exitFailure,
			"the reader of shop streamed public.items at its last start", []string{"items", "notes", "orders"}},
		{"one named", []string{"unpublish", "shop", "notes", "-c", cfg}, exitOK,
			`ran ALTER PUBLICATION "tidemark_shop" DROP TABLE "public"."notes"; the source no longer sends the changes of public.notes`, []string{"items", "orders"}},
		{"not published", []string{"unpublish", "shop", "notes", "-c", cfg}, exitFailure,
			"publication tidemark_shop does not publish public.notes", []string{"items", "orders"}},
		{"the rest", []string{"unpublish", "-c", cfg, "shop"}, exitOK, `DROP TABLE "public"."items";`, []string{"orders"}},
		{"nothing left", []string{"unpublish", "shop", "-c", cfg}, exitOK, "publishes no table that sources.shop.cdc.tables does not name", []string{"orders"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "streamed by the reader" {
				// A reader started with items among its tables.
				if _, err := wh.Exec(t.Context(), `INSERT INTO tidemark.cdc_positions (source, slot, system_id, snapshot, tables, updated_at)
					VALUES ('shop', 'tidemark_shop', '1', 'done', '{public.orders,public.items}', now())`); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _, _ = wh.Exec(context.Background(), `DELETE FROM tidemark.cdc_positions`) })
			}
			code, out, errOut := invoke(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Errorf("exit %d, want %d with %q:\n%s%s", code, tc.code, tc.want, out, errOut)
			}
			if got := published(); !slices.Equal(got, tc.left) {
				t.Errorf("published %q, want %q", got, tc.left)
			}
		})
	}
}
