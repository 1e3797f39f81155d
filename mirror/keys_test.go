package mirror_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/testenv"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/mirror"
)

// keyEnv is a source database and a migrated warehouse.
type keyEnv struct {
	t      *testing.T
	ctx    context.Context
	src    *pgxpool.Pool
	srcDSN string
	wh     *pgxpool.Pool
	whDSN  string
	clock  *clock.Settable
}

// newKeyEnv makes the two databases; a non-empty srcDSN or whDSN is used
// instead of a fresh database.
func newKeyEnv(t *testing.T, srcDSN, whDSN string) *keyEnv {
	t.Helper()
	e := &keyEnv{t: t, ctx: context.Background(), srcDSN: srcDSN, whDSN: whDSN, clock: clock.New(at("2026-10-06 12:00"))}
	if e.srcDSN == "" {
		e.srcDSN = pgtest.NewDatabase(t)
	}
	if e.whDSN == "" {
		e.whDSN = pgtest.NewDatabase(t)
	}
	e.src = pgtest.Pool(t, e.srcDSN)
	e.wh = pgtest.Pool(t, e.whDSN)
	if _, err := migrate.Up(e.ctx, e.whDSN, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return e
}

// databaseWith creates a database with extra CREATE DATABASE options
// (e.g. a locale provider), dropped when the test ends. It fails when the
// server refuses the options.
func databaseWith(t *testing.T, options string) (string, error) {
	t.Helper()
	ctx := context.Background()
	base := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "tidemark_test_" + hex.EncodeToString(b[:])
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(options), "locale_provider") && version < 150000 {
		// Not a missing ICU: databases of another locale provider came
		// with PostgreSQL 15.
		t.Skipf("PostgreSQL %d has no locale_provider for CREATE DATABASE (15 or later)", version)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0 "+options); err != nil {
		return "", err
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

func (e *keyEnv) srcExec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.src.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("source: %s: %v", sql, err)
	}
}

func (e *keyEnv) whExec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.wh.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("warehouse: %s: %v", sql, err)
	}
}

// mirror configures a poll source "name" of the source table into the
// warehouse table mirrorTable, and creates the mirror from the source's
// columns (mirror.Describe and Ensure).
func (e *keyEnv) mirror(name, srcTable, mirrorTable string, key []string, deletes string) *mirror.Table {
	e.t.Helper()
	yaml := fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  %s:
    poll: {dsn: %q, table: %s, key: [%s], updated_at: updated_at}
    mirror: {table: %s, deletes: %s, deleted_column: deleted_at, loaded_column: loaded_at}
`, e.whDSN, name, e.srcDSN, srcTable, strings.Join(key, ", "), mirrorTable, deletes)
	cfg, err := config.Parse("t.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		e.t.Fatalf("config: %v\n%s", err, yaml)
	}
	tbl, err := mirror.FromConfig(cfg.Sources[name])
	if err != nil {
		e.t.Fatal(err)
	}
	src, err := mirror.Connect(e.ctx, e.srcDSN, "test")
	if err != nil {
		e.t.Fatal(err)
	}
	defer src.Close(e.ctx)
	if err := tbl.Describe(e.ctx, src); err != nil {
		e.t.Fatal(err)
	}
	conn, err := e.wh.Acquire(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Release()
	if err := tbl.Ensure(e.ctx, conn.Conn()); err != nil {
		e.t.Fatal(err)
	}
	return tbl
}

// reconciler builds a KeyReconciler on the environment's clock; opts may
// set Ranges, Fanout, LeafKeys and Registerer.
func (e *keyEnv) reconciler(tbl *mirror.Table, opts mirror.KeyOptions) *mirror.KeyReconciler {
	e.t.Helper()
	opts.Now = e.clock.Now
	opts.Logger = testLogger(e.t)
	k, err := mirror.NewKeyReconciler(tbl, e.srcDSN, e.wh, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return k
}

func (e *keyEnv) run(k *mirror.KeyReconciler, dryRun bool) mirror.KeyReport {
	e.t.Helper()
	rep, err := k.Run(e.ctx, dryRun)
	if err != nil {
		e.t.Fatalf("key reconciliation (dry run %v): %v", dryRun, err)
	}
	return rep
}

// rows returns a warehouse query's rows as "a | b | c".
func (e *keyEnv) rows(pool *pgxpool.Pool, sql string, args ...any) []string {
	e.t.Helper()
	return pgtest.Lines(e.t, pool, sql, args...)
}

func (e *keyEnv) int(pool *pgxpool.Pool, sql string) int64 {
	e.t.Helper()
	var n int64
	if err := pool.QueryRow(e.ctx, sql).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// history returns the recorded runs, oldest first.
func (e *keyEnv) history() []string {
	e.t.Helper()
	return e.rows(e.wh, `SELECT source, mirror, dry_run, mode, source_keys, mirror_keys, missing_at_source,
		missing_in_mirror, applied, started_at, finished_at FROM tidemark.key_reconciliations ORDER BY id`)
}

// found is the part of a report that says what was found.
type found struct {
	sourceKeys, mirrorKeys int64
	missing                []string
	deleted, inMirror      int64
	applied                int64
}

func foundOf(rep mirror.KeyReport) found {
	return found{sourceKeys: rep.SourceKeys, mirrorKeys: rep.MirrorKeys, missing: rep.MissingAtSource,
		deleted: rep.Deleted, inMirror: rep.MissingInMirror, applied: rep.Applied}
}

func checkFound(t *testing.T, what string, rep mirror.KeyReport, want found) {
	t.Helper()
	got := foundOf(rep)
	if got.sourceKeys != want.sourceKeys || got.mirrorKeys != want.mirrorKeys || !slices.Equal(got.missing, want.missing) ||
		got.deleted != want.deleted || got.inMirror != want.inMirror || got.applied != want.applied {
		t.Errorf("%s:\n got  %+v\n want %+v\n report %+v", what, got, want, rep)
	}
}

const customersDDL = `CREATE TABLE src_customers (
    customer_id bigint PRIMARY KEY,
    email       text NOT NULL,
    tier        text NOT NULL,
    updated_at  timestamptz NOT NULL
)`

const customersRows = `(1, 'a@example.com', 'pro', '2026-10-05 10:15+00'),
    (2, 'b@example.com', 'pro', '2026-10-05 09:30+00'),
    (3, 'c@example.com', 'free', '2026-10-05 10:20+00')`

// customers makes the example: the same three customers at the source and
// in the mirror, then customer 2 deleted at the source.
func customers(t *testing.T, deletes string) (*keyEnv, *mirror.Table) {
	t.Helper()
	e := newKeyEnv(t, "", "")
	e.srcExec(customersDDL)
	e.srcExec(`INSERT INTO src_customers VALUES ` + customersRows)
	tbl := e.mirror("customers", "src_customers", "dw_customers", []string{"customer_id"}, deletes)
	e.whExec(`INSERT INTO dw_customers (customer_id, email, tier, updated_at, loaded_at) VALUES ` +
		strings.ReplaceAll(customersRows, "+00')", "+00', '2026-10-05 11:00+00')"))
	e.srcExec(`DELETE FROM src_customers WHERE customer_id = 2`)
	return e, tbl
}

const customersMirrorSQL = `SELECT customer_id, email, tier, updated_at, loaded_at, deleted_at FROM dw_customers ORDER BY customer_id`

// TestKeyReconcileCustomers: a customer deleted at the source is reported
// by a dry run without changing anything, flagged once by a soft run and
// removed by a hard one.
func TestKeyReconcileCustomers(t *testing.T) {
	unchanged := []string{
		"1 | a@example.com | pro | 2026-10-05 10:15 | 2026-10-05 11:00 | NULL",
		"2 | b@example.com | pro | 2026-10-05 09:30 | 2026-10-05 11:00 | NULL",
		"3 | c@example.com | free | 2026-10-05 10:20 | 2026-10-05 11:00 | NULL",
	}
	for _, tc := range []struct {
		name    string
		deletes string
		dryRun  bool
		// after the first run, and the history rows after two runs
		mirror  []string
		first   found
		second  found
		history []string
	}{{
		name: "dry run", deletes: "soft", dryRun: true,
		mirror: unchanged,
		first:  found{sourceKeys: 2, mirrorKeys: 3, missing: []string{"2"}, deleted: 1},
		second: found{sourceKeys: 2, mirrorKeys: 3, missing: []string{"2"}, deleted: 1},
		history: []string{
			"customers | public.dw_customers | true | soft | 2 | 3 | 1 | 0 | 0 | 2026-10-06 12:00 | 2026-10-06 12:00",
			"customers | public.dw_customers | true | soft | 2 | 3 | 1 | 0 | 0 | 2026-10-06 13:00 | 2026-10-06 13:00",
		},
	}, {
		name: "soft", deletes: "soft",
		mirror: []string{
			"1 | a@example.com | pro | 2026-10-05 10:15 | 2026-10-05 11:00 | NULL",
			"2 | b@example.com | pro | 2026-10-05 09:30 | 2026-10-05 11:00 | 2026-10-06 12:00",
			"3 | c@example.com | free | 2026-10-05 10:20 | 2026-10-05 11:00 | NULL",
		},
		first: found{sourceKeys: 2, mirrorKeys: 3, missing: []string{"2"}, deleted: 1, applied: 1},
		// The flagged row is no longer compared.
		second: found{sourceKeys: 2, mirrorKeys: 2, missing: []string{}},
		history: []string{
			"customers | public.dw_customers | false | soft | 2 | 3 | 1 | 0 | 1 | 2026-10-06 12:00 | 2026-10-06 12:00",
			"customers | public.dw_customers | false | soft | 2 | 2 | 0 | 0 | 0 | 2026-10-06 13:00 | 2026-10-06 13:00",
		},
	}, {
		name: "hard", deletes: "hard",
		mirror: []string{
			"1 | a@example.com | pro | 2026-10-05 10:15 | 2026-10-05 11:00 | NULL",
			"3 | c@example.com | free | 2026-10-05 10:20 | 2026-10-05 11:00 | NULL",
		},
		first:  found{sourceKeys: 2, mirrorKeys: 3, missing: []string{"2"}, deleted: 1, applied: 1},
		second: found{sourceKeys: 2, mirrorKeys: 2, missing: []string{}},
		history: []string{
			"customers | public.dw_customers | false | hard | 2 | 3 | 1 | 0 | 1 | 2026-10-06 12:00 | 2026-10-06 12:00",
			"customers | public.dw_customers | false | hard | 2 | 2 | 0 | 0 | 0 | 2026-10-06 13:00 | 2026-10-06 13:00",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e, tbl := customers(t, tc.deletes)
			pgtest.Equal(t, "mirror before", e.rows(e.wh, customersMirrorSQL), unchanged)
			k := e.reconciler(tbl, mirror.KeyOptions{})
			rep := e.run(k, tc.dryRun)
			if rep.Source != "customers" || rep.Mirror != "public.dw_customers" || rep.DryRun != tc.dryRun || rep.Hard != (tc.deletes == "hard") {
				t.Errorf("report names %+v", rep)
			}
			checkFound(t, "first run", rep, tc.first)
			pgtest.Equal(t, "mirror after the first run", e.rows(e.wh, customersMirrorSQL), tc.mirror)

			e.clock.Set(at("2026-10-06 13:00"))
			rep = e.run(k, tc.dryRun)
			checkFound(t, "second run", rep, tc.second)
			pgtest.Equal(t, "mirror after the second run", e.rows(e.wh, customersMirrorSQL), tc.mirror)
			pgtest.Equal(t, "history", e.history(), tc.history)
			pgtest.Equal(t, "source", e.rows(e.src, `SELECT customer_id FROM src_customers ORDER BY 1`), []string{"1", "3"})
		})
	}
}

// TestKeyReconcileReinserted: a key found missing that is back at the
// source by the time the run applies is left alone.
func TestKeyReconcileReinserted(t *testing.T) {
	e, tbl := customers(t, "soft")
	k := e.reconciler(tbl, mirror.KeyOptions{})
	// The source's snapshot is taken inside Run; put the row back while
	// the poll state is locked, before the re-check can run.
	lock, err := e.wh.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(e.ctx) }()
	if _, err := lock.Exec(e.ctx, `INSERT INTO tidemark.poll_watermarks (source) VALUES ('customers')`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rep mirror.KeyReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := k.Run(e.ctx, false)
		done <- result{rep, err}
	}()
	// Wait until the run waits for the lock, then restore the row.
	waitfor.Until(t, "the run to wait for the poll state lock", func() bool {
		return e.int(e.wh, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`) > 0
	})
	e.srcExec(`INSERT INTO src_customers VALUES (2, 'b@example.com', 'pro', '2026-10-06 11:00+00')`)
	if err := lock.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	checkFound(t, "run", res.rep, found{sourceKeys: 2, mirrorKeys: 3, missing: []string{}})
	if n := e.int(e.wh, `SELECT count(*) FROM dw_customers WHERE deleted_at IS NOT NULL`); n != 0 {
		t.Errorf("%d rows flagged; want none", n)
	}
}

// TestKeyReconcileScale: 10 deletes among 2,000,000 keys are found by
// comparing checksums, transferring a small fraction of the keys.
func TestKeyReconcileScale(t *testing.T) {
	if testing.Short() {
		t.Skip("loads 2,000,000 rows on each side")
	}
	const n = 2_000_000
	e := newKeyEnv(t, "", "")
	e.srcExec(`CREATE TABLE src_big (id bigint PRIMARY KEY, payload integer NOT NULL)`)
	tbl := e.mirror("big", "src_big", "dw_big", []string{"id"}, "soft")
	load := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, side := range []struct {
		pool *pgxpool.Pool
		sql  string
	}{
		{e.src, `INSERT INTO src_big SELECT g, g % 1000 FROM generate_series(1, $1::bigint) AS g`},
		{e.wh, `INSERT INTO dw_big (id, payload, loaded_at) SELECT g, g % 1000, '2026-10-05 11:00+00' FROM generate_series(1, $1::bigint) AS g`},
	} {
		wg.Go(func() {
			if _, err := side.pool.Exec(e.ctx, side.sql, n); err != nil {
				errs[i] = err
				return
			}
			_, errs[i] = side.pool.Exec(e.ctx, `VACUUM ANALYZE`)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("loaded %d rows on each side in %s", n, time.Since(load).Round(time.Millisecond))

	// Scattered, including both ends of the key space.
	deleted := []string{"1", "3", "199999", "500000", "777777", "1000001", "1234567", "1600000", "1999998", "2000000"}
	e.srcExec(`DELETE FROM src_big WHERE id = ANY($1::bigint[])`, deleted)
	// And rows the mirror has not loaded yet, beyond its largest key.
	e.srcExec(`INSERT INTO src_big SELECT g, 0 FROM generate_series($1::bigint + 1, $1::bigint + 5) AS g`, n)

	k := e.reconciler(tbl, mirror.KeyOptions{})
	start := time.Now()
	rep := e.run(k, false)
	elapsed := time.Since(start)
	t.Logf("%d keys: ranges compared %d, keys transferred %d, found %d, missing in mirror %d, in %s",
		n, rep.RangesCompared, rep.KeysTransferred, rep.Deleted, rep.MissingInMirror, elapsed.Round(time.Millisecond))
	checkFound(t, "run", rep, found{sourceKeys: n - 10 + 5, mirrorKeys: n, missing: deleted, deleted: 10, inMirror: 5, applied: 10})
	if rep.KeysTransferred >= n/100 {
		t.Errorf("transferred %d keys; want under 1%% of %d", rep.KeysTransferred, n)
	}
	pgtest.Equal(t, "flagged", e.rows(e.wh, `SELECT id FROM dw_big WHERE deleted_at IS NOT NULL ORDER BY id`), deleted)

	// Nothing new: only the first level is compared.
	start = time.Now()
	rep = e.run(k, false)
	t.Logf("second run: ranges compared %d, keys transferred %d, in %s", rep.RangesCompared, rep.KeysTransferred,
		time.Since(start).Round(time.Millisecond))
	checkFound(t, "second run", rep, found{sourceKeys: n - 10 + 5, mirrorKeys: n - 10, missing: []string{}, inMirror: 5})
}

// TestKeyReconcileCollations: a key with a text column whose values sort
// differently under the two databases' collations is compared bytewise on
// both sides: no false deletes, and the one real delete is found.
func TestKeyReconcileCollations(t *testing.T) {
	const icu = `LOCALE_PROVIDER icu ICU_LOCALE 'und' LOCALE 'C'`
	regions := []string{"a", "B", "_x", "Z9", "b", "A", "a-1", "a_1", "ä", "Ab", ".z", "zz", "ab", "aB", "Ä"}
	for _, tc := range []struct {
		name string
		// srcICU and whICU create that database with an ICU default
		// collation; column is the source key column's COLLATE clause.
		srcICU, whICU bool
		column        string
		// pk is the source's primary key; in another order than the
		// configured key its index cannot serve the key's ranges.
		pk string
	}{
		{name: "source database ICU", srcICU: true},
		{name: "warehouse database ICU", whICU: true},
		{name: "source column ICU", column: `COLLATE "und-x-icu"`},
		{name: "both databases C"},
		{name: "source key index in another order", pk: "id, region"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var srcDSN, whDSN string
			var err error
			if tc.srcICU {
				if srcDSN, err = databaseWith(t, icu); err != nil {
					testenv.Missing(t, "ICU", "the server cannot create an ICU database: "+err.Error())
				}
			}
			if tc.whICU {
				if whDSN, err = databaseWith(t, icu); err != nil {
					testenv.Missing(t, "ICU", "the server cannot create an ICU database: "+err.Error())
				}
			}
			e := newKeyEnv(t, srcDSN, whDSN)
			if tc.column != "" && e.int(e.src, `SELECT count(*) FROM pg_collation WHERE collname = 'und-x-icu'`) == 0 {
				testenv.Missing(t, "ICU", "the server has no ICU collations")
			}
			e.srcExec(`CREATE TABLE src_sites (region text ` + tc.column + ` NOT NULL, id integer NOT NULL,
				name text NOT NULL, updated_at timestamptz NOT NULL, PRIMARY KEY (` + cmp.Or(tc.pk, "region, id") + `))`)
			e.srcExec(`INSERT INTO src_sites SELECT r, i, r || i, '2026-10-05 10:00+00' FROM unnest($1::text[]) AS r, generate_series(1, 40) AS i`, regions)
			tbl := e.mirror("sites", "src_sites", "dw_sites", []string{"region", "id"}, "soft")
			e.whExec(`INSERT INTO dw_sites SELECT r, i, r || i, '2026-10-05 10:00+00', '2026-10-05 11:00+00' FROM unnest($1::text[]) AS r, generate_series(1, 40) AS i`, regions)

			// The sides order the keys differently (or, for two C
			// databases, the same), or the test proves nothing.
			order := `SELECT string_agg(region, ' ' ORDER BY region) FROM (SELECT DISTINCT region FROM %s) AS r`
			srcOrder, whOrder := e.rows(e.src, fmt.Sprintf(order, "src_sites")), e.rows(e.wh, fmt.Sprintf(order, "dw_sites"))
			if differ := srcOrder[0] != whOrder[0]; differ != (tc.srcICU || tc.whICU || tc.column != "") {
				t.Fatalf("source orders %s, warehouse %s", srcOrder, whOrder)
			}

			e.srcExec(`DELETE FROM src_sites WHERE region = '_x' AND id = 7`)
			// Small ranges, so that several levels and many range bounds
			// between differently ordered values are compared.
			k := e.reconciler(tbl, mirror.KeyOptions{Ranges: 7, Fanout: 3, LeafKeys: 5})
			total := int64(len(regions) * 40)
			rep := e.run(k, true)
			checkFound(t, "dry run", rep, found{sourceKeys: total - 1, mirrorKeys: total, missing: []string{"(_x,7)"}, deleted: 1})
			// Without drift in the other ranges, only the ranges on the
			// way to the deleted key differ.
			if rep.RangesCompared > 7+3*8 {
				t.Errorf("compared %d ranges; the ranges of the two sides disagree", rep.RangesCompared)
			}
			rep = e.run(k, false)
			checkFound(t, "run", rep, found{sourceKeys: total - 1, mirrorKeys: total, missing: []string{"(_x,7)"}, deleted: 1, applied: 1})
			pgtest.Equal(t, "flagged", e.rows(e.wh, `SELECT region, id FROM dw_sites WHERE deleted_at IS NOT NULL`), []string{"_x | 7"})
			rep = e.run(k, false)
			checkFound(t, "second run", rep, found{sourceKeys: total - 1, mirrorKeys: total - 1, missing: []string{}})
			if rep.RangesCompared != 7 {
				t.Errorf("second run compared %d ranges; want the 7 of the first level", rep.RangesCompared)
			}
		})
	}
}

// TestKeyReconcileDrift: keys at the source that the mirror lacks are
// counted and never acted on; without drift nothing is found or listed.
func TestKeyReconcileDrift(t *testing.T) {
	const keys = 2000
	for _, tc := range []struct {
		name string
		// mirrorUpTo loads the mirror with keys 1..mirrorUpTo of 1..keys;
		// change then alters the source.
		mirrorUpTo int
		change     string
		want       found
		// maxTransferred bounds the keys read.
		maxTransferred int64
	}{{
		name: "zero drift", mirrorUpTo: keys,
		want:           found{sourceKeys: keys, mirrorKeys: keys, missing: []string{}},
		maxTransferred: 8, // the first level's range bounds
	}, {
		name: "not loaded yet", mirrorUpTo: keys,
		change: `INSERT INTO src_keys SELECT g, '2026-10-05 10:00+00' FROM generate_series(-99, 0) AS g;
			INSERT INTO src_keys SELECT g * 1000000, '2026-10-05 10:00+00' FROM generate_series(1, 50) AS g;
			INSERT INTO src_keys SELECT g, '2026-10-05 10:00+00' FROM generate_series(2001, 2300) AS g`,
		want:           found{sourceKeys: keys + 450, mirrorKeys: keys, missing: []string{}, inMirror: 450},
		maxTransferred: 200,
	}, {
		name: "empty mirror", mirrorUpTo: 0,
		want:           found{sourceKeys: keys, mirrorKeys: 0, missing: []string{}, inMirror: keys},
		maxTransferred: 0,
	}, {
		// Same count in the range, different keys.
		name: "replaced key", mirrorUpTo: keys,
		change:         `UPDATE src_keys SET id = 1000 * 1000 + 1 WHERE id = 1000`,
		want:           found{sourceKeys: keys, mirrorKeys: keys, missing: []string{"1000"}, deleted: 1, inMirror: 1, applied: 1},
		maxTransferred: 200,
	}, {
		name: "mirror partly loaded", mirrorUpTo: 500,
		change:         `DELETE FROM src_keys WHERE id IN (250, 1500)`,
		want:           found{sourceKeys: keys - 2, mirrorKeys: 500, missing: []string{"250"}, deleted: 1, inMirror: keys - 2 - 499, applied: 1},
		maxTransferred: 200,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newKeyEnv(t, "", "")
			e.srcExec(`CREATE TABLE src_keys (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
			e.srcExec(`INSERT INTO src_keys SELECT g, '2026-10-05 10:00+00' FROM generate_series(1, $1::int) AS g`, keys)
			tbl := e.mirror("keys", "src_keys", "dw_keys", []string{"id"}, "soft")
			e.whExec(`INSERT INTO dw_keys SELECT g, '2026-10-05 10:00+00', '2026-10-05 11:00+00' FROM generate_series(1, $1::int) AS g`, tc.mirrorUpTo)
			if tc.change != "" {
				e.srcExec(tc.change)
			}
			mirrorSQL := `SELECT id, updated_at, loaded_at, deleted_at FROM dw_keys ORDER BY id`
			before := e.rows(e.wh, mirrorSQL)
			k := e.reconciler(tbl, mirror.KeyOptions{Ranges: 8, Fanout: 4, LeafKeys: 50})
			rep := e.run(k, false)
			checkFound(t, "run", rep, tc.want)
			if rep.KeysTransferred > tc.maxTransferred {
				t.Errorf("transferred %d keys; want at most %d", rep.KeysTransferred, tc.maxTransferred)
			}
			// Only the keys missing at the source changed.
			var after []string
			for _, r := range e.rows(e.wh, mirrorSQL) {
				id, _, _ := strings.Cut(r, " | ")
				if slices.Contains(tc.want.missing, id) {
					if !strings.HasSuffix(r, " | 2026-10-06 12:00") {
						t.Errorf("row %s not flagged", r)
					}
					r = strings.TrimSuffix(r, "2026-10-06 12:00") + "NULL"
				}
				after = append(after, r)
			}
			pgtest.Equal(t, "mirror rows otherwise", after, before)
			if n := e.int(e.wh, `SELECT count(*) FROM dw_keys WHERE deleted_at IS NOT NULL`); n != rep.Applied {
				t.Errorf("%d rows flagged, report says %d", n, rep.Applied)
			}
		})
	}
}

// TestKeyReconcileMetrics: reconcilers of two sources share a registry;
// the series pass promlint and count what the runs did.
func TestKeyReconcileMetrics(t *testing.T) {
	e, tbl := customers(t, "soft")
	reg := prometheus.NewRegistry()
	k1 := e.reconciler(tbl, mirror.KeyOptions{Registerer: reg})
	other := *tbl
	other.Name = "customers_copy"
	k2 := e.reconciler(&other, mirror.KeyOptions{Registerer: reg})
	e.run(k1, true)
	e.run(k2, false)
	missing, err := url.Parse(e.srcDSN)
	if err != nil {
		t.Fatal(err)
	}
	missing.Path += "_missing"
	broken, err := mirror.NewKeyReconciler(&mirror.Table{Name: "broken", Source: tbl.Source, Target: tbl.Target,
		Key: tbl.Key, DeletedColumn: "deleted_at", LoadedColumn: "loaded_at"},
		missing.String(), e.wh, mirror.KeyOptions{Registerer: reg, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := broken.Run(e.ctx, false); err == nil {
		t.Error("a run against a missing source database succeeded")
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	// k2 flagged customer 2 after k1's dry run: both found it.
	want := fmt.Sprintf(`
# HELP tidemark_key_reconcile_deletes_found_total Mirror keys found missing at the source (after the re-check), dry runs included.
# TYPE tidemark_key_reconcile_deletes_found_total counter
tidemark_key_reconcile_deletes_found_total{source="broken"} 0
tidemark_key_reconcile_deletes_found_total{source="customers"} 1
tidemark_key_reconcile_deletes_found_total{source="customers_copy"} 1
# HELP tidemark_key_reconcile_keys_checked_total Keys covered by successful key reconciliation runs, source and mirror keys together.
# TYPE tidemark_key_reconcile_keys_checked_total counter
tidemark_key_reconcile_keys_checked_total{source="broken"} 0
tidemark_key_reconcile_keys_checked_total{source="customers"} 5
tidemark_key_reconcile_keys_checked_total{source="customers_copy"} 5
# HELP tidemark_key_reconcile_last_success_timestamp_seconds Service time at which the last successful key reconciliation run finished.
# TYPE tidemark_key_reconcile_last_success_timestamp_seconds gauge
tidemark_key_reconcile_last_success_timestamp_seconds{source="customers"} %[1]d
tidemark_key_reconcile_last_success_timestamp_seconds{source="customers_copy"} %[1]d
# HELP tidemark_key_reconcile_refused_total Key reconciliation runs that found more mirror rows missing at the source than mirror.key_reconcile_max_delete allows and applied nothing (also counted as errors).
# TYPE tidemark_key_reconcile_refused_total counter
tidemark_key_reconcile_refused_total{source="broken"} 0
tidemark_key_reconcile_refused_total{source="customers"} 0
tidemark_key_reconcile_refused_total{source="customers_copy"} 0
# HELP tidemark_key_reconcile_runs_total Key reconciliation runs by result (ok or error).
# TYPE tidemark_key_reconcile_runs_total counter
tidemark_key_reconcile_runs_total{result="error",source="broken"} 1
tidemark_key_reconcile_runs_total{result="error",source="customers"} 0
tidemark_key_reconcile_runs_total{result="error",source="customers_copy"} 0
tidemark_key_reconcile_runs_total{result="ok",source="broken"} 0
tidemark_key_reconcile_runs_total{result="ok",source="customers"} 1
tidemark_key_reconcile_runs_total{result="ok",source="customers_copy"} 1
`, at("2026-10-06 12:00").Unix())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tidemark_key_reconcile_deletes_found_total", "tidemark_key_reconcile_keys_checked_total",
		"tidemark_key_reconcile_last_success_timestamp_seconds", "tidemark_key_reconcile_refused_total", "tidemark_key_reconcile_runs_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "tidemark_key_reconcile_keys_transferred_total"); err != nil || n != 3 {
		t.Errorf("keys transferred series: %d, %v; want 3", n, err)
	}
}

// TestKeyReconcilerOptions: options that cannot work are refused.
func TestKeyReconcilerOptions(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	good := func() *mirror.Table {
		return &mirror.Table{Name: "customers", Source: pgx.Identifier{"public", "src"}, Target: pgx.Identifier{"public", "dw"},
			Key: []string{"id"}, DeletedColumn: "deleted_at", LoadedColumn: "loaded_at"}
	}
	for _, tc := range []struct {
		name  string
		table func() *mirror.Table
		dsn   string
		opts  mirror.KeyOptions
		ok    bool
	}{
		{name: "defaults", table: good, dsn: dsn, ok: true},
		{name: "no key", table: func() *mirror.Table { m := good(); m.Key = nil; return m }, dsn: dsn},
		{name: "soft without deleted column", table: func() *mirror.Table { m := good(); m.DeletedColumn = ""; return m }, dsn: dsn},
		{name: "hard without deleted column", table: func() *mirror.Table { m := good(); m.DeletedColumn, m.Hard = "", true; return m }, dsn: dsn, ok: true},
		{name: "fanout 1", table: good, dsn: dsn, opts: mirror.KeyOptions{Fanout: 1}},
		{name: "negative ranges", table: good, dsn: dsn, opts: mirror.KeyOptions{Ranges: -1}},
		{name: "max delete 0%", table: good, dsn: dsn, opts: mirror.KeyOptions{MaxDelete: percent(0)}, ok: true},
		{name: "max delete 100%", table: good, dsn: dsn, opts: mirror.KeyOptions{MaxDelete: percent(100 * config.PercentUnit)}, ok: true},
		{name: "max delete above 100%", table: good, dsn: dsn, opts: mirror.KeyOptions{MaxDelete: percent(100*config.PercentUnit + 1)}},
		{name: "max delete negative", table: good, dsn: dsn, opts: mirror.KeyOptions{MaxDelete: percent(-1)}},
		{name: "bad dsn", table: good, dsn: "postgres://%zz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mirror.NewKeyReconciler(tc.table(), tc.dsn, pool, tc.opts)
			if (err == nil) != tc.ok {
				t.Errorf("error %v; want ok %v", err, tc.ok)
			}
		})
	}
}

func percent(p config.Percent) *config.Percent { return &p }

// TestKeyReconcileFirstLevel: the first level's bounds are sampled from a
// large mirror and exact quantiles of a small one; either way the same
// keys are found.
func TestKeyReconcileFirstLevel(t *testing.T) {
	const keys = 50_000
	for _, tc := range []struct {
		name   string
		ranges int
		bounds string
	}{
		// Sampling starts at 20 * 200 keys per range.
		{name: "sampled", ranges: 4, bounds: "sampled"},
		{name: "exact", ranges: 16, bounds: "exact"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newKeyEnv(t, "", "")
			e.srcExec(`CREATE TABLE src_keys (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
			e.srcExec(`INSERT INTO src_keys SELECT g, '2026-10-05 10:00+00' FROM generate_series(1, $1::int) AS g`, keys)
			tbl := e.mirror("keys", "src_keys", "dw_keys", []string{"id"}, "hard")
			e.whExec(`INSERT INTO dw_keys SELECT g, '2026-10-05 10:00+00', '2026-10-05 11:00+00' FROM generate_series(1, $1::int) AS g`, keys)
			e.whExec(`ANALYZE dw_keys`)
			e.srcExec(`DELETE FROM src_keys WHERE id IN (1, 25000, 50000)`)
			e.srcExec(`INSERT INTO src_keys VALUES (0, '2026-10-05 10:00+00'), (60000, '2026-10-05 10:00+00')`)

			var log syncbuf.Buffer
			k, err := mirror.NewKeyReconciler(tbl, e.srcDSN, e.wh, mirror.KeyOptions{Now: e.clock.Now, Ranges: tc.ranges,
				Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			if err != nil {
				t.Fatal(err)
			}
			rep := e.run(k, false)
			checkFound(t, "run", rep, found{sourceKeys: keys - 1, mirrorKeys: keys, missing: []string{"1", "25000", "50000"},
				deleted: 3, inMirror: 2, applied: 3})
			if want := "bounds=" + tc.bounds; !strings.Contains(log.String(), want) {
				t.Errorf("log lacks %s:\n%s", want, log.String())
			}
			if n := e.int(e.wh, `SELECT count(*) FROM dw_keys`); n != keys-3 {
				t.Errorf("mirror has %d rows; want %d", n, keys-3)
			}
		})
	}
}
