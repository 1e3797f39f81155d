package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgtest"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/retention"
)

// retentionSetup loads one sale a day on 1 to 6 October, each reconciled
// as it arrives, with raw rows kept 3 days and ledger rows 1 day.
func retentionSetup(t *testing.T, policy string) *bundle {
	t.Helper()
	b := setup(t, 1, dailySales(policy))
	src := b.cfg.Sources["app_events"]
	src.Retention.Raw = config.Duration(3 * 24 * time.Hour)
	b.cfg.Retention.Ledger = config.Duration(24 * time.Hour)
	b.startIngest()
	r, _ := b.reconciler()
	for d := 1; d <= 6; d++ {
		day := fmt.Sprintf("2026-10-%02d", d)
		b.ingestAt(day+" 12:00", event(0, fmt.Sprintf("e%d", d), day+"T11:00:00Z", fmt.Sprint(d*10)))
		b.runOnce(r, "daily_sales")
	}
	return b
}

func (b *bundle) pruner() (*retention.Pruner, *prometheus.Registry) {
	b.t.Helper()
	reg := prometheus.NewRegistry()
	p, err := retention.New(b.cfg, b.pool, retention.Options{Now: b.clock.Now, Registerer: reg, Logger: testLogger(b.t)})
	if err != nil {
		b.t.Fatal(err)
	}
	return p, reg
}

func (b *bundle) prune(p *retention.Pruner, dryRun bool) *retention.Report {
	b.t.Helper()
	rep, err := p.Run(context.Background(), dryRun)
	if err != nil {
		b.t.Fatalf("prune (dry run %v): %v", dryRun, err)
	}
	return rep
}

// stateSnapshot renders the state retention may change, to show that a
// dry run changes none of it.
func (b *bundle) stateSnapshot() []string {
	b.t.Helper()
	var out []string
	for _, q := range []string{
		"SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'raw.app_events'::regclass ORDER BY 1",
		"SELECT count(*) FROM raw.app_events",
		"SELECT count(*) FROM tidemark.ingest_ledger",
		"SELECT partition_key || ' ' || state FROM tidemark.partitions ORDER BY 1",
		"SELECT count(*) FROM tidemark.raw_retention",
	} {
		out = append(out, strings.Join(b.rows(q), ","))
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
	b := retentionSetup(t, "correction")
	r, _ := b.reconciler()
	p, reg := b.pruner()
	sales := b.rows(salesSQL)

	// On the 10th, the 1st to the 6th are final (horizon 72h) and past the
	// raw retention (3d).
	b.clock.Set(at("2026-10-10 00:00"))
	b.runOnce(r, "daily_sales")
	// Two shadow builds: one older than retention.runs (90d), one not.
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO tidemark.shadow_builds (aggregate, partition_start, partition_end, run_id, snapshot_xmin, rows, archived, built_at)
		VALUES ('daily_sales', '2026-06-01', '2026-06-02', 1, '1', 1, false, '2026-06-02'),
		       ('daily_sales', '2026-10-01', '2026-10-02', 2, '1', 1, false, '2026-10-09')`); err != nil {
		t.Fatal(err)
	}
	before := b.stateSnapshot()
	dry := b.prune(p, true)
	pgtest.Equal(t, "state after a dry run", b.stateSnapshot(), before)
	if got, _ := promreg.Sum(reg, "tidemark_prune_rows_deleted_total"); got != 0 {
		t.Errorf("a dry run counted %v deleted rows", got)
	}

	real := b.prune(p, false)
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
	pgtest.Equal(t, "shadow builds left", b.rows("SELECT run_id FROM tidemark.shadow_builds"), []string{"2"})
	pgtest.Equal(t, "raw partitions left", b.rows(
		"SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'raw.app_events'::regclass ORDER BY 1"),
		nil)
	pgtest.Equal(t, "partition states", b.rows("SELECT partition_key || ' ' || state FROM tidemark.partitions ORDER BY 1"),
		[]string{"2026-10-01 archived", "2026-10-02 archived", "2026-10-03 archived", "2026-10-04 archived",
			"2026-10-05 archived", "2026-10-06 archived"})
	pgtest.Equal(t, "daily_sales after pruning", b.rows(salesSQL), sales)
	pgtest.Equal(t, "retention bound", b.rows("SELECT source, retained_from::text, partitions_dropped FROM tidemark.raw_retention"),
		[]string{"app_events | 2026-10-07 00:00:00+00 | 7"})
	if real.Archived["daily_sales"] != 6 {
		t.Errorf("archived: %v, want 6 of daily_sales", real.Archived)
	}

	// A second run finds nothing more.
	again := b.prune(p, false)
	for _, tb := range again.Tables {
		if tb.Rows != 0 || tb.Partitions != 0 {
			t.Errorf("second run removed %+v", tb)
		}
	}
}

func table(rep *retention.Report, name string) retention.Table {
	for _, t := range rep.Tables {
		if t.Name == name {
			return t
		}
	}
	return retention.Table{Name: name}
}

// TestArchivedPartitionsAreNeverRebuilt: after retention, a late event
// for an archived date follows the beyond-horizon policy (recorded,
// counted) under every policy, rebuild included; a backfill over the
// range is refused unless forced; verify does not compare archived
// partitions; and the published rows stay as they were.
func TestArchivedPartitionsAreNeverRebuilt(t *testing.T) {
	for _, policy := range []string{"correction", "arrival", "rebuild"} {
		t.Run(policy, func(t *testing.T) {
			b := retentionSetup(t, policy)
			r, reg := b.reconciler()
			p, _ := b.pruner()
			b.clock.Set(at("2026-10-10 00:00"))
			b.runOnce(r, "daily_sales")
			b.prune(p, false)
			sales := b.rows(salesSQL)

			// e2b happened on the 2nd (archived) and arrives on the 10th.
			b.ingestAt("2026-10-10 06:00", event(0, "e2b", "2026-10-02T09:00:00Z", "7"))
			rep := b.runOnce(r, "daily_sales")
			for _, l := range rep.Rebuilt {
				if l == "2026-10-02" {
					t.Errorf("the archived partition was rebuilt: %v", rep.Rebuilt)
				}
			}
			pgtest.Equal(t, "corrections", b.rows("SELECT event_key, policy, arrival_partition_start::date::text FROM tidemark.corrections"),
				[]string{"e2b|2026-10-02 09:00:00+00 | " + policy + " | 2026-10-10"})
			if n, _ := promreg.Sum(reg, "tidemark_reconcile_beyond_horizon_events_total"); n != 1 {
				t.Errorf("beyond-horizon events counted: %v, want 1", n)
			}
			want := sales
			if policy == "arrival" {
				// Counted on the day it arrived.
				want = append(append([]string(nil), sales...), "2026-10-10 | 7.00 | 1")
			}
			pgtest.Equal(t, "daily_sales", b.rows(salesSQL), want)
			pgtest.Equal(t, "state of the 2nd", b.rows("SELECT state FROM tidemark.partitions WHERE partition_key = '2026-10-02'"),
				[]string{"archived"})

			d, err := r.Definition(context.Background(), "daily_sales")
			if err != nil {
				t.Fatal(err)
			}
			_, err = backfill.Run(context.Background(), b.pool, d, backfill.Range{From: at("2026-10-01 00:00"), To: at("2026-10-08 00:00")},
				backfill.Options{Reprocess: backfill.Completed, Now: b.clock.Now})
			if !errors.Is(err, backfill.ErrArchivedRange) {
				t.Fatalf("backfill over archived partitions: %v, want ErrArchivedRange", err)
			}
			if !strings.Contains(err.Error(), "6 partitions in 2026-10-01 .. 2026-10-06") || !strings.Contains(err.Error(), "--force") {
				t.Errorf("refusal does not say what and how: %v", err)
			}
			pgtest.Equal(t, "daily_sales after the refused backfill", b.rows(salesSQL), want)

			checks, err := backfill.Verify(context.Background(), b.pool, d, nil)
			if err != nil {
				t.Fatal(err)
			}
			archived := 0
			for _, c := range checks {
				if c.Drifted() {
					t.Errorf("verify: %s drifted: %+v", c.Partition, c.Comparison)
				}
				if c.Archived {
					archived++
				}
			}
			if archived != 6 {
				t.Errorf("verify: %d archived partitions, want 6", archived)
			}

			// The one code path refuses too, whoever calls it.
			tx, err := b.pool.Begin(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			if _, err := aggregate.Rebuild(context.Background(), tx, d, d.Calendar.Of(at("2026-10-02 00:00")), b.clock.Now()); !errors.Is(err, aggregate.ErrArchived) {
				t.Errorf("Rebuild of an archived partition: %v, want ErrArchived", err)
			}
		})
	}
}

// TestPruneKeepsWhatIsStillNeeded: a raw partition past its retention stays
// while an aggregate partition it feeds is not final, is queued, or has
// loads its aggregate has not read; and the partitions after it stay too,
// so the retention bound never passes raw rows that are still needed.
func TestPruneKeepsWhatIsStillNeeded(t *testing.T) {
	tests := []struct {
		name    string
		arrange func(b *bundle)
		kept    string
	}{
		{"not final", func(b *bundle) {
			// Kept one day: 1 October is past it on the 4th, but final only
			// on the 5th.
			b.cfg.Sources["app_events"].Retention.Raw = config.Duration(24 * time.Hour)
			b.clock.Set(at("2026-10-04 12:00"))
		}, "is final only at 2026-10-05T00:00:00Z"},
		{"queued", func(b *bundle) {
			b.clock.Set(at("2026-10-10 00:00"))
			if _, err := b.pool.Exec(context.Background(), `INSERT INTO tidemark.pending_partitions (aggregate, partition_start, partition_end, reason, queued_at)
				VALUES ('daily_sales', '2026-10-01', '2026-10-02', 'late', now())`); err != nil {
				b.t.Fatal(err)
			}
		}, "queued for a rebuild"},
		{"unread load", func(b *bundle) {
			b.ingestAt("2026-10-10 00:00", event(0, "late", "2026-10-01T10:00:00Z", "1"))
			// Its ledger row is past the ledger retention too, but unread.
			b.clock.Set(at("2026-10-12 00:00"))
		}, "has not read every load into it yet"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := retentionSetup(t, "correction")
			p, reg := b.pruner()
			tc.arrange(b)
			for _, dry := range []bool{true, false} {
				rep := b.prune(p, dry)
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
			pgtest.Equal(t, "nothing archived", b.rows("SELECT count(*) FROM tidemark.partitions WHERE state = 'archived'"), []string{"0"})
			if tc.name == "unread load" {
				pgtest.Equal(t, "the unread load's ledger row", b.rows(
					"SELECT count(*) FROM tidemark.ingest_ledger WHERE min_event_time = '2026-10-01 10:00+00'"), []string{"1"})
			}
		})
	}
}

// TestPruneWaitsBoundedForABusyTable: dropping a raw partition waits at
// most retention.lock_timeout for the raw table; a reader that holds it
// longer puts the drop off to the next run, which drops it.
func TestPruneWaitsBoundedForABusyTable(t *testing.T) {
	b := retentionSetup(t, "correction")
	b.cfg.Retention.LockTimeout = config.Duration(200 * time.Millisecond)
	r, _ := b.reconciler()
	b.clock.Set(at("2026-10-10 00:00"))
	b.runOnce(r, "daily_sales")
	p, reg := b.pruner()

	ctx := context.Background()
	reader, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	if _, err := reader.Exec(ctx, "SELECT count(*) FROM raw.app_events"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	rep := b.prune(p, false)
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
	if raw := table(b.prune(p, false), "raw.app_events"); raw.Partitions != 7 {
		t.Errorf("the next run dropped %+v, want 7 partitions", raw)
	}
}
