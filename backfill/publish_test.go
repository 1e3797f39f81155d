package backfill_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
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

	// A range holding a day no shadow run built is refused whole,
	// before anything is published.
	_, err = backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-04"), backfill.Options{Publish: true, Now: now, ShadowMaxAge: 24 * time.Hour})
	if !errors.Is(err, backfill.ErrNoShadow) || !strings.Contains(err.Error(), "partition 2026-09-04 has no shadow build") ||
		!strings.Contains(err.Error(), "--from 2026-09-04 --to 2026-09-04 --shadow") {
		t.Fatalf("publishing a range with a day never built: %v", err)
	}
	pgtest.Equal(t, "nothing published", w.sales(), []string{"2026-09-01 | 1.00 | 1", "2026-09-02 | 2.00 | 1", "2026-09-03 | 8.00 | 2"})

	pub, err := backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-03"), backfill.Options{Publish: true, Now: now, ShadowMaxAge: 24 * time.Hour})
	if err != nil || len(pub.Failed) != 0 || pub.Done != 3 {
		t.Fatalf("publish: %v %+v", err, pub)
	}
	pgtest.Equal(t, "published: exactly the shadow", w.sales(), shadow)
	pgtest.Equal(t, "queued again", w.rows("SELECT partition_start::date::text, reason FROM tidemark.pending_partitions"),
		[]string{"2026-09-03 | published"})
	pgtest.Equal(t, "recorded run", w.rows("SELECT kind, status, chunks_done, chunks_failed FROM tidemark.backfill_runs ORDER BY id DESC LIMIT 1"),
		[]string{"publish | done | 3 | 0"})

	if rep, err = r.RunOnce(context.Background(), "daily_sales", true); err != nil || strings.Join(rep.Rebuilt, ",") != "2026-09-03" {
		t.Fatalf("reconcile after the publish: %v %+v", err, rep)
	}
	pgtest.Equal(t, "after the next reconcile run", w.sales(), []string{"2026-09-01 | 1.00 | 1", "2026-09-02 | 12.00 | 1", "2026-09-03 | 8.00 | 2"})

	// Two days later a new shadow of the 1st is older than a one-day
	// ledger retention.
	if _, err := backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-01"), backfill.Options{Shadow: true, Now: now}); err != nil {
		t.Fatal(err)
	}
	later := func() time.Time { return w.now.Add(48 * time.Hour) }
	_, err = backfill.Run(w.ctx, w.pool, fixed, dates(t, "2026-09-01", "2026-09-01"), backfill.Options{Publish: true, Now: later, ShadowMaxAge: 24 * time.Hour})
	if !errors.Is(err, backfill.ErrNoShadow) || !strings.Contains(err.Error(), "longer ago than retention.ledger") {
		t.Errorf("publishing an old shadow: %v", err)
	}
}

// onMessage is a slog handler that calls do for every record whose
// message is msg: a hook into a run at a point it logs.
type onMessage struct {
	msg string
	do  func()
}

func (h onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.do()
	}
	return nil
}
func (h onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onMessage) WithGroup(string) slog.Handler      { return h }

// TestPublishOnce: a shadow build is published at most once. Publishing
// the same range again is refused and changes nothing (it used to copy in
// the shadow, emptied by the first publish, wiping the partitions); a
// range where one day has a new build publishes that day and leaves the
// other alone; an interrupted publish, between chunks or inside one,
// resumes with what it had not published; a shadow table emptied since
// the build is refused. At the end every partition equals a rebuild.
func TestPublishOnce(t *testing.T) {
	w := newWarehouse(t, "correction")
	for i, day := range []string{"01", "02", "03", "04"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", i+1)
	}
	if _, err := w.backfill("2026-09-01", "2026-09-04", backfill.Options{}); err != nil {
		t.Fatal(err)
	}
	// The fixed query adds 10 to every day.
	_, fixed := w.definition(w.cfg.Warehouse.DSN, "correction",
		`SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) + 10 AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1`)
	run := func(from, to string, opts backfill.Options) (*backfill.Report, error) {
		t.Helper()
		opts.Now = func() time.Time { return w.now }
		return backfill.Run(w.ctx, w.pool, fixed, dates(t, from, to), opts)
	}
	if _, err := run("2026-09-01", "2026-09-04", backfill.Options{Shadow: true}); err != nil {
		t.Fatal(err)
	}
	status := func() []string {
		t.Helper()
		return w.rows("SELECT partition_start::date::text, rows FROM tidemark.partitions ORDER BY 1")
	}

	if rep, err := run("2026-09-01", "2026-09-02", backfill.Options{Publish: true}); err != nil || rep.Done != 2 || rep.Rows != 2 {
		t.Fatalf("publish: %v %+v", err, rep)
	}
	want := []string{"2026-09-01 | 11.00 | 1", "2026-09-02 | 12.00 | 1", "2026-09-03 | 3.00 | 1", "2026-09-04 | 4.00 | 1"}
	pgtest.Equal(t, "published", w.sales(), want)

	// The same publish again is refused: its builds are published.
	_, err := run("2026-09-01", "2026-09-02", backfill.Options{Publish: true})
	if !errors.Is(err, backfill.ErrPublished) || !strings.Contains(err.Error(), "run backfill --shadow over the range first") {
		t.Fatalf("second publish: %v", err)
	}
	pgtest.Equal(t, "after the second publish", w.sales(), want)
	pgtest.Equal(t, "partitions' rows after the second publish", status(),
		[]string{"2026-09-01 | 1", "2026-09-02 | 1", "2026-09-03 | 1", "2026-09-04 | 1"})

	// A new build of the 2nd only, published over the 1st and 2nd: the
	// 1st's build is published already and left alone.
	w.sale("late02", "2026-09-02 11:00", 5)
	if _, err := run("2026-09-02", "2026-09-02", backfill.Options{Shadow: true}); err != nil {
		t.Fatal(err)
	}
	rep, err := run("2026-09-01", "2026-09-02", backfill.Options{Publish: true})
	if err != nil || rep.Done != 1 || rep.Skipped != 1 {
		t.Fatalf("publish over a new build and a published one: %v %+v", err, rep)
	}
	if !strings.HasPrefix(rep.Chunks[0].Reason, "already published: the build of run 2 was published by run 3") {
		t.Errorf("the published day's reason: %q", rep.Chunks[0].Reason)
	}
	want[1] = "2026-09-02 | 17.00 | 2"
	pgtest.Equal(t, "a new build of the 2nd published", w.sales(), want)

	// A publish interrupted after its first chunk (the process stopped)
	// resumes with the chunk it had not published.
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	_, err = backfill.Run(ctx, w.pool, fixed, dates(t, "2026-09-03", "2026-09-04"), backfill.Options{Publish: true,
		Now: func() time.Time { return w.now }, Logger: slog.New(onMessage{"chunk done", cancel})})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted publish: %v", err)
	}
	want[2] = "2026-09-03 | 13.00 | 1"
	pgtest.Equal(t, "interrupted after the 3rd", w.sales(), want)
	rep, err = run("2026-09-03", "2026-09-04", backfill.Options{Publish: true})
	if err != nil || rep.Done != 1 || rep.Skipped != 1 || labels(rep.Chunks, true)[0] != "2026-09-04" {
		t.Fatalf("resumed publish: %v %+v", err, rep)
	}
	want[3] = "2026-09-04 | 14.00 | 1"
	pgtest.Equal(t, "resumed", w.sales(), want)

	// Inside a chunk: the 3rd was published, the chunk of the 3rd and 4th
	// publishes the 4th only.
	if _, err := run("2026-09-03", "2026-09-04", backfill.Options{Shadow: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := run("2026-09-03", "2026-09-03", backfill.Options{Publish: true}); err != nil {
		t.Fatal(err)
	}
	w.exec("UPDATE daily_sales__shadow SET total = total + 100 WHERE sale_date = '2026-09-03'")
	if rep, err = run("2026-09-03", "2026-09-04", backfill.Options{Publish: true, Chunk: 48 * time.Hour}); err != nil || rep.Done != 1 || rep.Rows != 1 {
		t.Fatalf("publish of a chunk half published: %v %+v", err, rep)
	}
	pgtest.Equal(t, "the half-published chunk", w.sales(), want)

	// A shadow emptied since its build is not published.
	if _, err := run("2026-09-01", "2026-09-01", backfill.Options{Shadow: true}); err != nil {
		t.Fatal(err)
	}
	w.exec("TRUNCATE daily_sales__shadow")
	rep, err = run("2026-09-01", "2026-09-01", backfill.Options{Publish: true})
	if err != nil || len(rep.Failed) != 1 || !errors.Is(rep.Failed[0].Err, backfill.ErrShadowChanged) {
		t.Fatalf("publishing an emptied shadow: %v %+v", err, rep)
	}
	pgtest.Equal(t, "after a refused publish", w.sales(), want)

	checks, err := backfill.Verify(w.ctx, w.pool, fixed, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		if c.Drifted() {
			t.Errorf("verify %s: %+v", c.Partition, c.Comparison)
		}
	}
	if len(checks) != 4 {
		t.Errorf("verified %d partitions, want 4", len(checks))
	}
}
