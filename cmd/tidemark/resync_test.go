package main

import (
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestResyncCommand: tidemark resync asks for a resync of a CDC table
// once while one is under way, says so for a dry run, and refuses a
// source or table the configuration does not name. (The copy itself is
// cdc's TestResync.)
func TestResyncCommand(t *testing.T) {
	_, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	cfg := cdcConfig(t, whDSN, srcDSN)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no source", []string{"resync", "-c", cfg}, exitUsage, "name the source"},
		{"not a CDC source", []string{"resync", "nope", "-c", cfg}, exitUsage, `"nope" is not a CDC source (configured: shop)`},
		{"a table not configured", []string{"resync", "shop", "items", "-c", cfg}, exitUsage, "sources.shop.cdc.tables does not name public.items (it names: public.orders)"},
		{"dry run", []string{"resync", "shop", "--dry-run", "-c", cfg}, exitOK, "would resync shop public.orders (never resynced)"},
		{"request", []string{"resync", "-c", cfg, "shop"}, exitOK, "shop public.orders asked for (generation 1)"},
		{"again", []string{"resync", "shop", "orders", "-c", cfg}, exitOK, "shop public.orders is being resynced already (pending, 0 chunks, 0 rows copied)"},
		{"dry run under way", []string{"resync", "shop", "--dry-run", "-c", cfg}, exitOK, "a resync is pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := invoke(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Errorf("exit %d, want %d with %q:\n%s%s", code, tc.code, tc.want, out, errOut)
			}
		})
	}
	var n int64
	if err := wh.QueryRow(t.Context(), `SELECT count(*) FROM tidemark.cdc_resyncs WHERE source = 'shop' AND state = 'pending'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d pending resyncs (%v), want 1", n, err)
	}
}
