package retention_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/retention"
)

// stateSnapshot renders the state retention may change, to show that a
// dry run changes none of it.
func (w *warehouse) stateSnapshot() []string {
	w.t.Helper()
	var out []string
	for _, q := range []string{
		"SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'raw.app_events'::regclass ORDER BY 1",
		"SELECT count(*) FROM raw.app_events",
		"SELECT count(*) FROM tidemark.ingest_ledger",
		"SELECT partition_key || ' ' || state FROM tidemark.partitions ORDER BY 1",
		"SELECT count(*) FROM tidemark.raw_retention",
	} {
		out = append(out, strings.Join(w.rows(q), ","))
	}
	return out
}

const salesSQL = "SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1"

// TestPruneDropsWhatRetentionNoLongerKeeps: a dry run reports what a run
// removes and changes nothing; the run then removes exactly that, drops
// whole raw partitions, archives the aggregate partitions they fed, keeps
// the published rows, and prunes the ledger only below every aggregate's
// load watermark.
func TestPruneDropsWhatRetentionNoLongerKeeps(t *testing.T) {
	w := newWarehouse(t, "correction")
	w.salesUntilThe6th()
	r := w.reconciler()
	p, reg := w.pruner()
	sales := w.rows(salesSQL)

	// On the 10th, the 1st to the 6th are final (horizon 72h) and past the
	// raw retention (3d).
	w.clock.Set(at("2026-10-10 00:00"))
	w.reconcile(r)
	// Two shadow builds: one older than retention.runs (90d), one not.
	w.exec(`INSERT INTO tidemark.shadow_builds (aggregate, partition_start, partition_end, run_id, snapshot_xmin, rows, archived, built_at)
		VALUES ('daily_sales', '2026-06-01', '2026-06-02', 1, '1', 1, false, '2026-06-02'),
		       ('daily_sales', '2026-10-01', '2026-10-02', 2, '1', 1, false, '2026-10-09')`)
	before := w.stateSnapshot()
	dry := w.prune(p, true)
	pgtest.Equal(t, "state after a dry run", w.stateSnapshot(), before)
	if got, _ := promreg.Sum(reg, "tidemark_prune_rows_deleted_total"); got != 0 {
		t.Errorf("a dry run counted %v deleted rows", got)
	}

	real := w.prune(p, false)
	if !reflect.DeepEqual(dry.Tables, real.Tables) || !reflect.DeepEqual(dry.Archived, real.Archived) {
		t.Errorf("the run removed other than the dry run said:\n dry %+v %v\nreal %+v %v", dry.Tables, dry.Archived, real.Tables, real.Archived)
	}
	raw := table(real, "raw.app_events")
	// The ingester precreated 30 September (empty); 1 to 6 October hold a
	// sale each. All end by the 7th, three days before the clock.
	if raw.Partitions != 7 || raw.Rows != 6 || raw.Bytes <= 0 {
		t.Errorf("raw.app_events: %+v, want 7 partitions and 6 rows", raw)
	}
	if ledger := table(real, "tidemark.ingest_ledger"); ledger.Rows != 6 {
		t.Errorf("ledger rows removed: %+v, want the 6 loads older than a day", ledger)
	}
	if shadow := table(real, "tidemark.shadow_builds"); shadow.Rows != 1 {
		t.Errorf("shadow builds removed: %+v, want the one older than retention.runs", shadow)
	}
	pgtest.Equal(t, "shadow builds left", w.rows("SELECT run_id FROM tidemark.shadow_builds"), []string{"2"})
	pgtest.Equal(t, "raw partitions left", w.rows(
		"SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'raw.app_events'::regclass ORDER BY 1"),
		nil)
	pgtest.Equal(t, "partition states", w.rows("SELECT partition_key || ' ' || state FROM tidemark.partitions ORDER BY 1"),
		[]string{"2026-10-01 archived", "2026-10-02 archived", "2026-10-03 archived", "2026-10-04 archived",
			"2026-10-05 archived", "2026-10-06 archived"})
	pgtest.Equal(t, "daily_sales after pruning", w.rows(salesSQL), sales)
	pgtest.Equal(t, "retention bound", w.rows("SELECT source, retained_from::text, partitions_dropped FROM tidemark.raw_retention"),
		[]string{"app_events | 2026-10-07 00:00:00+00 | 7"})
	if real.Archived["daily_sales"] != 6 {
		t.Errorf("archived: %v, want 6 of daily_sales", real.Archived)
	}

	// A second run finds nothing more.
	again := w.prune(p, false)
	for _, tb := range again.Tables {
		if tb.Rows != 0 || tb.Partitions != 0 {
			t.Errorf("second run removed %+v", tb)
		}
	}
}

// TestPruneKeepsWhatIsStillNeeded: a raw partition past its retention stays
// while an aggregate partition it feeds is not final, is queued, or has
// loads its aggregate has not read; and the partitions after it stay too,
// so the retention bound never passes raw rows that are still needed.
func TestPruneKeepsWhatIsStillNeeded(t *testing.T) {
	tests := []struct {
		name    string
		arrange func(w *warehouse)
		kept    string
	}{
		{"not final", func(w *warehouse) {
			// Kept one day: 1 October is past it on the 4th, but final only
			// on the 5th.
			w.cfg.Sources["app_events"].Retention.Raw = config.Duration(24 * time.Hour)
			w.clock.Set(at("2026-10-04 12:00"))
		}, "is final only at 2026-10-05T00:00:00Z"},
		{"queued", func(w *warehouse) {
			w.clock.Set(at("2026-10-10 00:00"))
			w.exec(`INSERT INTO tidemark.pending_partitions (aggregate, partition_start, partition_end, reason, queued_at)
				VALUES ('daily_sales', '2026-10-01', '2026-10-02', 'late', now())`)
		}, "queued for a rebuild"},
		{"unread load", func(w *warehouse) {
			w.loadAt("2026-10-10 00:00", "late", "2026-10-01T10:00:00Z", 1)
			// Its ledger row is past the ledger retention too, but unread.
			w.clock.Set(at("2026-10-12 00:00"))
		}, "has not read every load into it yet"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWarehouse(t, "correction")
			w.salesUntilThe6th()
			p, reg := w.pruner()
			tc.arrange(w)
			for _, dry := range []bool{true, false} {
				rep := w.prune(p, dry)
				if raw := table(rep, "raw.app_events"); raw.Partitions != 1 {
					// Only the empty 30 September goes: it feeds nothing.
					t.Errorf("dry run %v: dropped %+v, want only 30 September", dry, raw)
				}
				if got := rep.Sources[0].Kept; !strings.Contains(got, "app_events_p20261001") || !strings.Contains(got, tc.kept) {
					t.Errorf("dry run %v: kept %q, want 1 October kept because %q", dry, got, tc.kept)
				}
			}
			if got, _ := promreg.Sum(reg, "tidemark_prune_kept_partitions"); got < 1 {
				t.Errorf("tidemark_prune_kept_partitions = %v", got)
			}
			pgtest.Equal(t, "nothing archived", w.rows("SELECT count(*) FROM tidemark.partitions WHERE state = 'archived'"), []string{"0"})
			if tc.name == "unread load" {
				pgtest.Equal(t, "the unread load's ledger row", w.rows(
					"SELECT count(*) FROM tidemark.ingest_ledger WHERE min_event_time = '2026-10-01 10:00+00'"), []string{"1"})
			}
		})
	}
}

// TestPruneWaitsBoundedForABusyTable: dropping a raw partition waits at
// most retention.lock_timeout for the raw table; a reader that holds it
// longer puts the drop off to the next run, which drops it.
func TestPruneWaitsBoundedForABusyTable(t *testing.T) {
	w := newWarehouse(t, "correction")
	w.salesUntilThe6th()
	w.cfg.Retention.LockTimeout = config.Duration(200 * time.Millisecond)
	w.clock.Set(at("2026-10-10 00:00"))
	w.reconcile(w.reconciler())
	p, reg := w.pruner()

	ctx := context.Background()
	reader, err := w.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	if _, err := reader.Exec(ctx, "SELECT count(*) FROM raw.app_events"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	rep := w.prune(p, false)
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("prune took %s behind a busy table; the lock timeout is 200ms", took)
	}
	if raw := table(rep, "raw.app_events"); raw.Partitions != 0 || !strings.Contains(rep.Sources[0].Kept, "busy") {
		t.Errorf("with the table busy: dropped %+v, kept %q", raw, rep.Sources[0].Kept)
	}
	if n, _ := promreg.Sum(reg, "tidemark_prune_lock_timeouts_total"); n != 1 {
		t.Errorf("tidemark_prune_lock_timeouts_total = %v, want 1", n)
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if raw := table(w.prune(p, false), "raw.app_events"); raw.Partitions != 7 {
		t.Errorf("the next run dropped %+v, want 7 partitions", raw)
	}
}

// TestRunStandsByWhileAnotherPrunes: one process prunes at a time; a run
// that finds another at it returns ErrBusy, counted as busy, and removes
// nothing.
func TestRunStandsByWhileAnotherPrunes(t *testing.T) {
	w := newWarehouse(t, "correction")
	w.salesUntilThe6th()
	w.clock.Set(at("2026-10-10 00:00"))
	w.reconcile(w.reconciler())
	p, reg := w.pruner()
	release := w.holdPruneLock()
	if _, err := p.Run(context.Background(), false); !errors.Is(err, retention.ErrBusy) {
		t.Fatalf("Run beside another pruner = %v, want ErrBusy", err)
	}
	if n, _ := promreg.SumWhere(reg, "tidemark_prune_runs_total", "result", "busy"); n != 1 {
		t.Errorf("busy runs %v, want 1", n)
	}
	release()
	if raw := table(w.prune(p, false), "raw.app_events"); raw.Partitions != 7 {
		t.Errorf("the run after the other dropped %+v, want 7 partitions", raw)
	}
}

// holdPruneLock takes the lock a pruning process holds, from a session of
// its own, until the returned function releases it (or the test ends).
func (w *warehouse) holdPruneLock() (release func()) {
	w.t.Helper()
	ctx := context.Background()
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended('tidemark.prune', 0))"); err != nil {
		conn.Release()
		w.t.Fatal(err)
	}
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
			w.t.Error(err)
		}
		conn.Release()
	}
	w.t.Cleanup(release)
	return release
}
