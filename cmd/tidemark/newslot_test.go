package main

import (
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestResyncNewSlotCommand: tidemark resync SOURCE --new-slot records the
// gap and asks for the slot once; it refuses a source with nothing read
// and a TABLE.
func TestResyncNewSlotCommand(t *testing.T) {
	_, srcDSN := pgtest.NewPool(t)
	wh, whDSN := pgtest.NewPool(t)
	cfg := cdcConfig(t, whDSN, srcDSN)
	for _, tc := range []struct {
		name  string
		setup string
		args  []string
		code  int
		want  string
	}{
		{"with a table", "", []string{"resync", "shop", "orders", "--new-slot", "-c", cfg}, exitUsage, "--new-slot copies every table of the source again: it takes no TABLE"},
		{"nothing read", "", []string{"resync", "shop", "--new-slot", "-c", cfg}, exitFailure, "shop has no stored position"},
		{"snapshot under way",
			`INSERT INTO tidemark.cdc_positions (source, slot, system_id, snapshot, applied_lsn, updated_at) VALUES ('shop', 'tidemark_shop', '7', 'pending', '0/16B3748', now())`,
			[]string{"resync", "shop", "--new-slot", "-c", cfg}, exitFailure, "its initial snapshot is not done (pending)"},
		{"asked", `UPDATE tidemark.cdc_positions SET snapshot = 'done'`,
			[]string{"resync", "--new-slot", "-c", cfg, "shop"}, exitOK, "shop: a new slot asked for. The changes after 0/16B3748"},
		{"again", "", []string{"resync", "shop", "--new-slot", "-c", cfg}, exitOK, "a new slot is asked for already"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != "" {
				if _, err := wh.Exec(t.Context(), tc.setup); err != nil {
					t.Fatal(err)
				}
			}
			code, out, errOut := invoke(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Errorf("exit %d, want %d with %q:\n%s%s", code, tc.code, tc.want, out, errOut)
			}
		})
	}
	got := pgtest.Rows(t, wh, `SELECT slot || ' ' || system_id || ' ' || applied_lsn::text || ' ' || (resumed_lsn IS NULL)::text FROM tidemark.cdc_gaps`)
	if len(got) != 1 || got[0] != "tidemark_shop 7 0/16B3748 true" {
		t.Errorf("gaps %q, want one open gap after 0/16B3748", got)
	}
	if s := pgtest.Rows(t, wh, `SELECT snapshot FROM tidemark.cdc_positions`); len(s) != 1 || s[0] != "resync" {
		t.Errorf("snapshot state %q, want resync", s)
	}
}
