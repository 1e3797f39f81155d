package cdc

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

// TestConfirmedWithinRereadsThePosition: a slot confirmed beyond the
// position a reader read before it is refused only when the position read
// again is behind it too. In between, a reader that had lost the slot's
// lock without noticing may have applied and confirmed more; refusing
// then stopped the service with a false "another client consumed it".
func TestConfirmedWithinRereadsThePosition(t *testing.T) {
	pgtest.CitusIndependent(t)
	ctx := context.Background()
	pool, dsn := pgtest.NewPool(t)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	r := &Reader{conf: Config{Source: "shop"}, pool: pool, log: slog.New(slog.DiscardHandler)}
	lsn := func(s string) pglogrepl.LSN {
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	read := position{exists: true, systemID: "1", snapshot: "done", applied: lsn("0/200"), confirmed: lsn("0/100")}
	tests := []struct {
		name      string
		slot      string // the slot's confirmed position
		stored    string // applied_lsn stored since the position was read
		want      string // applied position returned
		wantError bool
	}{
		{"slot within the position read", "0/180", "0/200", "0/200", false},
		{"slot beyond it, another reader applied meanwhile", "0/300", "0/300", "0/300", false},
		{"slot beyond what the warehouse holds", "0/300", "0/280", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `INSERT INTO tidemark.cdc_positions (source, slot, system_id, snapshot, applied_lsn, confirmed_lsn, updated_at)
				VALUES ('shop', 'tidemark_shop', '1', 'done', $1::pg_lsn, '0/100', now())
				ON CONFLICT (source) DO UPDATE SET applied_lsn = excluded.applied_lsn`, tt.stored); err != nil {
				t.Fatal(err)
			}
			got, err := r.confirmedWithin(ctx, read, "tidemark_shop", lsn(tt.slot))
			if tt.wantError {
				if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), "beyond what tidemark applied (0/280)") {
					t.Fatalf("error %v, want a setup error naming 0/280", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.applied != lsn(tt.want) {
				t.Errorf("position applied %s, want %s", got.applied, tt.want)
			}
		})
	}
}
