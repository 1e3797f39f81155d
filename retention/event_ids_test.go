package retention_test

import (
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestPruneEventIDs: a run deletes, in batches, the event ids of a source
// with dedupe.by: event_id loaded longer ago than its window, and the ids
// of sources the configuration does not dedupe loaded longer ago than the
// largest window.
func TestPruneEventIDs(t *testing.T) {
	w := newWarehouse(t, "correction")
	w.cfg.Sources["app_events"].Dedupe = &config.Dedupe{By: config.DedupeEventID, Window: config.Duration(7 * 24 * time.Hour)}
	now := at("2026-10-20 00:00")
	w.clock.Set(now)
	day := 24 * time.Hour
	// 12,000 ids past the window, more than one delete batch.
	w.exec(`INSERT INTO tidemark.event_ids (source, event_id, loaded_at)
		SELECT 'app_events', 'old' || i, $1 FROM generate_series(1, 12000) i`, now.Add(-7*day-time.Second))
	w.exec(`INSERT INTO tidemark.event_ids (source, event_id, loaded_at) VALUES
		('app_events', 'within', $1), ('app_events', 'edge', $2),
		('gone', 'recent', $3), ('gone', 'ancient', $4)`,
		now.Add(-6*day), now.Add(-7*day), now.Add(-300*day), now.Add(-config.MaxDedupeWindow-time.Second))
	p, _ := w.pruner()
	rep := w.prune(p, false)
	if got := table(rep, "tidemark.event_ids"); got.Rows != 12001 {
		t.Errorf("event ids removed: %+v, want 12001", got)
	}
	pgtest.Equal(t, "event ids left", w.rows("SELECT source || ' ' || event_id FROM tidemark.event_ids ORDER BY 1"),
		[]string{"app_events edge", "app_events within", "gone recent"})
}
