package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/mirror"
)

// cdcEnv is a source database, a migrated warehouse and a CDC source
// "shop" over the source's customers and orders tables.
type cdcEnv struct {
	t      *testing.T
	ctx    context.Context
	src    *pgxpool.Pool
	srcDSN string
	wh     *pgxpool.Pool
	whDSN  string
	// readers is the warehouse pool readers write through, apart from
	// wh: a reader may hold a connection for each group committing and
	// the open one, all waiting for a lock the test holds through wh,
	// and the test must still be able to look.
	readers *pgxpool.Pool
	reg     *prometheus.Registry
}

const shopDDL = `
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, tier text, doc jsonb, big text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, amount numeric(12,2) NOT NULL, placed_at timestamptz NOT NULL);
CREATE TABLE untracked (id bigserial PRIMARY KEY, note text);`

func newCDCEnv(t *testing.T) *cdcEnv {
	t.Helper()
	e := &cdcEnv{t: t, ctx: context.Background(), reg: prometheus.NewRegistry()}
	e.src, e.srcDSN = pgtest.NewPool(t)
	e.wh, e.whDSN = pgtest.NewPool(t)
	e.readers = pgtest.Pool(t, e.whDSN)
	if _, err := migrate.Up(e.ctx, e.whDSN, nil); err != nil {
		t.Fatal(err)
	}
	e.exec(shopDDL)
	return e
}

func (e *cdcEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.src.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("source: %s: %v", sql, err)
	}
}

func (e *cdcEnv) config(extra, mirror string) *config.Config {
	e.t.Helper()
	yaml := fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  shop:
    cdc:
      dsn: %q
      tables: [customers, orders]
      status_every: 200ms
%s
    mirror: {schema: mirror, %s}
`, e.whDSN, e.srcDSN, indent(extra), mirror)
	cfg, err := config.Parse("t.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		e.t.Fatalf("config: %v\n%s", err, yaml)
	}
	return cfg
}

// shopConfig returns the Config of the CDC source shop of cfg.
func shopConfig(t testing.TB, cfg *config.Config) cdc.Config {
	t.Helper()
	c, err := cdc.ConfigFrom(cfg, "shop")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// withTriggers keeps the tables of cfg on the coordinator of a Citus
// warehouse (and changes nothing on one server), for a test that puts a
// trigger on a mirror: Citus has none on a distributed table.
func withTriggers(cfg *config.Config) *config.Config {
	cfg.Warehouse.Distribute = false
	return cfg
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := range lines {
		lines[i] = "      " + strings.TrimSpace(lines[i])
	}
	return strings.Join(lines, "\n")
}

// start runs a reader until the test ends.
func (e *cdcEnv) start(cfg *config.Config) {
	e.t.Helper()
	e.startWith(cfg, cdc.Options{GroupAge: 20 * time.Millisecond})
}

// startWith runs a reader with opts (its logger and registry set here)
// until the test ends.
func (e *cdcEnv) startWith(cfg *config.Config, opts cdc.Options) {
	e.t.Helper()
	opts.Registerer = e.reg
	done, cancel := e.run(cfg, opts)
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("reader: %v", err)
		}
	})
	e.waitStreaming(done)
}

// run starts a reader with opts (the test's logger and a registry of its
// own unless opts has them) and returns the channel its Run ends on and
// the function that stops it.
func (e *cdcEnv) run(cfg *config.Config, opts cdc.Options) (chan error, context.CancelFunc) {
	e.t.Helper()
	return e.runConfig(shopConfig(e.t, cfg), opts)
}

// runConfig is run with the reader's Config.
func (e *cdcEnv) runConfig(c cdc.Config, opts cdc.Options) (chan error, context.CancelFunc) {
	e.t.Helper()
	e.waitSlotFree()
	if opts.Logger == nil {
		opts.Logger = testLogger(e.t)
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	r, err := cdc.New(c, e.readers, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return done, cancel
}

// stopped waits for the reader whose Run ends on done to stop with an
// ErrSetup holding every text of want.
func (e *cdcEnv) stopped(done chan error, want ...string) {
	e.t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, cdc.ErrSetup) {
			e.t.Fatalf("reader stopped with %v, want an ErrSetup", err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				e.t.Errorf("reader error %q does not mention %q", err, w)
			}
		}
	case <-time.After(40 * time.Second):
		e.t.Fatalf("the reader did not stop; want an ErrSetup mentioning %q", want)
	}
}

// waitSlotFree waits until no session streams from the slot: the
// walsender of a reader that just stopped may still hold it for a moment,
// which waitStreaming would take for the next reader streaming.
func (e *cdcEnv) waitSlotFree() {
	e.t.Helper()
	waitfor.Until(e.t, "the slot to be free of an earlier reader", func() bool {
		var active bool
		err := e.src.QueryRow(e.ctx, "SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'), false)").Scan(&active)
		if err != nil {
			e.t.Fatal(err)
		}
		return !active
	})
}

// waitStreaming waits until the reader whose Run ends on done streams:
// changes made before the slot exists are not streamed (snapshot: never).
// The slot is active while it is being created too, so the position must
// also be past its snapshot. A reader stopping meanwhile fails the test.
func (e *cdcEnv) waitStreaming(done chan error) {
	e.t.Helper()
	waitfor.Until(e.t, "the reader to stream", func() bool {
		var active bool
		err := e.src.QueryRow(e.ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'").Scan(&active)
		if err == nil && active && e.count("SELECT count(*) FROM tidemark.cdc_positions WHERE snapshot <> 'pending'") == 1 {
			return true
		}
		select {
		case err := <-done:
			done <- err // for the cleanup that waits for the reader
			e.t.Fatalf("reader stopped: %v", err)
		default:
		}
		return false
	})
}

// slotPID is the process id of the walsender that holds the slot, 0 when
// none does.
func (e *cdcEnv) slotPID() int64 {
	e.t.Helper()
	var p int64
	if err := e.src.QueryRow(e.ctx, "SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'").Scan(&p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// customerRows and orderRows render a table's rows the same way on both
// sides; mirrorFilter hides rows flagged deleted.
const (
	customerRows = `SELECT id, name, tier, doc::text, md5(big) FROM %s %s ORDER BY id`
	orderRows    = `SELECT id, customer_id, amount::text, placed_at FROM %s %s ORDER BY id`
)

// waitMirrored waits until both mirrors equal their source tables.
func (e *cdcEnv) waitMirrored(liveFilter string) {
	e.t.Helper()
	var diff string
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		same := true
		for _, q := range []struct{ sql, src, dst string }{{customerRows, "customers", "mirror.customers"}, {orderRows, "orders", "mirror.orders"}} {
			want := pgtest.Rows(e.t, e.src, fmt.Sprintf(q.sql, q.src, ""))
			got := pgtest.Rows(e.t, e.wh, fmt.Sprintf(q.sql, q.dst, liveFilter))
			if strings.Join(want, "\n") != strings.Join(got, "\n") {
				same = false
				diff = fmt.Sprintf("%s: source %d rows, mirror %d rows", q.src, len(want), len(got))
			}
		}
		return same
	}); err != nil {
		e.t.Fatalf("mirrors did not converge in %s: %s", waitfor.Timeout, diff)
	}
}

// wantCount checks that the warehouse query sql counts want rows, after
// waiting for the count to reach want.
func (e *cdcEnv) wantCount(what string, want int64, sql string) {
	e.t.Helper()
	_ = waitfor.Poll(waitfor.Timeout, func() bool { return e.count(sql) >= want })
	if n := e.count(sql); n != want {
		e.t.Errorf("%s: %d, want %d", what, n, want)
	}
}

func (e *cdcEnv) count(sql string) int64 {
	e.t.Helper()
	var n int64
	if err := e.wh.QueryRow(e.ctx, sql).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestMirrorsFollowTheSource is acceptance item 1: inserts, updates and
// deletes on two tables, a large transaction, a rolled-back one, and a key
// changed several times inside one applied group; in both delete modes the
// mirrors equal the source and the raw change rows match the changes one
// for one.
func TestMirrorsFollowTheSource(t *testing.T) {
	for _, mode := range []string{"soft", "hard"} {
		t.Run(mode, func(t *testing.T) {
			e := newCDCEnv(t)
			e.start(e.config("snapshot: never", "deletes: "+mode))
			live := "WHERE deleted_at IS NULL"
			if mode == "hard" {
				live = ""
			}
			e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', '{"a": 1}', NULL), (2, 'ben', 'pro', NULL, NULL), (3, 'cy', NULL, NULL, NULL)`)
			e.exec(`INSERT INTO orders SELECT i, 1 + i % 3, i * 1.5, timestamptz '2026-10-05 09:00+00' + i * interval '1 minute' FROM generate_series(1, 100) AS i`)
			e.exec(`UPDATE customers SET tier = 'gold' WHERE id = 1`)
			e.exec(`DELETE FROM orders WHERE id % 10 = 0`)
			// One transaction changing a key several times, and its key.
			e.exec(`BEGIN; UPDATE customers SET name = 'b1' WHERE id = 2; UPDATE customers SET name = 'b2' WHERE id = 2;
				UPDATE customers SET id = 20 WHERE id = 2; UPDATE customers SET tier = 'x' WHERE id = 20; INSERT INTO customers VALUES (2, 'new ben', NULL, NULL, NULL);
				DELETE FROM customers WHERE id = 3; INSERT INTO customers VALUES (3, 'cy again', NULL, NULL, NULL); COMMIT`)
			// Rolled back: nothing of it may appear.
			e.exec(`BEGIN; INSERT INTO customers VALUES (99, 'ghost', NULL, NULL, NULL); DELETE FROM orders; ROLLBACK`)
			// A large transaction.
			e.exec(`INSERT INTO orders SELECT i, 1, i, timestamptz '2026-10-06 00:00+00' FROM generate_series(1000, 100999) AS i`)
			e.exec(`UPDATE orders SET amount = amount + 1 WHERE id BETWEEN 1000 AND 1999`)
			e.waitMirrored(live)
			// The status page reads the slot as the reader last saw it.
			var (
				r  cdc.SlotReading
				ok bool
			)
			if err := waitfor.Poll(waitfor.Timeout, func() bool {
				r, ok = cdc.SlotReadings(e.reg)["shop"]
				return ok && r.Streaming && r.WALStatus == "reserved"
			}); err != nil {
				t.Fatalf("SlotReadings has %+v (found %v) for shop, want streaming with wal_status reserved", r, ok)
			}
			if _, ok := cdc.SlotReadings(e.reg)["elsewhere"]; ok {
				t.Error("SlotReadings has a source no reader of this process streams")
			}
			// Changes, one raw row each: 3 + 100 + 1 + 10 + 7 + 100000 + 1000.
			if n := e.count("SELECT count(*) FROM raw.shop"); n != 101121 {
				t.Errorf("raw change rows %d, want 101121", n)
			}
			if n := e.metric("tidemark_cdc_changes_applied_total"); n != 101121 {
				t.Errorf("tidemark_cdc_changes_applied_total is %v, want 101121", n)
			}
			if n := e.count("SELECT count(*) FROM raw.shop WHERE op = 'delete'"); n != 11 {
				t.Errorf("raw delete rows %d, want 11", n)
			}
			// The reconciler finds a load's raw rows by the load_xid and
			// ingested_at of its ledger rows. (The raw rows are read first:
			// on Citus raw.shop is distributed, the ledger is not, and a
			// direct join of the two is refused.)
			if n := e.count(`WITH r AS MATERIALIZED (SELECT DISTINCT load_xid, ingested_at FROM raw.shop)
				SELECT count(*) FROM r WHERE NOT EXISTS (SELECT FROM tidemark.ingest_ledger l
				WHERE l.source = 'shop' AND l.load_xid = r.load_xid AND l.ingested_at = r.ingested_at)`); n != 0 {
				t.Errorf("%d loads of raw change rows have no ledger row of their load and ingestion time", n)
			}
			if n := e.count("SELECT count(*) FROM raw.shop WHERE payload ? 'name' AND payload->>'name' = 'ghost'"); n != 0 {
				t.Errorf("the rolled-back transaction left %d raw rows", n)
			}
			if mode == "soft" {
				if n := e.count("SELECT count(*) FROM mirror.orders WHERE deleted_at IS NOT NULL"); n != 10 {
					t.Errorf("orders flagged deleted %d, want 10", n)
				}
			}
			// Acceptance item 8: key reconciliation, the drift check, finds
			// nothing to do on either mirror.
			for _, tbl := range []string{"customers", "orders"} {
				m := &mirror.Table{Name: "shop", Source: pgx.Identifier{"public", tbl}, Target: pgx.Identifier{"mirror", tbl},
					Key: []string{"id"}, DeletedColumn: "deleted_at", LoadedColumn: "loaded_at", Hard: mode == "hard"}
				k, err := mirror.NewKeyReconciler(m, e.srcDSN, e.wh, mirror.KeyOptions{})
				if err != nil {
					t.Fatal(err)
				}
				rep, err := k.Run(e.ctx, true)
				if err != nil {
					t.Fatal(err)
				}
				if rep.Deleted != 0 || rep.MissingInMirror != 0 || rep.SourceKeys != rep.MirrorKeys || rep.SourceKeys == 0 {
					t.Errorf("key reconciliation of %s: %+v, want no drift", tbl, rep)
				}
			}
		})
	}
}

// TestGroupsCommitInOrder: groups are committed in the background while
// the next ones are written. With one source transaction per group, a run
// of transactions that insert, update and delete the same keys leaves the
// mirror equal to the source; and a group that fails (a trigger on the
// mirror rejects one row, slowly, while the groups after it are under way)
// takes every later group down with it: nothing after it is committed, and
// once the trigger relents the reader applies everything exactly once.
func TestGroupsCommitInOrder(t *testing.T) {
	e := newCDCEnv(t)
	e.startWith(withTriggers(e.config("snapshot: never", "deletes: hard")), cdc.Options{GroupChanges: 1, GroupAge: time.Second})
	wh := func(sql string) {
		t.Helper()
		if _, err := e.wh.Exec(e.ctx, sql); err != nil {
			t.Fatalf("warehouse: %s: %v", sql, err)
		}
	}
	wh(`CREATE TABLE poison_on (on_ bool); INSERT INTO poison_on VALUES (true); CREATE SEQUENCE poison_hits;
	CREATE FUNCTION reject_poison() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF NEW.customer_id = -1 AND EXISTS (SELECT FROM poison_on) THEN
			PERFORM nextval('poison_hits'), pg_sleep(0.2);
			RAISE EXCEPTION 'poison row %', NEW.id;
		END IF;
		RETURN NEW;
	END $$;
	CREATE TRIGGER reject_poison BEFORE INSERT OR UPDATE ON mirror.orders FOR EACH ROW EXECUTE FUNCTION reject_poison()`)
	// 310 transactions back to back, one change each: a key is inserted,
	// deleted, inserted again, updated and deleted, in five transactions
	// in a row, then the next key; and the poison row in the middle: 311
	// changes.
	e.exec(`DO $$
	BEGIN
		FOR i IN 0..309 LOOP
			CASE i % 5
			WHEN 0, 2 THEN INSERT INTO orders VALUES (1000 + (i / 5) % 10, i, i, '2026-10-05 09:00+00');
			WHEN 3 THEN UPDATE orders SET amount = amount + 1, customer_id = i WHERE id = 1000 + (i / 5) % 10;
			ELSE DELETE FROM orders WHERE id = 1000 + (i / 5) % 10;
			END CASE;
			IF i = 150 THEN
				INSERT INTO orders VALUES (1, -1, 0, '2026-10-05 09:00+00');
			END IF;
			COMMIT;
		END LOOP;
	END $$`)
	waitfor.Until(t, "the poison row to be applied", func() bool {
		return e.count("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM poison_hits") > 0
	})
	if n := e.count("SELECT count(*) FROM raw.shop WHERE commit_lsn > (SELECT commit_lsn FROM raw.shop WHERE op = 'insert' AND payload->>'customer_id' = '150')"); n > 0 {
		t.Errorf("%d raw change rows of transactions after the poisoned group were committed while it failed", n)
	}
	wh(`DELETE FROM poison_on`)
	// The mirror equals the source (the poison row) whenever a key's run
	// is complete: wait for every change to be applied first.
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		return e.count("SELECT count(*) FROM raw.shop") >= 311 && e.metric("tidemark_cdc_changes_applied_total") >= 311
	}); err != nil {
		t.Fatalf("after the poison was lifted, %d raw change rows were applied, want 311", e.count("SELECT count(*) FROM raw.shop"))
	}
	e.waitMirrored("")
	if n := e.count("SELECT count(*) FROM raw.shop"); n != 311 {
		t.Errorf("raw change rows %d, want 311", n)
	}
	if n := e.metric("tidemark_cdc_changes_applied_total"); n != 311 {
		t.Errorf("tidemark_cdc_changes_applied_total is %v, want 311", n)
	}
}

// TestFreshRowsAreCopied: the rows of keys a chunk inserts are COPYed
// into the mirror, at most 32 times (savepoints) in one group; a key the
// mirror holds already (re-inserted after a soft delete) makes the chunk
// merge that table's rows instead, and the table's chunks after it merge
// theirs for a while.
// A statement trigger on the mirror logs how each batch of rows arrived.
// Citus has no triggers on a distributed table: on a Citus warehouse the
// test runs once with the mirror on the coordinator (and the trigger), and
// once distributed, where the metric and the mirror's rows say the same.
func TestFreshRowsAreCopied(t *testing.T) { pgtest.LocalAndDistributed(t, testFreshRowsAreCopied) }

func testFreshRowsAreCopied(t *testing.T, distribute bool) {
	e := newCDCEnv(t)
	cfg := e.config("snapshot: never", "deletes: soft")
	cfg.Warehouse.Distribute = distribute // the trigger below needs a local mirror
	e.startWith(cfg, cdc.Options{GroupChanges: 1, GroupAge: time.Second, ChunkChanges: 10})
	if !distribute {
		if _, err := e.wh.Exec(e.ctx, `CREATE TABLE arrivals (n bigserial, stmt text, rows bigint);
	CREATE FUNCTION log_arrival() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO arrivals (stmt, rows) SELECT substring(current_query() FROM '[A-Z]+'), count(*) FROM arrived;
		RETURN NULL;
	END $$;
	CREATE TRIGGER log_arrival AFTER INSERT ON mirror.orders REFERENCING NEW TABLE AS arrived
		FOR EACH STATEMENT EXECUTE FUNCTION log_arrival()`); err != nil {
			t.Fatal(err)
		}
	} else if got := pgtest.Placement(t, e.wh, "mirror.orders"); got != "distributed by id" {
		t.Fatalf("mirror.orders is %q, want distributed by id", got)
	}
	var want []string
	batches := func(n int, stmt string, rows int) {
		for range n {
			want = append(want, fmt.Sprintf("%s %d", stmt, rows))
		}
	}
	// One source transaction of 400 rows: 40 chunks, one group.
	e.exec(`INSERT INTO orders SELECT i, 1, i, '2026-10-05 09:00+00' FROM generate_series(1, 400) AS i`)
	batches(32, "COPY", 10)
	batches(8, "INSERT", 10)
	// The next group COPYs again.
	e.exec(`INSERT INTO orders SELECT i, 1, i, '2026-10-05 09:00+00' FROM generate_series(401, 403) AS i`)
	batches(1, "COPY", 3)
	// A soft delete inserts nothing. Then one chunk of both tables: a new
	// customer is copied; of the orders, the key inserted again is in the
	// mirror, flagged, so their COPY is rolled back (not the customer's)
	// and they are merged with the staged update: one INSERT … ON
	// CONFLICT that inserts 405 and updates 401 and 402.
	e.exec(`DELETE FROM orders WHERE id = 402`)
	e.exec(`BEGIN;
		INSERT INTO customers VALUES (1, 'ana', NULL, NULL, NULL);
		UPDATE orders SET amount = 9 WHERE id = 401;
		INSERT INTO orders VALUES (402, 2, 2, '2026-10-06 09:00+00'), (405, 1, 1, '2026-10-06 09:00+00');
		COMMIT`)
	batches(1, "INSERT", 1)
	// The next chunk merges without trying.
	e.exec(`INSERT INTO orders VALUES (404, 1, 1, '2026-10-06 09:00+00')`)
	batches(1, "INSERT", 1)
	e.waitMirrored("WHERE deleted_at IS NULL")
	if !distribute {
		got := pgtest.Rows(t, e.wh, `SELECT stmt || ' ' || rows FROM arrivals ORDER BY n`)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("rows arrived in the mirror as\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	// The metric counts the same rows by how they were written: copied,
	// the 32 COPYs of ten orders, three orders and the customer; merged,
	// the 8 INSERTs of ten, the three orders whose COPY was rolled back
	// and the one after; deleted, the soft delete. It is counted when a
	// group's commit is confirmed, just after its rows are visible.
	wantRows := map[string]float64{"copied": 324, "merged": 84, "deleted": 1}
	gotRows := map[string]float64{}
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		for how := range wantRows {
			gotRows[how] = e.metricWhere("tidemark_cdc_mirror_rows_total", "how", how)
		}
		return fmt.Sprint(gotRows) == fmt.Sprint(wantRows)
	}); err != nil {
		t.Fatalf("tidemark_cdc_mirror_rows_total by how is %v, want %v", gotRows, wantRows)
	}
}

// testLogger sends the reader's log to the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestToastSchemaAndIdle covers acceptance items 3 to 5: an unchanged
// TOASTed value survives an update of another column; a column added at
// the source appears in the mirror with its values; and with only an
// untracked table changing, the slot's confirmed position advances.
func TestToastSchemaAndIdle(t *testing.T) {
	e := newCDCEnv(t)
	e.start(e.config("snapshot: never\nheartbeat_every: 1s", "deletes: soft"))
	// About 300 kB of text that does not compress: stored out of line.
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', NULL, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 10000) AS i))`)
	e.exec(`UPDATE customers SET tier = 'pro' WHERE id = 1`)
	e.waitMirrored("WHERE deleted_at IS NULL")
	var size int64
	if err := e.wh.QueryRow(e.ctx, "SELECT length(big) FROM mirror.customers WHERE id = 1 AND tier = 'pro'").Scan(&size); err != nil || size != 320000 {
		t.Errorf("the TOASTed value after an update of another column: length %d (%v), want 320000", size, err)
	}
	// A key change does not send the unchanged TOASTed value either: it
	// comes from the old key's mirror row, or from earlier changes of the
	// same group (a chain of key changes in one transaction).
	e.exec(`UPDATE customers SET id = 10 WHERE id = 1`)
	e.waitMirrored("WHERE deleted_at IS NULL")
	e.exec(`INSERT INTO customers SELECT 2, 'ben', 'free', NULL, big FROM customers WHERE id = 10`)
	e.waitMirrored("WHERE deleted_at IS NULL")
	e.exec(`BEGIN; UPDATE customers SET id = 20 WHERE id = 2; UPDATE customers SET tier = 'gold' WHERE id = 20;
		UPDATE customers SET id = 21 WHERE id = 20; UPDATE customers SET id = 11, name = 'ana2' WHERE id = 10; COMMIT`)
	e.waitMirrored("WHERE deleted_at IS NULL")
	if n := e.count("SELECT count(*) FROM mirror.customers WHERE deleted_at IS NULL AND id IN (11, 21) AND length(big) = 320000"); n != 2 {
		t.Errorf("after key changes, %d rows keep their TOASTed value, want 2", n)
	}
	// A key change onto a key whose mirror row is flagged deleted (id 1,
	// holding another large value) takes the old key's value, not the
	// flagged row's.
	e.exec(`INSERT INTO customers VALUES (30, 'cy', 'free', NULL, (SELECT string_agg(md5((i + 7)::text), '') FROM generate_series(1, 10000) AS i))`)
	e.waitMirrored("WHERE deleted_at IS NULL")
	e.exec(`UPDATE customers SET id = 1 WHERE id = 30`)
	e.waitMirrored("WHERE deleted_at IS NULL")

	e.exec(`ALTER TABLE orders ADD COLUMN channel text`)
	e.exec(`INSERT INTO orders VALUES (1, 1, 9.50, '2026-10-05 09:00+00', 'app'), (2, 1, 1.00, '2026-10-05 09:05+00', NULL)`)
	waitfor.Until(t, "the mirror to gain the new column's value", func() bool {
		var n int64
		err := e.wh.QueryRow(e.ctx, "SELECT count(*) FROM mirror.orders WHERE channel = 'app'").Scan(&n)
		return err == nil && n == 1
	})

	// Only an untracked table changes: the slot must still advance.
	before := e.confirmed()
	for i := 0; i < 5; i++ {
		e.exec(`INSERT INTO untracked (note) SELECT repeat('x', 1000) FROM generate_series(1, 1000)`)
	}
	var end string
	if err := e.src.QueryRow(e.ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		var passed bool
		if err := e.src.QueryRow(e.ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'`, end).Scan(&passed); err != nil {
			t.Fatal(err)
		}
		return passed
	}); err != nil {
		t.Fatalf("the slot's confirmed position stayed at %s (was %s before the untracked writes); WAL end %s", e.confirmed(), before, end)
	}
}

// TestIdleRecordsAtStatusPace: an idle reader whose source shares the
// warehouse's server records its position once per status_every. Each
// record is a durable warehouse commit, whose WAL the next keepalive
// reports as the new WAL end; recording every advance committed in a loop
// (3,000 commits and 740 kB of WAL a second on an idle server).
func TestIdleRecordsAtStatusPace(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	// The WAL is listed by pg_walinspect, which PostgreSQL 15 added.
	var version int
	if err := e.wh.QueryRow(e.ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 150000 {
		t.Skip("measures WAL with pg_walinspect, which PostgreSQL 14 does not have (15+); the reader's pace does not depend on the server version")
	}
	e.start(e.config("snapshot: never\nheartbeat_every: 0s", "deletes: soft"))
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', NULL, NULL)`)
	e.waitMirrored("WHERE deleted_at IS NULL")
	// The server's WAL also holds the upkeep of other databases
	// (autovacuum of earlier tests' tables): what the reader writes is the
	// WAL that touches the warehouse database's pages.
	if _, err := e.wh.Exec(e.ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		t.Fatal(err)
	}
	walAndRecorded := func() (wal string, recorded int64) {
		t.Helper()
		if err := e.wh.QueryRow(e.ctx, `SELECT pg_current_wal_flush_lsn()::text, confirmed_lsn - '0/0'
			FROM tidemark.cdc_positions WHERE source = 'shop'`).Scan(&wal, &recorded); err != nil {
			t.Fatal(err)
		}
		return wal, recorded
	}
	// Idle: the reader records a position past the WAL of the insert's
	// group.
	var applied int64
	if err := e.wh.QueryRow(e.ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, "the idle reader to record a position past the insert", func() bool {
		_, rec := walAndRecorded()
		return rec >= applied
	})
	wal0, rec0 := walAndRecorded()
	// A rate over real time: the reader's status_every is a timer, which
	// Options.Now (timestamps only) does not drive.
	time.Sleep(3 * time.Second) // the idle time measured, not a wait for a state
	wal1, rec1 := walAndRecorded()
	var bytes, records int64
	if err := e.wh.QueryRow(e.ctx, `SELECT coalesce(sum(record_length), 0), count(*)
		FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
		WHERE block_ref LIKE '%/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/%'`,
		wal0, wal1).Scan(&bytes, &records); err != nil {
		t.Fatal(err)
	}
	t.Logf("idle for 3 s: %d WAL records of %d bytes in the warehouse database, the recorded position %d bytes further", records, bytes, rec1-rec0)
	// One position update every status_every (200ms): about 15 records
	// of under 200 bytes, with room for full-page images after a
	// checkpoint.
	if records > 30 || bytes > 100_000 {
		t.Errorf("the idle reader wrote %d WAL records of %d bytes in 3 s", records, bytes)
	}
	if rec1 <= rec0 {
		t.Errorf("the idle position stayed at %d: the reader stopped recording it", rec0)
	}
}

func (e *cdcEnv) confirmed() string {
	e.t.Helper()
	var lsn string
	if err := e.src.QueryRow(e.ctx, "SELECT coalesce((SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'), '')").Scan(&lsn); err != nil {
		e.t.Fatal(err)
	}
	return lsn
}

// TestInitialSnapshot is acceptance item 6: a 1M-row table is copied in
// the slot's snapshot while writes continue, and streaming takes over from
// the snapshot's point with no gap and no overlap.
func TestInitialSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("copies 1M rows")
	}
	e := newCDCEnv(t)
	e.exec(`INSERT INTO customers SELECT i, 'c' || i, 'free', NULL, NULL FROM generate_series(1, 1000) AS i`)
	e.exec(`INSERT INTO orders SELECT i, 1 + i % 1000, i % 997, timestamptz '2026-10-01 00:00+00' + i * interval '1 second' FROM generate_series(1, 1000000) AS i`)
	stop := make(chan struct{})
	wrote := make(chan int)
	var written atomic.Int64
	go func() {
		n := 0
		defer func() { wrote <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := 1 + i*37%999999
			err := pgx.BeginFunc(e.ctx, e.src, func(tx pgx.Tx) error {
				for _, q := range []string{
					`UPDATE orders SET amount = amount + 1 WHERE id = $1`,
					`DELETE FROM orders WHERE id = $1 + 500000`,
					`INSERT INTO orders VALUES ($1 + 2000000, 1, 1, now())`,
					`UPDATE customers SET tier = 'pro' WHERE id = 1 + $1 % 1000`,
				} {
					if _, err := tx.Exec(e.ctx, q, id); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Errorf("write during the snapshot: %v", err)
				return
			}
			n++
			written.Store(int64(n))
		}
	}()
	e.exec(`ANALYZE orders`)
	e.start(e.config("snapshot: initial\nsnapshot_workers: 3\nsnapshot_chunk_rows: 100000", "deletes: hard"))
	// Writes go on while the snapshot is copied: twenty transactions
	// after the slot exists.
	began := written.Load()
	waitfor.Until(t, "twenty write transactions after the slot's creation", func() bool { return written.Load() >= began+20 })
	close(stop)
	n := <-wrote
	e.waitMirrored("")
	t.Logf("%d write transactions ran during and after the snapshot", n)
	if n == 0 {
		t.Error("no writes ran while the snapshot was taken")
	}
	// orders in about ten key ranges, customers in one.
	if planned, copied := e.metric("tidemark_cdc_snapshot_chunks_planned"), e.metric("tidemark_cdc_snapshot_chunks_copied"); planned < 8 || copied != planned {
		t.Errorf("snapshot chunks: %v planned, %v copied; want about 11, all copied", planned, copied)
	}
	// One attempt: each write transaction adds one row and removes at most
	// one, so a single snapshot copies 1,001,000 rows give or take n.
	if rows := e.metric("tidemark_cdc_snapshot_rows_total"); rows > float64(1001000+n) || rows < float64(1001000-n) {
		t.Errorf("%v rows copied by snapshots, want 1001000 ± %d (one attempt)", rows, n)
	}
}

// TestSnapshotChunksCompositeKey: a table with a two-column text and
// integer key, its rows stored in no particular order, is copied in
// key-range chunks that together hold every row once.
func TestSnapshotChunksCompositeKey(t *testing.T) {
	e := newCDCEnv(t)
	e.exec(`CREATE TABLE lines (order_id text COLLATE "C", line int, qty int, PRIMARY KEY (order_id, line));
		INSERT INTO lines SELECT 'order-' || (i % 2), i, i FROM generate_series(1, 20000) AS i ORDER BY md5(i::text);
		ANALYZE lines`)
	cfg, err := config.Parse("t.yaml", []byte(fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  shop:
    cdc: {dsn: %q, tables: [lines], snapshot_workers: 3, snapshot_chunk_rows: 1000}
    mirror: {table: mirror_lines}
`, e.whDSN, e.srcDSN)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	e.start(cfg)
	waitfor.Until(t, "the snapshot to finish", func() bool {
		return e.count("SELECT count(*) FROM tidemark.cdc_positions WHERE snapshot = 'done'") > 0
	})
	const q = `SELECT order_id, line, qty FROM %s ORDER BY 1, 2`
	want, got := pgtest.Rows(t, e.src, fmt.Sprintf(q, "lines")), pgtest.Rows(t, e.wh, fmt.Sprintf(q, "mirror_lines"))
	if strings.Join(want, "\n") != strings.Join(got, "\n") {
		t.Errorf("mirror has %d rows, source %d", len(got), len(want))
	}
	if planned := e.metric("tidemark_cdc_snapshot_chunks_planned"); planned < 10 {
		t.Errorf("%v chunks planned, want about 20", planned)
	}
	// Chunk bounds in the key order of the columns (line 10000 after line
	// 9999, not after line 1): no chunk overlapped another and had to be
	// redone.
	if copied := e.metric("tidemark_cdc_snapshot_rows_total"); copied != 20000 {
		t.Errorf("%v rows copied by snapshots, want 20000 (one attempt)", copied)
	}
}

// TestIdleConfirmIsRecordedFirst: a reader that confirms an idle slot past
// what it applied records that position in the warehouse first. When the
// warehouse cannot record it (here: cdc_positions is locked) the slot is
// not advanced, so a restart does not mistake the reader's own advance
// for another client consuming the slot.
func TestIdleConfirmIsRecordedFirst(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	cfg := e.config("snapshot: never\nheartbeat_every: 0s", "deletes: hard")
	var reg *prometheus.Registry
	run := func() (context.CancelFunc, chan error) {
		reg = prometheus.NewRegistry()
		r, err := cdc.New(shopConfig(t, cfg), e.readers, cdc.Options{GroupAge: 20 * time.Millisecond, Logger: testLogger(t), Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		return cancel, done
	}
	cancel, done := run()
	// Untracked writes move the WAL end that an idle reader confirms.
	waitfor.Until(t, "the reader to confirm the idle slot", func() bool {
		e.exec(`INSERT INTO untracked (note) VALUES ('x')`)
		return e.confirmed() != "" && e.count("SELECT count(*) FROM tidemark.cdc_positions WHERE confirmed_lsn > '0/0'") > 0
	})

	// The warehouse stalls on cdc_positions while only untracked tables
	// change; then the reader stops.
	lock, err := e.wh.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(e.ctx, "LOCK TABLE tidemark.cdc_positions IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	// A status update that recorded its position before the lock may
	// still be on its way to the source: wait until the reader's next
	// record waits for the lock, and the slot stands where the reader
	// last confirmed it.
	sent := func() string {
		v, err := promreg.Sum(reg, "tidemark_cdc_confirmed_lsn")
		if err != nil {
			t.Fatal(err)
		}
		return pglogrepl.LSN(uint64(v)).String()
	}
	waitfor.Until(t, "the reader's record to wait for the lock and its last status update to reach the source", func() bool {
		e.exec(`INSERT INTO untracked (note) VALUES ('x')`)
		return e.lockWaiters("cdc_positions") > 0 && e.confirmed() == sent()
	})
	before := e.confirmed()
	for range 10 {
		e.exec(`INSERT INTO untracked (note) SELECT repeat('x', 100) FROM generate_series(1, 100)`)
		time.Sleep(100 * time.Millisecond) // the writer's pace over a second in which the slot must not move, not a wait
	}
	if after := e.confirmed(); after != before {
		t.Errorf("the slot was confirmed from %s to %s while the warehouse could not record it", before, after)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("reader: %v", err)
	}
	if err := lock.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}

	// A new reader takes over without refusing, and streams.
	cancel, done = run()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	}()
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', NULL, NULL)`)
	e.waitMirrored("")
	select {
	case err := <-done:
		t.Fatalf("the restarted reader stopped: %v", err)
	default:
	}
}

// TestIdleConfirmInsideOpenTransaction: the slot confirmed, while the
// reader is idle, at a keepalive's WAL end that lies inside a source
// transaction not yet committed (the walsender has decoded its rows and
// sends nothing until its commit), then a new replication session
// started from that position, loses nothing: the source decodes the
// transaction again from the slot's restart_lsn and sends it once it
// commits, since it skips only transactions whose commit record lies
// before the confirmed position.
func TestIdleConfirmInsideOpenTransaction(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	e.start(e.config("snapshot: never\nheartbeat_every: 0s", "deletes: hard"))
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', NULL, NULL)`)
	e.waitMirrored("")

	tx, err := e.src.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	var began string
	if err := tx.QueryRow(e.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&began); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `INSERT INTO orders SELECT i, 1, i, timestamptz '2026-10-05 09:00+00' + i * interval '1 second'
		FROM generate_series(1, 1000) AS i`); err != nil {
		t.Fatal(err)
	}
	start, err := pglogrepl.ParseLSN(began)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		c, err := pglogrepl.ParseLSN(e.confirmed())
		return err == nil && c > start
	}); err != nil {
		t.Fatalf("the slot stayed confirmed at %s, not past the open transaction's start %s", e.confirmed(), began)
	}
	t.Logf("slot confirmed at %s, inside the open transaction that began at %s", e.confirmed(), began)

	// A new replication session starts from the confirmed position.
	pid := e.slotPID()
	e.exec(`SELECT pg_terminate_backend($1::int)`, pid)
	waitfor.Until(t, "the reader to take the slot again", func() bool {
		p := e.slotPID()
		return p != 0 && p != pid
	})
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.waitMirrored("")
	e.wantCount("raw change rows of orders", 1000, `SELECT count(*) FROM raw.shop WHERE source_table = 'public.orders'`)
}

// metric sums the samples of a counter or gauge family.
func (e *cdcEnv) metric(name string) float64 {
	e.t.Helper()
	return e.metricWhere(name, "", "")
}

// metricWhere is the sum of the series of name whose label has value.
func (e *cdcEnv) metricWhere(name, label, value string) float64 {
	e.t.Helper()
	sum, err := promreg.SumWhere(e.reg, name, label, value)
	if err != nil {
		e.t.Fatal(err)
	}
	return sum
}

// TestHeartbeatReconnects: the heartbeat connection is opened again after
// the source ends it, so heartbeats go on after a source restart.
func TestHeartbeatReconnects(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	e.start(e.config("snapshot: never\nheartbeat_every: 1s", "deletes: hard"))
	heartbeats := func() int64 {
		var n int64
		if err := e.src.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tidemark-cdc-heartbeat' AND datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitfor.Until(t, "a heartbeat connection", func() bool { return heartbeats() > 0 })
	e.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tidemark-cdc-heartbeat' AND datname = current_database()`)
	waitfor.Until(t, "the heartbeat connection to end", func() bool { return heartbeats() == 0 })
	waitfor.Until(t, "the heartbeat to reconnect after its connection was ended", func() bool { return heartbeats() > 0 })
}

// TestColumnTypeChangeStops: a source column whose type changes while the
// reader streams stops the reader with a setup error naming the column and
// the fix, before any value of the new type reaches the mirror, and after
// every transaction before the change is applied: one still waiting in
// the open group, and one whose group already holds part of the
// transaction that brings the new type (the reader reads the slot again
// to stop before it). A start with the mirror still of the old type stops
// too; once the mirror's column is altered, the reader goes on where it
// stopped.
func TestColumnTypeChangeStops(t *testing.T) {
	e := newCDCEnv(t)
	cfg := e.config("snapshot: never", "deletes: hard")
	run := func() (chan error, context.CancelFunc) {
		// Groups wait long enough for changes to be pending in them.
		return e.run(cfg, cdc.Options{GroupAge: 3 * time.Second})
	}
	stopped := e.stopped

	for _, tc := range []struct {
		name string
		// before is applied before the type change; after brings the
		// first value of the new type.
		before, after string
		orders        int64 // mirrored when the reader stops
	}{
		{"first change of the transaction", `INSERT INTO orders VALUES (2, 1, 9.75, '2026-10-05 09:01+00')`,
			`INSERT INTO orders VALUES (3, 1, 'n/a', '2026-10-05 09:05+00')`, 2},
		{"after a change of another table", `INSERT INTO orders VALUES (4, 1, 1.25, '2026-10-05 09:06+00')`,
			`BEGIN; INSERT INTO customers VALUES (1, 'ana', NULL, NULL, NULL);
			 INSERT INTO orders VALUES (5, 1, 'none', '2026-10-05 09:07+00'); COMMIT`, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, cancel := run()
			defer cancel()
			e.waitStreaming(done)
			if tc.orders == 2 {
				e.exec(`INSERT INTO orders VALUES (1, 1, 9.50, '2026-10-05 09:00+00')`)
				e.waitMirrored("")
			}
			e.exec(tc.before)
			if tc.orders == 2 {
				e.exec(`ALTER TABLE orders ALTER COLUMN amount TYPE text USING amount::text`)
			} else {
				e.exec(`ALTER TABLE orders ALTER COLUMN amount TYPE varchar(20)`)
			}
			e.exec(tc.after)
			stopped(done, "amount", "changed type at the source", `ALTER TABLE "mirror"."orders" ALTER COLUMN "amount" TYPE`)
			if n := e.count(`SELECT count(*) FROM mirror.orders`); n != tc.orders {
				t.Errorf("mirror holds %d orders after the stop, want %d (those before the change)", n, tc.orders)
			}
			if n := e.count(`SELECT count(*) FROM mirror.customers`); n != 0 {
				t.Errorf("mirror holds %d customers after the stop, want 0: the transaction with the new type is not applied", n)
			}

			done, cancel = run()
			defer cancel()
			stopped(done, "amount", "in the mirror but")

			typ := "text"
			if tc.orders == 4 {
				typ = "varchar(20)"
			}
			if _, err := e.wh.Exec(e.ctx, `ALTER TABLE mirror.orders ALTER COLUMN amount TYPE `+typ); err != nil {
				t.Fatal(err)
			}
			done, cancel = run()
			defer cancel()
			e.waitStreaming(done)
			e.waitMirrored("")
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("reader: %v", err)
			}
		})
	}
}

// TestDroppedColumnPending: a change waiting in the open group when a
// column is dropped at the source keeps that column's value, in the raw
// change row and in the mirror (which keeps the column).
func TestDroppedColumnPending(t *testing.T) {
	e := newCDCEnv(t)
	e.startWith(e.config("snapshot: never", "deletes: hard"), cdc.Options{GroupAge: 3 * time.Second})
	e.exec(`INSERT INTO customers VALUES (1, 'ana', 'free', NULL, NULL)`)
	e.exec(`ALTER TABLE customers DROP COLUMN tier`)
	e.exec(`INSERT INTO customers VALUES (2, 'ben', NULL, NULL)`)
	e.wantCount("mirrored customers", 2, "SELECT count(*) FROM mirror.customers")
	got := pgtest.Rows(t, e.wh, `
		WITH r AS MATERIALIZED (SELECT row_key, payload FROM raw.shop) -- a join Citus plans over tables not colocated
		SELECT concat_ws(' ', m.id, coalesce(m.tier, 'NULL'), coalesce(r.payload->>'tier', 'absent'))
		FROM mirror.customers m JOIN r ON r.row_key = m.id::text ORDER BY m.id`)
	want := []string{"1 free free", "2 NULL absent"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("mirror tier and raw payload tier by id:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestStreamedTransactions: with logical_decoding_work_mem at its least,
// the source streams large transactions while they run; the reader keeps
// them, in memory and then on disk, until they commit. NULLs survive the
// spill file; a rolled-back subtransaction leaves nothing; DDL of a
// streamed transaction counts only if it commits (a type change or a new
// column rolled back with it neither stops the reader nor reaches the
// mirror; a committed new column does, with its values).
func TestStreamedTransactions(t *testing.T) {
	e := newCDCEnv(t)
	e.srcDSN += "&options=-c%20logical_decoding_work_mem%3D64kB"
	e.start(e.config("snapshot: never\nmax_buffer_bytes: 1MiB", "deletes: hard"))
	e.exec(`INSERT INTO customers SELECT i, repeat('x', 200), NULL, NULL, NULL FROM generate_series(1, 20000) AS i`)
	e.exec(`BEGIN;
		INSERT INTO orders SELECT i, 1, i, '2026-10-05 09:00+00' FROM generate_series(1, 3000) AS i;
		SAVEPOINT s;
		INSERT INTO orders SELECT i, 2, i, '2026-10-05 09:00+00' FROM generate_series(3001, 6000) AS i;
		ROLLBACK TO SAVEPOINT s;
		UPDATE orders SET amount = 0 WHERE id <= 10;
		COMMIT`)
	e.exec(`BEGIN;
		ALTER TABLE customers ALTER COLUMN tier TYPE jsonb USING to_jsonb(tier);
		ALTER TABLE customers ADD COLUMN ghost text;
		UPDATE customers SET tier = '"t"', ghost = 'g' WHERE id <= 3000;
		SELECT pg_sleep(1); -- streamed while in progress
		ROLLBACK`)
	e.exec(`UPDATE customers SET tier = 'pro' WHERE id = 1`)
	e.exec(`BEGIN;
		UPDATE customers SET name = 'y' WHERE id <= 3000;
		ALTER TABLE customers ADD COLUMN region text;
		UPDATE customers SET region = 'eu' WHERE id <= 3000;
		COMMIT`)
	e.waitMirrored("")
	// 20000 + 3010 + 1 + 6000 changes.
	e.wantCount("raw change rows", 29011, "SELECT count(*) FROM raw.shop")
	e.wantCount("mirror rows holding the committed new column's value", 3000,
		"SELECT count(*) FROM mirror.customers WHERE region = 'eu' AND name = 'y'")
	e.wantCount("raw rows keeping tier as JSON null", 17000,
		"SELECT count(*) FROM raw.shop WHERE payload->>'tier' IS NULL AND payload ? 'tier' AND (payload->>'id')::int > 3000")
	e.wantCount("mirror columns added by a rolled-back transaction", 0,
		"SELECT count(*) FROM information_schema.columns WHERE table_schema = 'mirror' AND table_name = 'customers' AND column_name = 'ghost'")
	// The test is about streamed transactions: the source must have
	// streamed and spilled (the statistics arrive with a delay).
	var streamed int64
	if err := waitfor.Poll(waitfor.Timeout, func() bool { streamed = e.streamedTxns(); return streamed >= 3 }); err != nil {
		t.Fatalf("the source streamed %d transactions, want at least 3", streamed)
	}
}

// streamedTxns is how many in-progress transactions the source has
// streamed from the slot.
func (e *cdcEnv) streamedTxns() int64 {
	e.t.Helper()
	var n int64
	if err := e.src.QueryRow(e.ctx, "SELECT coalesce((SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'tidemark_shop'), 0)").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestSlowWarehouseKeepsSession: while the warehouse waits for a lock on a
// mirror for longer than the source's wal_sender_timeout, the reader keeps
// answering the source, so the replication session survives (the source
// does not decode the slot's WAL again), and everything is applied once
// the lock is gone.
func TestSlowWarehouseKeepsSession(t *testing.T) {
	const walSenderTimeout = 2 * time.Second
	e := newCDCEnv(t)
	e.srcDSN += fmt.Sprintf("&options=-c%%20wal_sender_timeout%%3D%dms", walSenderTimeout.Milliseconds())
	e.startWith(e.config("snapshot: never", "deletes: hard"), cdc.Options{GroupChanges: 1, GroupAge: 20 * time.Millisecond})
	e.exec(`INSERT INTO orders VALUES (1, 1, 1, '2026-10-05 09:00+00')`)
	e.waitMirrored("")
	pid := e.slotPID
	before := pid()

	unlock := e.lockMirror("orders")
	// Transactions enough to fill the groups that may commit at once and
	// the open one: the stream itself has to wait.
	for i := 2; i <= 40; i++ {
		e.exec(`INSERT INTO orders VALUES ($1, 1, 1, '2026-10-05 09:00+00')`, i)
	}
	e.waitLockWaiter("orders")
	e.waitAnswered(before, 2*walSenderTimeout)
	unlock()
	e.waitMirrored("")
	if after := pid(); after != before {
		t.Errorf("the replication session was replaced (walsender %d, now %d): the reader stopped answering while the warehouse waited", before, after)
	}
	e.wantCount("raw change rows", 40, "SELECT count(*) FROM raw.shop")

	// A schema change makes the stream wait for the group before it,
	// which waits for the lock.
	unlock = e.lockMirror("orders")
	e.exec(`INSERT INTO orders VALUES (41, 1, 1, '2026-10-05 09:00+00')`)
	e.waitLockWaiter("orders")
	e.exec(`ALTER TABLE orders ADD COLUMN channel text`)
	e.exec(`INSERT INTO orders VALUES (42, 1, 1, '2026-10-05 09:00+00', 'app')`)
	e.waitSent()
	e.waitAnswered(before, 2*walSenderTimeout)
	unlock()
	e.wantCount("mirror columns named channel", 1,
		"SELECT count(*) FROM information_schema.columns WHERE table_schema = 'mirror' AND table_name = 'orders' AND column_name = 'channel'")
	e.wantCount("mirrored orders with the new column's value", 1, "SELECT count(*) FROM mirror.orders WHERE channel = 'app'")
	if after := pid(); after != before {
		t.Errorf("the replication session was replaced at a schema change (walsender %d, now %d)", before, after)
	}
}

// waitAnswered waits, while the warehouse stalls the reader, until the
// source's walsender pid has had a reply from the reader more than d
// after now by the source's clock: the replication session outlived d,
// answered. The walsender ending first fails the test.
func (e *cdcEnv) waitAnswered(pid int64, d time.Duration) {
	e.t.Helper()
	var from time.Time
	if err := e.src.QueryRow(e.ctx, "SELECT clock_timestamp()").Scan(&from); err != nil {
		e.t.Fatal(err)
	}
	waitfor.Until(e.t, fmt.Sprintf("walsender %d to hear from the reader %s after the stall began", pid, d), func() bool {
		var answered bool
		err := e.src.QueryRow(e.ctx, "SELECT coalesce(reply_time > $2, false) FROM pg_stat_replication WHERE pid = $1", pid, from.Add(d)).Scan(&answered)
		if errors.Is(err, pgx.ErrNoRows) {
			e.t.Fatalf("walsender %d ended while the warehouse stalled the reader: the reader stopped answering the source", pid)
		}
		if err != nil {
			e.t.Fatal(err)
		}
		return answered
	})
}

// TestTypeChangeStopCommitsWhatCameBefore: the stop before a transaction
// that brings a new column type applies every transaction before it, in
// three harder cases. A group still committing (blocked by a lock on its
// mirror) when the type change arrives is not read again; a column that a
// rolled-back open group had added to a mirror is added again when the
// slot is read again; and a streamed transaction whose first item is the
// type change is not confirmed by the stop, so that it is applied once the
// mirror's column is altered.
func TestTypeChangeStopCommitsWhatCameBefore(t *testing.T) {
	// seeded returns a source (its DSN extended by options) with one order
	// and one customer, mirrored by a reader that groups for age, and the
	// channel that reader's Run ends on.
	seeded := func(t *testing.T, options string, age time.Duration) (*cdcEnv, *config.Config, chan error) {
		t.Helper()
		e := newCDCEnv(t)
		e.srcDSN += options
		cfg := e.config("snapshot: never", "deletes: hard")
		done, cancel := e.run(cfg, cdc.Options{GroupAge: age})
		t.Cleanup(cancel)
		e.waitStreaming(done)
		e.exec(`INSERT INTO orders VALUES (1, 1, 9.50, '2026-10-05 09:00+00')`)
		e.exec(`INSERT INTO customers VALUES (1, 'ana', NULL, NULL, NULL)`)
		e.waitMirrored("")
		return e, cfg, done
	}
	t.Run("while a group commits", func(t *testing.T) {
		e, _, done := seeded(t, "", 20*time.Millisecond)
		lock := e.lockMirror("customers")
		e.exec(`INSERT INTO customers VALUES (2, 'ben', NULL, NULL, NULL)`)
		e.waitLockWaiter("customers") // its group commits, waiting for the lock
		e.exec(`ALTER TABLE orders ALTER COLUMN amount TYPE text USING amount::text`)
		e.exec(`BEGIN; INSERT INTO customers VALUES (3, 'cy', NULL, NULL, NULL);
			INSERT INTO orders VALUES (5, 1, 'none', '2026-10-05 09:07+00'); COMMIT`)
		e.waitSent() // the type change reaches the reader while the group commits
		lock()
		e.stopped(done, "changed type at the source")
		e.wantCount("mirrored customers (ana and ben, not cy)", 2, "SELECT count(*) FROM mirror.customers")
		e.wantCount("raw change rows", 3, "SELECT count(*) FROM raw.shop")
	})
	t.Run("after a column added in the open group", func(t *testing.T) {
		e, _, done := seeded(t, "", 3*time.Second)
		e.exec(`ALTER TABLE customers ADD COLUMN region text`)
		e.exec(`ALTER TABLE orders ALTER COLUMN amount TYPE text USING amount::text`)
		e.exec(`INSERT INTO customers VALUES (2, 'ben', NULL, NULL, NULL, 'eu')`)
		e.exec(`BEGIN; INSERT INTO customers VALUES (3, 'cy', NULL, NULL, NULL, 'us');
			INSERT INTO orders VALUES (5, 1, 'none', '2026-10-05 09:07+00'); COMMIT`)
		e.stopped(done, "changed type at the source")
		e.wantCount("mirrored customers in region eu (ben, not cy)", 1, "SELECT count(*) FROM mirror.customers WHERE region = 'eu'")
		e.wantCount("mirrored customers", 2, "SELECT count(*) FROM mirror.customers")
	})
	t.Run("streamed transaction", func(t *testing.T) {
		e, cfg, done := seeded(t, "&options=-c%20logical_decoding_work_mem%3D64kB", 3*time.Second)
		lock := e.lockMirror("customers")
		x, err := e.src.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = x.Rollback(e.ctx) }()
		for _, q := range []string{`ALTER TABLE orders ALTER COLUMN amount TYPE text USING amount::text`,
			`INSERT INTO orders SELECT i, 1, 'n/a', '2026-10-05 09:00+00' FROM generate_series(10, 3009) AS i`} {
			if _, err := x.Exec(e.ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		e.waitSent() // streamed while in progress
		e.exec(`INSERT INTO customers VALUES (2, 'ben', NULL, NULL, NULL)`)
		if err := x.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.waitSent()
		lock()
		e.stopped(done, "changed type at the source")
		if _, err := e.wh.Exec(e.ctx, `ALTER TABLE mirror.orders ALTER COLUMN amount TYPE text`); err != nil {
			t.Fatal(err)
		}
		e.start(cfg)
		e.waitMirrored("")
	})
}

// TestStopWhileChunkWaits: a stop while the stream waits for a chunk that
// waits for a lock on its mirror ends the reader at once; the chunk's
// group holds an unfinished transaction and cannot commit anyway.
func TestStopWhileChunkWaits(t *testing.T) {
	e := newCDCEnv(t)
	done, cancel := e.run(e.config("snapshot: never", "deletes: hard"), cdc.Options{GroupAge: 20 * time.Millisecond})
	defer cancel()
	e.waitStreaming(done)
	e.exec(`INSERT INTO customers VALUES (0, 'ana', NULL, NULL, NULL)`)
	e.waitMirrored("")
	lock := e.lockMirror("customers")
	defer lock()
	e.exec(`INSERT INTO customers SELECT i, 'x', NULL, NULL, NULL FROM generate_series(1, 25000) AS i`)
	e.waitLockWaiter("customers")
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("reader: %v", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the reader took %v to stop", took)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the reader did not stop")
	}
}

// lockWaiters is how many warehouse sessions wait for a lock in a
// statement that names table.
func (e *cdcEnv) lockWaiters(table string) int64 {
	e.t.Helper()
	var n int64
	if err := e.wh.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND backend_type = 'client backend' AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, table).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// waitLockWaiter waits until a warehouse session waits for a lock in a
// statement that names table: a reader's write held up by lockMirror.
func (e *cdcEnv) waitLockWaiter(table string) {
	e.t.Helper()
	if err := waitfor.Poll(waitfor.Timeout, func() bool { return e.lockWaiters(table) > 0 }); err != nil {
		for _, r := range pgtest.Rows(e.t, e.wh, `SELECT concat_ws(' | ', pid, backend_type, state, wait_event_type, wait_event,
			to_char(query_start, 'HH24:MI:SS.MS'), to_char(state_change, 'HH24:MI:SS.MS'), left(query, 120))
			FROM pg_stat_activity WHERE datname = current_database() ORDER BY pid`) {
			e.t.Log("warehouse session: " + r)
		}
		e.t.Fatalf("waited %s for a warehouse statement on %s to wait for its lock", waitfor.Timeout, table)
	}
}

// waitSent waits until the walsender of the slot has sent everything the
// source has written so far, also of transactions still open. A walsender
// reads no further than the WAL flushed, and the last page of an open
// transaction may wait for a flush: the commit of an empty transaction
// (which pgoutput does not send) flushes it.
func (e *cdcEnv) waitSent() {
	e.t.Helper()
	e.exec("SELECT pg_current_xact_id()")
	var end string
	if err := e.src.QueryRow(e.ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&end); err != nil {
		e.t.Fatal(err)
	}
	waitfor.Until(e.t, "the walsender to send the source's WAL up to "+end, func() bool {
		var sent bool
		if err := e.src.QueryRow(e.ctx, `SELECT coalesce((SELECT r.sent_lsn >= $1::pg_lsn FROM pg_stat_replication r
			JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 'tidemark_shop'), false)`, end).Scan(&sent); err != nil {
			e.t.Fatal(err)
		}
		return sent
	})
}

// lockMirror takes an ACCESS EXCLUSIVE lock on a mirror table and returns
// the function that releases it (once).
func (e *cdcEnv) lockMirror(table string) func() {
	e.t.Helper()
	tx, err := e.wh.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, "LOCK TABLE "+pgx.Identifier{"mirror", table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		e.t.Fatal(err)
	}
	var once sync.Once
	unlock := func() { once.Do(func() { _ = tx.Rollback(e.ctx) }) }
	e.t.Cleanup(unlock) // a test that fails holding the lock must not hang the pool's Close
	return unlock
}

// TestSlotIdentityRefused: the reader refuses to go on silently when the
// slot or the server is not the one it read from (another server, as after
// a failover; a slot another client advanced past what tidemark applied)
// or when an existing slot cannot be joined to a snapshot. Each case stops
// with an ErrSetup naming the fix, and nothing is applied.
func TestSlotIdentityRefused(t *testing.T) {
	pgtest.CitusIndependent(t)
	for _, tc := range []struct {
		name string
		// before runs after a first reader has stopped, when first is
		// set; on a source with no reader yet otherwise.
		first  bool
		before []string
		want   []string
	}{
		{name: "another server", first: true,
			before: []string{`UPDATE tidemark.cdc_positions SET system_id = '12345'`},
			want:   []string{"another server", "system identifier", "tidemark resync shop --new-slot"}},
		{name: "slot advanced by another client", first: true,
			// The test server commits asynchronously; decoding, and so
			// the advance, stops at the flushed WAL.
			before: []string{`BEGIN; SET LOCAL synchronous_commit = on; INSERT INTO orders VALUES (7, 1, 7, '2026-10-05 10:00+00'); COMMIT`,
				`SELECT pg_replication_slot_advance('tidemark_shop', pg_current_wal_flush_lsn())`},
			want: []string{"beyond what tidemark applied", "tidemark resync shop --new-slot"}},
		{name: "existing slot never read",
			before: []string{`SELECT pg_create_logical_replication_slot('tidemark_shop', 'pgoutput')`},
			want:   []string{"never read from it", "cdc.snapshot: never"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newCDCEnv(t)
			cfg := e.config("", "deletes: hard")
			if tc.first {
				done, stop := e.run(cfg, cdc.Options{GroupAge: 20 * time.Millisecond})
				e.waitStreaming(done)
				stop()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				e.waitSlotFree()
			}
			for _, sql := range tc.before {
				if strings.HasPrefix(sql, "UPDATE tidemark.") {
					if _, err := e.wh.Exec(e.ctx, sql); err != nil {
						t.Fatal(err)
					}
					continue
				}
				e.exec(sql)
			}
			done, stop := e.run(cfg, cdc.Options{GroupAge: 20 * time.Millisecond})
			defer stop()
			e.stopped(done, tc.want...)
			if n := e.count("SELECT count(*) FROM raw.shop"); n != 0 {
				t.Errorf("%d raw change rows applied, want none", n)
			}
		})
	}
}

// TestOneReaderPerSlot: a second reader of the same source waits while the
// first streams, and takes over once it stops.
func TestOneReaderPerSlot(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	cfg := e.config("snapshot: never", "deletes: hard")
	first, stopFirst := e.run(cfg, cdc.Options{GroupAge: 20 * time.Millisecond})
	e.waitStreaming(first)
	activePID := e.slotPID
	// The slot can be free for a moment between its creation and
	// START_REPLICATION (seen on PostgreSQL 14): its pid is read once the
	// streaming walsender holds it.
	var streaming int64
	waitfor.Until(t, "the first reader's walsender to hold the slot", func() bool { streaming = activePID(); return streaming != 0 })
	// Not e.run: it waits for the slot to be free.
	opts := cdc.Options{GroupAge: 20 * time.Millisecond, Logger: testLogger(t), Registerer: prometheus.NewRegistry()}
	var refused atomic.Int64
	cdc.SetOnSlotLockBusy(&opts, func() { refused.Add(1) })
	r, err := cdc.New(shopConfig(t, cfg), e.readers, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stopSecond := context.WithCancel(e.ctx)
	second := make(chan error, 1)
	go func() { second <- r.Run(ctx) }()
	defer func() {
		stopSecond()
		if err := <-second; err != nil {
			t.Errorf("second reader: %v", err)
		}
	}()

	e.exec(`INSERT INTO orders VALUES (1, 1, 1, '2026-10-05 10:00+00')`)
	e.wantCount("orders mirrored by the first reader", 1, "SELECT count(*) FROM mirror.orders")
	// The second reader finds the slot's lock held, and again when it
	// tries once more: it waits, and its chance to take the slot, which
	// it must not, has passed.
	waitfor.Until(t, "the second reader to find the slot's lock held twice", func() bool { return refused.Load() >= 2 })
	var sessions int
	if err := e.src.QueryRow(e.ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&sessions); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-second:
		t.Fatalf("the second reader stopped while the first streamed: %v", err)
	default:
	}
	if sessions != 1 || activePID() != streaming {
		t.Errorf("%d replication sessions, slot held by pid %d (first reader's: %d); want the first reader alone", sessions, activePID(), streaming)
	}

	stopFirst()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO orders VALUES (2, 1, 2, '2026-10-05 10:00+00')`)
	e.wantCount("orders mirrored after the take-over", 2, "SELECT count(*) FROM mirror.orders")
	e.wantCount("raw change rows", 2, "SELECT count(*) FROM raw.shop")
}

// TestSlotCreatedBeforeCrash: a reader that dies after creating its slot
// and before storing the slot's consistent point (a pending position
// without one) is not refused on its next start: the slot is dropped and
// created again, and the reader streams.
func TestSlotCreatedBeforeCrash(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	var system string
	if err := e.src.QueryRow(e.ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&system); err != nil {
		t.Fatal(err)
	}
	if _, err := e.wh.Exec(e.ctx, `INSERT INTO tidemark.cdc_positions (source, slot, system_id, snapshot, updated_at)
		VALUES ('shop', 'tidemark_shop', $1, 'pending', now())`, system); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO orders VALUES (1, 1, 1, '2026-10-05 10:00+00')`)
	e.exec(`SELECT pg_create_logical_replication_slot('tidemark_shop', 'pgoutput')`)
	e.exec(`INSERT INTO orders VALUES (2, 1, 2, '2026-10-05 10:00+00')`)
	e.start(e.config("", "deletes: hard"))
	e.exec(`INSERT INTO orders VALUES (3, 1, 3, '2026-10-05 10:00+00')`)
	e.waitMirrored("")
}

// TestStartWaitsForBusySlot: a reader that finds its slot still held by a
// walsender (one that is ending, as after the reader closed a replication
// connection to read the slot again) waits for it instead of failing its
// start, which would restart it with the start's checks.
func TestStartWaitsForBusySlot(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	cfg := e.config("snapshot: never", "deletes: hard")
	done, stop := e.run(cfg, cdc.Options{GroupAge: 20 * time.Millisecond})
	e.waitStreaming(done)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.waitSlotFree()

	// Another connection holds the slot for a while.
	holder, err := pgconn.Connect(e.ctx, e.srcDSN+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(e.ctx)
	var confirmed string
	if err := e.src.QueryRow(e.ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'").Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	at, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(e.ctx, holder, "tidemark_shop", at, pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '2'", "publication_names 'tidemark_shop'"}}); err != nil {
		t.Fatal(err)
	}

	var logs syncbuf.Buffer
	r, err := cdc.New(shopConfig(t, cfg), e.readers, cdc.Options{GroupAge: 20 * time.Millisecond, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	second := make(chan error, 1)
	go func() { second <- r.Run(ctx) }()
	// The reader's walsender has been asked to stream the held slot.
	waitfor.Until(t, "the reader to ask for the slot another connection holds", func() bool {
		var n int
		if err := e.src.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE backend_type = 'walsender' AND query LIKE 'START_REPLICATION SLOT%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n >= 2
	})
	holder.Close(e.ctx)
	e.exec(`INSERT INTO orders VALUES (1, 1, 1, '2026-10-05 10:00+00')`)
	e.wantCount("orders mirrored once the slot is free", 1, "SELECT count(*) FROM mirror.orders")
	cancel()
	if err := <-second; err != nil {
		t.Errorf("reader: %v", err)
	}
	if strings.Contains(logs.String(), "restarting") {
		t.Errorf("the reader restarted instead of waiting for the slot:\n%s", logs.String())
	}
}
