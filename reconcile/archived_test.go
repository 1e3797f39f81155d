package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/aggregate"
	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
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

const salesSQL = "SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1"

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
