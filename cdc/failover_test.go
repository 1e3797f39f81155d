package cdc_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
)

// failoverEnv is a source primary with a hot standby, a warehouse, and a
// CDC source "shop" of the customers table, read as envOptions say: from
// both servers (a failover slot) or from the standby (decoding on a
// standby).
type failoverEnv struct {
	t                *testing.T
	ctx              context.Context
	primary, standby *pgserver.Server
	srcDSN           string // where the test writes: the source database on the primary, or on both servers
	readDSN          string // cdc.dsn
	primaryDSN       string // cdc.primary_dsn, "" for none
	snapshot         string // cdc.snapshot
	wh               *pgxpool.Pool
	whDSN            string
	changes          int    // row changes made at the source
	failover         string // cdc.failover_slot, "" for the default
}

// envOptions say what newFailoverEnv builds.
type envOptions struct {
	// needs names what the test needs and major the PostgreSQL major
	// version it needs it from ("failover slots need", 17): older servers
	// skip the test.
	needs string
	major int
	// standby are the standby's settings.
	standby map[string]string
	// synchronized names the standby in the primary's
	// synchronized_standby_slots: no logical consumer gets ahead of it.
	synchronized bool
	// onStandby makes the reader read the standby, from a snapshot of 50
	// rows written before the standby started; otherwise it reads through
	// a DSN that names both servers, as the test writes, without a
	// snapshot.
	onStandby bool
	// withPrimary sets cdc.primary_dsn (with onStandby).
	withPrimary bool
}

// failoverSlots are the options of the failover slot tests: PostgreSQL 17,
// and a standby that syncs the reader's slot by its slot sync worker or
// (syncWorker false) when the test syncs it by hand.
func failoverSlots(syncWorker bool) envOptions {
	sync := "off"
	if syncWorker {
		sync = "on"
	}
	return envOptions{needs: "failover slots need", major: 17, standby: map[string]string{"sync_replication_slots": sync}, synchronized: true}
}

// newFailoverEnv starts the servers and migrates the warehouse.
func newFailoverEnv(t *testing.T, o envOptions) *failoverEnv {
	t.Helper()
	e := &failoverEnv{t: t, ctx: context.Background(), snapshot: "never"}
	e.primary = pgtest.NewServer(t, pgserver.Options{})
	if v := serverVersion(t, e.primary); v < o.major*10000 {
		t.Skipf("%s PostgreSQL %d or later (this is %d): make test PG=%[2]d", o.needs, o.major, v)
	}
	dsn := pgtest.NewDatabaseOn(t, e.primary)
	src := pgtest.Pool(t, dsn)
	if _, err := src.Exec(e.ctx, shopDDL); err != nil {
		t.Fatal(err)
	}
	e.srcDSN = dsn
	if o.onStandby {
		e.write(1000, 50)
		e.changes = 0 // the snapshot's rows, not changes
	}
	e.standby = pgtest.NewStandby(t, e.primary, pgserver.StandbyOptions{Settings: o.standby})
	if o.synchronized {
		if err := e.primary.Configure(e.ctx, map[string]string{"synchronized_standby_slots": pgserver.DefaultStandbyName}); err != nil {
			t.Fatal(err)
		}
	}
	if o.onStandby {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		e.readDSN, e.snapshot = e.standby.URL(strings.TrimPrefix(u.Path, "/")), "initial"
		if o.withPrimary {
			e.primaryDSN = dsn
		}
	} else {
		e.srcDSN = pgtest.MultiHostDSN(t, dsn, e.primary, e.standby)
		e.readDSN = e.srcDSN
	}
	e.wh, e.whDSN = pgtest.NewPool(t)
	if _, err := migrate.Up(e.ctx, e.whDSN, nil); err != nil {
		t.Fatal(err)
	}
	return e
}

func serverVersion(t *testing.T, s *pgserver.Server) int {
	t.Helper()
	var v int
	if err := pgtest.Conn(t, s.URL("postgres")).QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func (e *failoverEnv) config() *config.Config {
	e.t.Helper()
	primary := ""
	if e.primaryDSN != "" {
		primary = fmt.Sprintf("\n      primary_dsn: %q", e.primaryDSN)
	}
	yaml := fmt.Sprintf(`warehouse: {dsn: %q}
sources:
  shop:
    cdc:
      dsn: %q%s
      tables: [customers]
      snapshot: %s
      status_every: 200ms
      heartbeat_every: 1s
      failover_slot: %s
    mirror: {schema: mirror}
`, e.whDSN, e.readDSN, primary, e.snapshot, cmp.Or(e.failover, "auto"))
	cfg, err := config.Parse("t.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		e.t.Fatalf("config: %v\n%s", err, yaml)
	}
	return cfg
}

// run starts a reader, with log (the test's when nil), and returns the
// channel its Run ends on and the function that stops it.
func (e *failoverEnv) run(log *slog.Logger) (chan error, context.CancelFunc) {
	e.t.Helper()
	if log == nil {
		log = testLogger(e.t)
	}
	r, err := cdc.New(shopConfig(e.t, e.config()), pgtest.Pool(e.t, e.whDSN), cdc.Options{GroupAge: 20 * time.Millisecond,
		Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return done, cancel
}

// confirmed is the position the warehouse stored as confirmed.
func (e *failoverEnv) confirmed() pglogrepl.LSN {
	e.t.Helper()
	var text string
	if err := e.wh.QueryRow(e.ctx, `SELECT confirmed_lsn::text FROM tidemark.cdc_positions WHERE source = 'shop'`).Scan(&text); err != nil {
		e.t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(text)
	if err != nil {
		e.t.Fatal(err)
	}
	return lsn
}

// start runs a reader until stop is called or the test ends, once it
// streams; log, when set, receives its log.
func (e *failoverEnv) start(log *slog.Logger) (stop func(), done chan error) {
	e.t.Helper()
	done, cancel := e.run(log)
	src := pgtest.Pool(e.t, e.readDSN)
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("reader: %v", err)
			}
		case <-time.After(time.Minute):
			e.t.Errorf("the reader did not stop within a minute")
		}
	}
	e.t.Cleanup(stop)
	waitfor.Until(e.t, "the reader to stream", func() bool {
		var active bool
		err := src.QueryRow(e.ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'").Scan(&active)
		var n int
		if err == nil && active {
			err = e.wh.QueryRow(e.ctx, "SELECT count(*) FROM tidemark.cdc_positions WHERE snapshot <> 'pending'").Scan(&n)
		}
		select {
		case err := <-done:
			done <- err
			e.t.Fatalf("reader stopped: %v", err)
		default:
		}
		return err == nil && active && n == 1
	})
	return stop, done
}

// write changes the customers at the source, through whichever server
// is the primary: n inserts from id, and an update and a delete of
// earlier ones.
func (e *failoverEnv) write(from, n int) {
	e.t.Helper()
	src := pgtest.Conn(e.t, e.srcDSN)
	for i := from; i < from+n; i++ {
		if _, err := src.Exec(e.ctx, `INSERT INTO customers (id, name) VALUES ($1, $2)`, i, fmt.Sprintf("c%d", i)); err != nil {
			e.t.Fatal(err)
		}
		e.changes++
		if i%5 == 4 {
			if _, err := src.Exec(e.ctx, `UPDATE customers SET tier = 'gold' WHERE id = $1`, i-2); err != nil {
				e.t.Fatal(err)
			}
			if _, err := src.Exec(e.ctx, `DELETE FROM customers WHERE id = $1`, i-3); err != nil {
				e.t.Fatal(err)
			}
			e.changes += 2
		}
	}
}

// waitMirrored waits until the mirror equals the source, as the current
// primary holds it, and checks that each change is one raw row.
func (e *failoverEnv) waitMirrored() {
	e.t.Helper()
	src := pgtest.Pool(e.t, e.srcDSN)
	var diff string
	if err := waitfor.Poll(waitfor.Timeout, func() bool {
		want := pgtest.Rows(e.t, src, fmt.Sprintf(customerRows, "customers", ""))
		got := pgtest.Rows(e.t, e.wh, fmt.Sprintf(customerRows, "mirror.customers", "WHERE deleted_at IS NULL"))
		diff = fmt.Sprintf("source %d rows, mirror %d", len(want), len(got))
		return strings.Join(want, "\n") == strings.Join(got, "\n")
	}); err != nil {
		e.t.Fatalf("the mirror did not converge: %s", diff)
	}
	var rows, distinct int
	if err := e.wh.QueryRow(e.ctx, `SELECT count(*), count(DISTINCT event_id) FROM raw.shop`).Scan(&rows, &distinct); err != nil {
		e.t.Fatal(err)
	}
	if rows != e.changes || distinct != e.changes {
		e.t.Errorf("raw.shop holds %d change rows (%d distinct), want each of the %d changes once", rows, distinct, e.changes)
	}
}

// standbySlot reads the standby's copy of the slot.
func (e *failoverEnv) standbySlot() cdc.StandbySlot {
	e.t.Helper()
	st, err := cdc.CheckStandby(e.ctx, pgtest.Conn(e.t, e.standby.URL("postgres")), "tidemark_shop")
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// waitSynced waits until the standby has a synced copy of the slot,
// confirmed at least as far as the warehouse's stored position. A new
// slot is synced once it has advanced past a running-transactions record
// that the standby has: the primary logs one on demand.
func (e *failoverEnv) waitSynced(byHand bool) {
	e.t.Helper()
	primary := pgtest.Conn(e.t, e.primary.URL("postgres"))
	standby := pgtest.Conn(e.t, e.standby.URL("postgres"))
	var stored string
	waitfor.Until(e.t, "the standby to have the slot synced", func() bool {
		if _, err := primary.Exec(e.ctx, `SELECT pg_log_standby_snapshot()`); err != nil {
			e.t.Fatal(err)
		}
		if byHand {
			// Refused until the slot passed a running-transactions
			// record the standby replayed: tried again.
			_, _ = standby.Exec(e.ctx, `SELECT pg_sync_replication_slots()`)
		}
		if err := e.wh.QueryRow(e.ctx, `SELECT confirmed_lsn::text FROM tidemark.cdc_positions WHERE source = 'shop'`).Scan(&stored); err != nil {
			e.t.Fatal(err)
		}
		want, err := pglogrepl.ParseLSN(stored)
		if err != nil {
			e.t.Fatal(err)
		}
		st := e.standbySlot()
		return st.Synced && st.Confirmed >= want && st.Confirmed != 0
	})
}

// TestFailoverSlotFollowsPromotion: on PostgreSQL 17 the reader creates a
// failover slot, which the standby syncs; the primary crashes and the
// standby is promoted, with changes applied and synced, applied and not
// yet synced, and committed and not yet consumed; the reader, whose DSN
// names both servers, resumes on the promoted standby from its own stored
// position: the mirror equals the source and each change is one raw row.
func TestFailoverSlotFollowsPromotion(t *testing.T) {
	pgtest.CitusIndependent(t)
	for _, tt := range []struct {
		name       string
		syncWorker bool
	}{
		{"sync worker", true},
		// The slot synced once by hand: the promoted slot lags what the
		// reader applied, deterministically.
		{"slot behind the reader", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newFailoverEnv(t, failoverSlots(tt.syncWorker))
			stop, _ := e.start(nil)
			e.write(0, 20)
			e.waitMirrored()
			var failover bool
			if err := pgtest.Conn(t, e.primary.URL("postgres")).QueryRow(e.ctx,
				`SELECT failover FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'`).Scan(&failover); err != nil || !failover {
				t.Fatalf("the reader's slot is a failover slot: %v (%v)", failover, err)
			}
			e.waitSynced(!tt.syncWorker)
			// Applied and not synced yet (by hand: never).
			e.write(100, 20)
			e.waitMirrored()
			// Committed and not consumed.
			stop()
			e.write(200, 10)
			pgtest.WaitReplayed(t, e.primary, e.standby)
			pgtest.Failover(t, e.primary, e.standby)
			if !tt.syncWorker {
				if st := e.standbySlot(); !st.Exists {
					t.Fatal("the promoted standby has no copy of the slot")
				}
			}
			e.start(nil)
			e.waitMirrored()
			e.write(300, 10)
			e.waitMirrored()
		})
	}
}

// TestFailoverSlotStandbyDown: with the standby named in
// synchronized_standby_slots down, the walsender holds changes back and
// warns in the stream; the reader logs the warning and waits, without an
// error, and the changes flow once the standby no longer holds them.
func TestFailoverSlotStandbyDown(t *testing.T) {
	e := newFailoverEnv(t, failoverSlots(true))
	logs := kafkatest.NewLogRecorder(slog.LevelWarn)
	_, done := e.start(slog.New(logs))
	e.write(0, 5)
	e.waitMirrored()
	if err := e.standby.Stop(); err != nil {
		t.Fatal(err)
	}
	e.write(100, 5)
	wctx, cancel := context.WithTimeout(e.ctx, waitfor.Timeout)
	defer cancel()
	if _, err := logs.Wait(wctx, func(l kafkatest.LogLine) bool {
		return strings.Contains(l.Msg, "walsender sent a notice") && strings.Contains(l.Attrs["message"], pgserver.DefaultStandbyName)
	}); err != nil {
		t.Fatalf("no notice of the walsender logged: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the reader stopped: %v", err)
	default:
	}
	if err := e.primary.Configure(e.ctx, map[string]string{"synchronized_standby_slots": "''"}); err != nil {
		t.Fatal(err)
	}
	e.waitMirrored()
	for _, l := range logs.Lines() {
		if strings.Contains(l.Msg, "restarting") {
			t.Errorf("the reader restarted: %s", l)
		}
	}
}

// TestFailoverSlotMadeAtStart: a slot the reader created with
// failover_slot: off is made a failover slot when the reader starts with
// auto on PostgreSQL 17 (ALTER_REPLICATION_SLOT), and streaming goes on.
func TestFailoverSlotMadeAtStart(t *testing.T) {
	e := newFailoverEnv(t, failoverSlots(true))
	e.failover = "off"
	stop, _ := e.start(nil)
	e.write(0, 5)
	e.waitMirrored()
	stop()
	slotFailover := func() bool {
		t.Helper()
		var failover bool
		if err := pgtest.Conn(t, e.primary.URL("postgres")).QueryRow(e.ctx,
			`SELECT failover FROM pg_replication_slots WHERE slot_name = 'tidemark_shop'`).Scan(&failover); err != nil {
			t.Fatal(err)
		}
		return failover
	}
	if slotFailover() {
		t.Fatal("failover_slot: off made a failover slot")
	}
	e.failover = "auto"
	e.start(nil)
	if !slotFailover() {
		t.Error("the slot is not a failover slot after a start with failover_slot: auto")
	}
	e.write(100, 5)
	e.waitMirrored()
}

// TestFailoverSlotOnRefused: failover_slot: on is refused, naming the key,
// by a source older than PostgreSQL 17 (on 17 and later, by a standby).
func TestFailoverSlotOnRefused(t *testing.T) {
	pgtest.CitusIndependent(t)
	e := newCDCEnv(t)
	dsn := e.srcDSN
	want := "failover slots need 17 or later"
	var v int
	if err := e.src.QueryRow(e.ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v >= 170000 {
		primary := pgtest.NewServer(t, pgserver.Options{})
		standby := pgtest.NewStandby(t, primary, pgserver.StandbyOptions{})
		dsn, want = standby.URL("postgres"), "is a standby"
	}
	cfg := e.config("failover_slot: on", "")
	cfg.Sources["shop"].CDC.DSN = dsn
	done, cancel := e.run(cfg, cdc.Options{})
	defer cancel()
	e.stopped(done, "sources.shop.cdc.failover_slot", want)
}
