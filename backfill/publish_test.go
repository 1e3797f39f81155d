package backfill_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/internal/pgtest"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// TestPublishShadow: after a shadow run of a changed query, publishing
// swaps in exactly what the shadow run built and compared, even when a
// late event arrived after it and the reconciler has already rebuilt a
// partition with it; that partition is queued again, and the next
// reconcile run adds the event. A partition no shadow run built, or built
// longer ago than the ledger retention, is not published.
func TestPublishShadow(t *testing.T) {
	w := newWarehouse(t, "correction")
	for i, day := range []string{"01", "02", "03"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", i+1)
	}
	if _, err := w.backfill("2026-09-01", "2026-09-03", backfill.Options{}); err != nil {
		t.Fatal(err)
	}
	fixedCfg, fixed := w.definition(w.cfg.Warehouse.DSN, "correction",
		`SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) + CASE WHEN {{partition}} = DATE '2026-09-02' THEN 10 ELSE 0 END AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1`)
	now := func() time.Time { return w.now }
	if _, err := backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-03"), backfill.Options{Shadow: true, Now: now}); err != nil {
		t.Fatal(err)
	}
	shadow := w.rows("SELECT sale_date::text, total::text, event_count FROM daily_sales__shadow ORDER BY 1")

	// A late sale for the 3rd arrives, and the reconciler (running the
	// changed query already) rebuilds the 3rd with it before the publish.
	w.exec("UPDATE tidemark.load_watermarks SET load_xid = pg_snapshot_xmin(pg_current_snapshot()) WHERE aggregate = 'daily_sales'")
	w.sale("late", "2026-09-03 11:00", 5)
	r, err := reconcile.New(fixedCfg, w.pool, reconcile.Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunOnce(context.Background(), "daily_sales", true)
	if err != nil || strings.Join(rep.Rebuilt, ",") != "2026-09-03" {
		t.Fatalf("reconcile: %v %+v", err, rep)
	}

	pub, err := backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-04"), backfill.Options{Publish: true, Now: now, ShadowMaxAge: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Equal(t, "published: exactly the shadow", w.sales(), shadow)
	if len(pub.Failed) != 1 || pub.Failed[0].Chunk.Label() != "2026-09-04" || !errors.Is(pub.Failed[0].Err, backfill.ErrNoShadow) {
		t.Errorf("publish failures: %+v, want 2026-09-04 without a shadow", pub.Failed)
	}
	pgtest.Equal(t, "queued again", w.rows("SELECT partition_start::date::text, reason FROM tidemark.pending_partitions"),
		[]string{"2026-09-03 | published"})
	pgtest.Equal(t, "recorded run", w.rows("SELECT kind, status, chunks_done, chunks_failed FROM tidemark.backfill_runs ORDER BY id DESC LIMIT 1"),
		[]string{"publish | failed | 3 | 1"})

	if rep, err = r.RunOnce(context.Background(), "daily_sales", true); err != nil || strings.Join(rep.Rebuilt, ",") != "2026-09-03" {
		t.Fatalf("reconcile after the publish: %v %+v", err, rep)
	}
	pgtest.Equal(t, "after the next reconcile run", w.sales(), []string{"2026-09-01 | 1.00 | 1", "2026-09-02 | 12.00 | 1", "2026-09-03 | 8.00 | 2"})

	// Two days later the shadow is older than a one-day ledger retention.
	later := func() time.Time { return w.now.Add(48 * time.Hour) }
	old, err := backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-01"), backfill.Options{Publish: true, Now: later, ShadowMaxAge: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(old.Failed) != 1 || !strings.Contains(old.Failed[0].Err.Error(), "longer ago than retention.ledger") {
		t.Errorf("publishing an old shadow: %+v", old.Failed)
	}
}
