package mirror_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/mirror"
)

// accountKeys is the size of the accounts example.
const accountKeys = 100

// guardEnv is the accounts example: the same 100 accounts (ids 10, 20, …
// 1000) at the source and in the mirror, and a reconciler with a delete
// limit (the default, 10%, unless changed), its own metrics and log.
type guardEnv struct {
	*keyEnv
	tbl     *mirror.Table
	deletes string
	limit   config.Percent
	reg     *prometheus.Registry
	log     syncbuf.Buffer
	k       *mirror.KeyReconciler
}

func newGuardEnv(t *testing.T, deletes string, limit config.Percent) *guardEnv {
	t.Helper()
	g := &guardEnv{keyEnv: newKeyEnv(t, "", ""), deletes: deletes, limit: limit, reg: prometheus.NewRegistry()}
	g.srcExec(`CREATE TABLE src_accounts (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
	g.srcExec(`INSERT INTO src_accounts SELECT 10 * g, '2026-10-05 10:00+00' FROM generate_series(1, $1::int) AS g`, accountKeys)
	g.tbl = g.mirror("accounts", "src_accounts", "dw_accounts", []string{"id"}, deletes)
	g.whExec(`INSERT INTO dw_accounts SELECT 10 * g, '2026-10-05 10:00+00', '2026-10-05 11:00+00' FROM generate_series(1, $1::int) AS g`, accountKeys)
	k, err := mirror.NewKeyReconciler(g.tbl, g.srcDSN, g.wh, mirror.KeyOptions{Now: g.clock.Now, Registerer: g.reg,
		MaxDelete: &limit, Logger: slog.New(slog.NewTextHandler(&g.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	g.k = k
	return g
}

// mirrorRows is the mirror as text, to compare before and after.
func (g *guardEnv) mirrorRows() []string {
	g.t.Helper()
	return g.rows(g.wh, `SELECT id, updated_at, loaded_at, deleted_at FROM dw_accounts ORDER BY id`)
}

// changed counts the mirror rows flagged (soft) or removed (hard).
func (g *guardEnv) changed() int64 {
	g.t.Helper()
	if g.deletes == config.DeletesHard {
		return accountKeys - g.int(g.wh, `SELECT count(*) FROM dw_accounts`)
	}
	return g.int(g.wh, `SELECT count(*) FROM dw_accounts WHERE deleted_at IS NOT NULL`)
}

// counter returns a counter of the reconciler's registry for source
// accounts (and result, for tidemark_key_reconcile_runs_total).
func (g *guardEnv) counter(name, result string) float64 {
	g.t.Helper()
	families, err := g.reg.Gather()
	if err != nil {
		g.t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if metricLabel(m, "source") == "accounts" && metricLabel(m, "result") == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	g.t.Fatalf("no series %s{source=accounts,result=%q}", name, result)
	return 0
}

func metricLabel(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// history returns the recorded runs, oldest first, as
// "dry_run | refused | forced | missing_at_source | applied".
func (g *guardEnv) history() []string {
	g.t.Helper()
	return g.rows(g.wh, `SELECT dry_run, refused, forced, missing_at_source, applied FROM tidemark.key_reconciliations ORDER BY id`)
}

// errorLines returns the log's error lines.
func (g *guardEnv) errorLines() []string {
	var out []string
	for _, l := range strings.Split(g.log.String(), "\n") {
		if strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return out
}

// run runs the reconciler and checks whether the limit refused it.
func (g *guardEnv) run(what string, dryRun, force, refused bool) mirror.KeyReport {
	g.t.Helper()
	run := g.k.Run
	if force {
		run = g.k.RunForced
	}
	rep, err := run(g.ctx, dryRun)
	switch {
	case refused && !dryRun:
		if !errors.Is(err, mirror.ErrKeyRefused) {
			g.t.Errorf("%s: error %v; want one wrapping ErrKeyRefused", what, err)
		}
	case err != nil:
		g.t.Fatalf("%s: %v", what, err)
	}
	if rep.Refused != refused || rep.Forced != force || rep.DryRun != dryRun {
		g.t.Errorf("%s: refused %v, forced %v, dry run %v; want %v, %v, %v", what, rep.Refused, rep.Forced, rep.DryRun, refused, force, dryRun)
	}
	if rep.MaxDelete == nil || *rep.MaxDelete != g.limit {
		g.t.Errorf("%s: report's limit %v, want %s", what, rep.MaxDelete, g.limit)
	}
	return rep
}

// accountIDs lists the ids from..to in steps of 10 as key texts.
func accountIDs(from, to int) []string {
	var out []string
	for id := from; id <= to; id += 10 {
		out = append(out, fmt.Sprint(id))
	}
	return out
}

// TestKeyReconcileGuard: a run that finds more mirror rows missing at the
// source than mirror.key_reconcile_max_delete allows (10% of 100 rows: 10)
// applies nothing, is recorded as refused, logs one error line and counts
// in tidemark_key_reconcile_refused_total, again on every run, until a
// forced run applies it. Dry runs say a run would be refused. Fewer
// deletes apply as before. Soft and hard deletes alike.
func TestKeyReconcileGuard(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change string // at the source
		// deleted keys missing at the source; refused by the limit; early
		// refused on the first level's counts, which are then lower bounds
		// (here exact); missing the keys listed by a run that descends.
		deleted  int64
		inMirror int64
		refused  bool
		early    bool
		missing  []string
		share    string
	}{{
		name: "truncate", change: `TRUNCATE src_accounts`,
		deleted: accountKeys, refused: true, early: true, missing: accountIDs(10, 1000), share: "100%",
	}, {
		name: "one over the limit", change: `DELETE FROM src_accounts WHERE id <= 110`,
		deleted: 11, refused: true, early: true, missing: accountIDs(10, 110), share: "11%",
	}, {
		// Each deleted key is replaced by a new one in the same range:
		// the first level's counts agree, so the run descends, lists the
		// keys and refuses after the re-check.
		name:    "deletes hidden by new rows",
		change:  `DELETE FROM src_accounts WHERE id <= 300; INSERT INTO src_accounts SELECT g - 5, now() FROM generate_series(10, 300, 10) AS g`,
		deleted: 30, inMirror: 30, refused: true, missing: accountIDs(10, 300), share: "30%",
	}, {
		name: "at the limit", change: `DELETE FROM src_accounts WHERE id > 900`,
		deleted: 10, missing: accountIDs(910, 1000),
	}, {
		name: "small delete", change: `DELETE FROM src_accounts WHERE id IN (500, 730, 1000)`,
		deleted: 3, missing: []string{"500", "730", "1000"},
	}} {
		for _, deletes := range []string{config.DeletesSoft, config.DeletesHard} {
			t.Run(tc.name+"/"+deletes, func(t *testing.T) {
				g := newGuardEnv(t, deletes, config.DefaultKeyReconcileMaxDelete)
				g.srcExec(tc.change)
				before := g.mirrorRows()
				sourceKeys := g.int(g.src, `SELECT count(*) FROM src_accounts`)

				rep := g.run("dry run", true, false, tc.refused)
				want := found{sourceKeys: sourceKeys, mirrorKeys: accountKeys, missing: tc.missing, deleted: tc.deleted, inMirror: tc.inMirror}
				if tc.early {
					want.missing = []string{}
				}
				checkFound(t, "dry run", rep, want)
				if rep.Allowed != 10 || rep.DeletedAtLeast != tc.early {
					t.Errorf("dry run: allowed %d, deleted at least %v; want 10, %v", rep.Allowed, rep.DeletedAtLeast, tc.early)
				}

				if !tc.refused {
					rep = g.run("run", false, false, false)
					want.applied = tc.deleted
					checkFound(t, "run", rep, want)
					if n := g.changed(); n != tc.deleted {
						t.Errorf("%d mirror rows changed; want %d", n, tc.deleted)
					}
					if n := g.counter("tidemark_key_reconcile_refused_total", ""); n != 0 {
						t.Errorf("refused runs counted: %v", n)
					}
					pgtest.Equal(t, "history", g.history(), []string{
						fmt.Sprintf("true | false | false | %d | 0", tc.deleted),
						fmt.Sprintf("false | false | false | %[1]d | %[1]d", tc.deleted),
					})
					return
				}

				// Refused, twice (as the periodic loop does): nothing changes.
				for i := 1; i <= 2; i++ {
					what := fmt.Sprintf("run %d", i)
					rep = g.run(what, false, false, true)
					checkFound(t, what, rep, want)
					pgtest.Equal(t, what+": mirror", g.mirrorRows(), before)
					if n := g.counter("tidemark_key_reconcile_refused_total", ""); n != float64(i) {
						t.Errorf("%s: tidemark_key_reconcile_refused_total %v, want %d", what, n, i)
					}
					if n := g.counter("tidemark_key_reconcile_runs_total", "error"); n != float64(i) {
						t.Errorf("%s: runs with result error %v, want %d", what, n, i)
					}
				}
				lines := g.errorLines()
				if len(lines) != 2 {
					t.Fatalf("error lines:\n%s\nwant one per refused run", g.log.String())
				}
				count := fmt.Sprint(tc.deleted)
				if tc.early {
					count = "\"at least " + count + "\""
				}
				for _, part := range []string{`msg="key reconciliation refused: more mirror rows are missing at the source than mirror.key_reconcile_max_delete allows; nothing was applied"`,
					"missing_at_source=" + count, "mirror_keys=100", "share=" + tc.share, "max_delete=10%", "allowed=10",
					"`tidemark keys --source accounts --force`"} {
					if !strings.Contains(lines[0], part) {
						t.Errorf("the error line lacks %s:\n%s", part, lines[0])
					}
				}

				// A forced dry run lists every key; a forced run applies them.
				rep = g.run("forced dry run", true, true, false)
				exact := want
				exact.missing = tc.missing
				checkFound(t, "forced dry run", rep, exact)
				rep = g.run("forced run", false, true, false)
				exact.applied = tc.deleted
				checkFound(t, "forced run", rep, exact)
				if n := g.changed(); n != tc.deleted {
					t.Errorf("%d mirror rows changed by the forced run; want %d", n, tc.deleted)
				}
				// What is left is within the limit again.
				rep = g.run("run after the forced run", false, false, false)
				checkFound(t, "run after the forced run", rep, found{sourceKeys: sourceKeys, mirrorKeys: accountKeys - tc.deleted,
					missing: []string{}, inMirror: tc.inMirror})
				if n := g.counter("tidemark_key_reconcile_refused_total", ""); n != 2 {
					t.Errorf("tidemark_key_reconcile_refused_total %v after the forced run, want 2", n)
				}
				pgtest.Equal(t, "history", g.history(), []string{
					fmt.Sprintf("true | true | false | %d | 0", tc.deleted),
					fmt.Sprintf("false | true | false | %d | 0", tc.deleted),
					fmt.Sprintf("false | true | false | %d | 0", tc.deleted),
					fmt.Sprintf("true | false | true | %d | 0", tc.deleted),
					fmt.Sprintf("false | false | true | %[1]d | %[1]d", tc.deleted),
					"false | false | false | 0 | 0",
				})
			})
		}
	}
}

// TestKeyReconcileGuardError: the error of a refused run says what was
// found, the limit and its key.
func TestKeyReconcileGuardError(t *testing.T) {
	g := newGuardEnv(t, config.DeletesSoft, config.DefaultKeyReconcileMaxDelete)
	g.srcExec(`TRUNCATE src_accounts`)
	_, err := g.k.Run(g.ctx, false)
	want := "keys accounts: refused by mirror.key_reconcile_max_delete: at least 100 of 100 mirror rows (100%) are missing at the source, more than 10% (10 rows); nothing was applied"
	if err == nil || err.Error() != want {
		t.Errorf("error %v\nwant %s", err, want)
	}
}

// TestKeyReconcileGuardLimits: 100% lets a run empty the mirror; 0%
// refuses every delete; a limit rounds up to whole rows.
func TestKeyReconcileGuardLimits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   config.Percent
		change  string
		deleted int64
		refused bool
	}{
		{name: "100% applies a truncate", limit: 100 * config.PercentUnit, change: `TRUNCATE src_accounts`, deleted: accountKeys},
		{name: "0% refuses one delete", limit: 0, change: `DELETE FROM src_accounts WHERE id = 500`, deleted: 1, refused: true},
		{name: "0.5% of 100 rows allows 1", limit: 50, change: `DELETE FROM src_accounts WHERE id = 500`, deleted: 1},
		{name: "0.5% of 100 rows refuses 2", limit: 50, change: `DELETE FROM src_accounts WHERE id IN (500, 600)`, deleted: 2, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuardEnv(t, config.DeletesHard, tc.limit)
			g.srcExec(tc.change)
			rep := g.run("run", false, false, tc.refused)
			if rep.Deleted != tc.deleted {
				t.Errorf("%d missing at the source, want %d", rep.Deleted, tc.deleted)
			}
			want := tc.deleted
			if tc.refused {
				want = 0
			}
			if n := g.changed(); n != want || rep.Applied != want {
				t.Errorf("%d mirror rows removed, %d applied; want %d", n, rep.Applied, want)
			}
		})
	}
}
