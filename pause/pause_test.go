package pause_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/pause"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	if _, err := migrate.Up(context.Background(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestSetClearList: a pause stands until it is cleared; pausing a paused
// source keeps the first pause; clearing a source not paused says so.
func TestSetClearList(t *testing.T) {
	ctx := context.Background()
	pool := migrated(t)
	at := time.Date(2026, 12, 7, 14, 50, 0, 0, time.UTC)
	first := pause.Pause{Source: "orders", Since: at, By: "alice", Reason: "reindexing"}

	for i, tc := range []struct {
		p         pause.Pause
		want      pause.Pause
		wantAdded bool
	}{
		{first, first, true},
		{pause.Pause{Source: "orders", Since: at.Add(time.Hour), By: "bob"}, first, false},
		{pause.Pause{Source: "shop", Since: at, By: "bob"}, pause.Pause{Source: "shop", Since: at, By: "bob"}, true},
	} {
		got, added, err := pause.Set(ctx, pool, tc.p)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Since.Equal(tc.want.Since) || got.By != tc.want.By || got.Reason != tc.want.Reason || added != tc.wantAdded {
			t.Errorf("Set %d: %+v added %v, want %+v added %v", i, got, added, tc.want, tc.wantAdded)
		}
	}
	if got := first.String(); got != "since 2026-12-07T14:50:00Z by alice: reindexing" {
		t.Errorf("String: %q", got)
	}
	list, err := pause.List(ctx, pool)
	if err != nil || len(list) != 2 || list[0].Source != "orders" || list[1].Source != "shop" {
		t.Fatalf("List: %+v, %v", list, err)
	}
	p, was, err := pause.Clear(ctx, pool, "orders")
	if err != nil || !was || p.By != "alice" {
		t.Errorf("Clear orders: %+v %v %v", p, was, err)
	}
	if _, was, err := pause.Clear(ctx, pool, "orders"); err != nil || was {
		t.Errorf("Clear orders again: %v %v, want not paused", was, err)
	}
	if list, _ := pause.List(ctx, pool); len(list) != 1 || list[0].Source != "shop" {
		t.Errorf("List after Clear: %+v", list)
	}
}

// TestWatch: a Watch answers what it last read, and exports a series per
// configured source.
func TestWatch(t *testing.T) {
	ctx := context.Background()
	pool := migrated(t)
	reg := prometheus.NewRegistry()
	w := pause.NewWatch(pool, []string{"orders", "shop"}, pause.WatchOptions{Registerer: reg})
	gauge := func(name, source string) float64 {
		t.Helper()
		v, err := promreg.SumWhere(reg, name, "source", source)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if err := w.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if w.IsPaused("orders") || gauge("tidemark_source_paused", "orders") != 0 {
		t.Fatal("orders paused before any pause")
	}
	at := time.Date(2026, 12, 7, 14, 50, 0, 0, time.UTC)
	if _, _, err := pause.Set(ctx, pool, pause.Pause{Source: "orders", Since: at, By: "alice"}); err != nil {
		t.Fatal(err)
	}
	if w.IsPaused("orders") {
		t.Fatal("the Watch saw the pause before reading the table again")
	}
	if err := w.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if p, ok := w.Paused("orders"); !ok || p.By != "alice" || w.IsPaused("shop") {
		t.Errorf("Paused(orders) = %+v %v, shop %v", p, ok, w.IsPaused("shop"))
	}
	if gauge("tidemark_source_paused", "orders") != 1 || gauge("tidemark_source_paused_since_timestamp_seconds", "orders") != float64(at.Unix()) {
		t.Error("the gauges do not show the pause of orders")
	}
	if _, _, err := pause.Clear(ctx, pool, "orders"); err != nil {
		t.Fatal(err)
	}
	if err := w.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if w.IsPaused("orders") || gauge("tidemark_source_paused", "orders") != 0 || gauge("tidemark_source_paused_since_timestamp_seconds", "orders") != 0 {
		t.Error("orders still shows as paused after the resume")
	}
}
