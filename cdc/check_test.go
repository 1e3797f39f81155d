package cdc_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// checkEnv is a fresh source database for one Check case, with a slot name
// and a role name of its own (both are global to the server).
type checkEnv struct {
	t     *testing.T
	dsn   string    // the database, as the superuser
	admin *pgx.Conn // superuser connection to it
	slot  string
	role  string
}

// newCheckEnv creates a database on the shared server.
func newCheckEnv(t *testing.T) *checkEnv {
	t.Helper()
	return newCheckEnvAt(t, pgtest.NewDatabase(t))
}

// newCheckEnvAt uses the fresh database at dsn. The slot and role it names
// are dropped when the test ends, before the database is.
func newCheckEnvAt(t *testing.T, dsn string) *checkEnv {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	e := &checkEnv{t: t, dsn: dsn, slot: "check_slot_" + suffix, role: "check_role_" + suffix}
	e.admin = checkConnect(t, dsn)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, sql := range []string{
			`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '` + e.slot + `'`,
			`DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '` + e.role + `') THEN
				DROP OWNED BY ` + e.role + `; DROP ROLE ` + e.role + `; END IF; END $$`,
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Logf("cleanup: %v", err)
			}
		}
	})
	return e
}

// exec runs statements as the superuser; {slot} and {role} stand for the
// case's slot and role names.
func (e *checkEnv) exec(sqls ...string) {
	e.t.Helper()
	r := strings.NewReplacer("{slot}", e.slot, "{role}", e.role)
	for _, sql := range sqls {
		if _, err := e.admin.Exec(context.Background(), r.Replace(sql)); err != nil {
			e.t.Fatalf("%s: %v", sql, err)
		}
	}
}

// connectAs connects to the database as role (the superuser if "").
func (e *checkEnv) connectAs(role string) *pgx.Conn {
	e.t.Helper()
	if role == "" {
		return e.admin
	}
	u, err := url.Parse(e.dsn)
	if err != nil {
		e.t.Fatal(err)
	}
	u.User = url.User(role)
	return checkConnect(e.t, u.String())
}

// spec is the CheckSpec of the cases: source shop, table public.orders.
func (e *checkEnv) spec() cdc.CheckSpec {
	return cdc.CheckSpec{
		Source:      "shop",
		Slot:        e.slot,
		Publication: "tidemark_shop",
		Tables:      []pgx.Identifier{{"public", "orders"}},
	}
}

func checkConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func runCheck(t *testing.T, conn *pgx.Conn, spec cdc.CheckSpec) (cdc.Report, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cdc.Check(ctx, conn, spec)
}

// wantSetupError fails unless err wraps cdc.ErrSetup and its text holds
// every one of want.
func wantSetupError(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Check succeeded; want an ErrSetup mentioning %q", want)
	}
	t.Logf("Check: %v", err)
	if !errors.Is(err, cdc.ErrSetup) {
		t.Fatalf("Check error %q does not wrap ErrSetup", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Check error %q does not mention %q", err, w)
		}
	}
}

// wantWarnings fails unless there is one warning per entry of want, each
// holding that text.
func wantWarnings(t *testing.T, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("warnings %q; want %d mentioning %q", got, len(want), want)
	}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Errorf("warning %q does not mention %q", got[i], w)
		}
	}
}

const (
	ordersDDL      = `CREATE TABLE public.orders (id int PRIMARY KEY, code text NOT NULL, note text)`
	ordersPubDDL   = `CREATE PUBLICATION tidemark_shop FOR TABLE public.orders`
	storedPosition = pglogrepl.LSN(0x16B3748)
)

func TestCheck(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup []string // SQL run as the superuser before Check
		// prepare, when set, runs after setup, for setups that need more
		// than SQL on this database.
		prepare func(t *testing.T, e *checkEnv)
		spec    func(s *cdc.CheckSpec)
		as      string // role to run Check as: "" superuser, "{role}" the case's role
		// wantErr lists texts the ErrSetup must hold; nil: no error.
		wantErr  []string
		warnings []string // one text per expected warning
		report   func(t *testing.T, e *checkEnv, r cdc.Report)
	}{
		{
			name:     "primary key and default identity",
			setup:    []string{ordersDDL, ordersPubDDL},
			warnings: []string{"table public.orders has replica identity DEFAULT: deletes and key-changing updates carry only the key columns"},
			report: func(t *testing.T, _ *checkEnv, r cdc.Report) {
				if !r.PublicationExists {
					t.Error("PublicationExists false; the publication exists")
				}
				if r.Slot != (cdc.SlotState{}) {
					t.Errorf("Slot %+v; want the zero SlotState for a missing slot", r.Slot)
				}
				if r.SystemID == "" || strings.Trim(r.SystemID, "0123456789") != "" {
					t.Errorf("SystemID %q; want a decimal number", r.SystemID)
				}
			},
		},
		{
			name:  "replica identity full",
			setup: []string{ordersDDL, ordersPubDDL, `ALTER TABLE public.orders REPLICA IDENTITY FULL`},
		},
		{
			name: "replica identity using index",
			setup: []string{ordersDDL, ordersPubDDL,
				`CREATE UNIQUE INDEX orders_code ON public.orders (code)`,
				`ALTER TABLE public.orders REPLICA IDENTITY USING INDEX orders_code`},
			warnings: []string{"table public.orders has replica identity USING INDEX: deletes and key-changing updates carry only the key columns"},
		},
		{
			name: "one-part table name is in schema public",
			setup: []string{ordersDDL, ordersPubDDL,
				`ALTER TABLE public.orders REPLICA IDENTITY FULL`},
			spec: func(s *cdc.CheckSpec) { s.Tables = []pgx.Identifier{{"orders"}} },
		},
		{
			name:  "missing publication is reported, not a problem",
			setup: []string{ordersDDL, `ALTER TABLE public.orders REPLICA IDENTITY FULL`},
			report: func(t *testing.T, _ *checkEnv, r cdc.Report) {
				if r.PublicationExists {
					t.Error("PublicationExists true; there is no publication")
				}
			},
		},
		{
			name: "publication lacks a table",
			setup: []string{ordersDDL, ordersPubDDL,
				`CREATE TABLE sales.items (id int PRIMARY KEY)`},
			spec: func(s *cdc.CheckSpec) {
				s.Tables = append(s.Tables, pgx.Identifier{"sales", "items"})
			},
			warnings: []string{"public.orders", "sales.items",
				`publication tidemark_shop does not publish sales.items: the reader adds them (ALTER PUBLICATION "tidemark_shop" ADD TABLE "sales"."items")`},
			report: func(t *testing.T, _ *checkEnv, r cdc.Report) {
				if !r.PublicationExists {
					t.Error("PublicationExists false; the publication exists")
				}
				if len(r.Unpublished) != 1 || r.Unpublished[0].Sanitize() != `"sales"."items"` || !r.MayPublish {
					t.Errorf("Unpublished %v (may publish %v), want sales.items that the role may add", r.Unpublished, r.MayPublish)
				}
			},
		},
		{
			name: "publication lacks a table the role may not add",
			setup: []string{ordersDDL, ordersPubDDL, `CREATE TABLE sales.items (id int PRIMARY KEY)`,
				`CREATE ROLE {role} LOGIN REPLICATION`, `GRANT USAGE ON SCHEMA sales TO {role}`,
				`GRANT SELECT ON public.orders, sales.items TO {role}`},
			as: "{role}",
			spec: func(s *cdc.CheckSpec) {
				s.Tables = append(s.Tables, pgx.Identifier{"sales", "items"})
			},
			wantErr:  []string{"sources.shop.cdc.publication", "sales.items", `ALTER PUBLICATION "tidemark_shop" ADD TABLE "sales"."items"`},
			warnings: []string{"public.orders", "sales.items"},
			report: func(t *testing.T, _ *checkEnv, r cdc.Report) {
				if len(r.Unpublished) != 1 || r.MayPublish {
					t.Errorf("Unpublished %v (may publish %v), want sales.items that the role may not add", r.Unpublished, r.MayPublish)
				}
			},
		},
		{
			name: "publication holds a table no longer configured",
			setup: []string{ordersDDL, `CREATE TABLE sales.items (id int PRIMARY KEY)`,
				`CREATE PUBLICATION tidemark_shop FOR TABLE public.orders, sales.items`},
			warnings: []string{"replica identity DEFAULT",
				`publication tidemark_shop also publishes "sales"."items", which sources.shop.cdc.tables does not name: their changes are sent and ignored, their mirrors and raw rows are kept; tidemark unpublish shop (ALTER PUBLICATION "tidemark_shop" DROP TABLE "sales"."items") stops sending them`},
		},
		{
			name: "publication for all tables",
			setup: []string{ordersDDL, `CREATE PUBLICATION tidemark_shop FOR ALL TABLES`,
				`CREATE TABLE sales.items (id int PRIMARY KEY)`,
				`ALTER TABLE public.orders REPLICA IDENTITY FULL`, `ALTER TABLE sales.items REPLICA IDENTITY FULL`},
			spec: func(s *cdc.CheckSpec) {
				s.Tables = append(s.Tables, pgx.Identifier{"sales", "items"})
			},
		},
		{
			name: "publication for all tables without the partition root",
			setup: []string{`CREATE TABLE public.orders (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)`,
				`CREATE TABLE public.orders_2026 PARTITION OF public.orders FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
				`CREATE PUBLICATION tidemark_shop FOR ALL TABLES`},
			wantErr: []string{"sources.shop.cdc.publication", "FOR ALL TABLES", "public.orders",
				`ALTER PUBLICATION "tidemark_shop" SET (publish_via_partition_root = true)`},
			warnings: []string{"public.orders"},
		},
		{
			name: "publication for all tables via the partition root",
			setup: []string{`CREATE TABLE public.orders (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)`,
				`CREATE TABLE public.orders_2026 PARTITION OF public.orders FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
				`ALTER TABLE public.orders REPLICA IDENTITY FULL`,
				`CREATE PUBLICATION tidemark_shop FOR ALL TABLES WITH (publish_via_partition_root = true)`},
		},
		{
			name:     "table missing",
			setup:    []string{ordersDDL, ordersPubDDL},
			spec:     func(s *cdc.CheckSpec) { s.Tables = []pgx.Identifier{{"public", "nope"}} },
			wantErr:  []string{"sources.shop.cdc.tables", "public.nope", "does not exist"},
			warnings: []string{`also publishes "public"."orders"`},
		},
		{
			name:    "no primary key and default identity",
			setup:   []string{`CREATE TABLE public.orders (id int, note text)`, ordersPubDDL},
			wantErr: []string{"sources.shop.cdc.tables", "public.orders", "no primary key", "primary key", "REPLICA IDENTITY FULL", "USING INDEX"},
		},
		{
			name:    "replica identity nothing",
			setup:   []string{ordersDDL, ordersPubDDL, `ALTER TABLE public.orders REPLICA IDENTITY NOTHING`},
			wantErr: []string{"sources.shop.cdc.tables", "public.orders", "NOTHING"},
		},
		{
			name:    "a view is not a table",
			setup:   []string{ordersDDL, `CREATE VIEW public.orders_v AS SELECT * FROM public.orders`},
			spec:    func(s *cdc.CheckSpec) { s.Tables = []pgx.Identifier{{"public", "orders_v"}} },
			wantErr: []string{"sources.shop.cdc.tables", "public.orders_v", "not a table"},
		},
		{
			name: "every problem is reported",
			setup: []string{ordersDDL, ordersPubDDL, `ALTER TABLE public.orders REPLICA IDENTITY NOTHING`,
				`CREATE TABLE public.items (id int PRIMARY KEY)`},
			spec: func(s *cdc.CheckSpec) {
				s.Tables = append(s.Tables, pgx.Identifier{"public", "gone"}, pgx.Identifier{"public", "items"})
			},
			wantErr:  []string{"2 problems", "public.orders", "NOTHING", "public.gone", "does not exist"},
			warnings: []string{"public.items", "does not publish public.items: the reader adds them"},
		},
		{
			name:     "slot with another plugin",
			setup:    []string{ordersDDL, ordersPubDDL, `SELECT pg_create_logical_replication_slot('{slot}', 'test_decoding')`},
			wantErr:  []string{"sources.shop.cdc.slot", "test_decoding", "not pgoutput", "pg_drop_replication_slot"},
			warnings: []string{"DEFAULT"},
			report: func(t *testing.T, _ *checkEnv, r cdc.Report) {
				if !r.Slot.Exists || r.Slot.Plugin != "test_decoding" {
					t.Errorf("Slot %+v; want an existing test_decoding slot", r.Slot)
				}
			},
		},
		{
			name:     "physical slot",
			setup:    []string{ordersDDL, ordersPubDDL, `SELECT pg_create_physical_replication_slot('{slot}')`},
			wantErr:  []string{"sources.shop.cdc.slot", "physical slot"},
			warnings: []string{"DEFAULT"},
		},
		{
			name:  "slot of another database",
			setup: []string{ordersDDL, ordersPubDDL},
			prepare: func(t *testing.T, e *checkEnv) {
				other := checkConnect(t, pgtest.NewDatabase(t))
				if _, err := other.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.slot); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					_, _ = other.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, e.slot)
				})
			},
			wantErr:  []string{"sources.shop.cdc.slot", "belongs to database tidemark_test_"},
			warnings: []string{"DEFAULT"},
		},
		{
			name:     "pgoutput slot in place",
			setup:    []string{ordersDDL, ordersPubDDL, `SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')`},
			warnings: []string{"DEFAULT"},
			report: func(t *testing.T, e *checkEnv, r cdc.Report) {
				var db string
				if err := e.admin.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
					t.Fatal(err)
				}
				s := r.Slot
				if !s.Exists || s.Plugin != "pgoutput" || s.Database != db || s.WALStatus != "reserved" || s.Active ||
					s.ConfirmedFlush == 0 || s.RestartLSN == 0 {
					t.Errorf("Slot %+v; want an inactive pgoutput slot of %s with reserved WAL and both positions set", s, db)
				}
			},
		},
		{
			name:     "slot in place and position stored",
			setup:    []string{ordersDDL, ordersPubDDL, `SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')`},
			spec:     func(s *cdc.CheckSpec) { s.Position = storedPosition },
			warnings: []string{"DEFAULT"},
			report: func(t *testing.T, _ *checkEnv, r cdc.Report) {
				if !r.Slot.Exists || r.Slot.ConfirmedFlush == 0 {
					t.Errorf("Slot %+v; want the slot and its confirmed position", r.Slot)
				}
			},
		},
		{
			name:     "slot missing after tidemark read from it",
			setup:    []string{ordersDDL, ordersPubDDL},
			spec:     func(s *cdc.CheckSpec) { s.Position = storedPosition },
			wantErr:  []string{"sources.shop.cdc.slot", "does not exist", storedPosition.String(), "Run tidemark resync shop --new-slot"},
			warnings: []string{"DEFAULT"},
		},
		{
			name: "role without REPLICATION",
			setup: []string{ordersDDL, ordersPubDDL, `CREATE ROLE {role} LOGIN`,
				`GRANT SELECT ON public.orders TO {role}`},
			as:       "{role}",
			wantErr:  []string{"sources.shop.cdc.dsn", "may not replicate", "REPLICATION"},
			warnings: []string{"DEFAULT"},
		},
		{
			name:     "role without SELECT",
			setup:    []string{ordersDDL, ordersPubDDL, `CREATE ROLE {role} LOGIN REPLICATION`},
			as:       "{role}",
			wantErr:  []string{"sources.shop.cdc.tables", "may not read table public.orders", `GRANT SELECT ON "public"."orders" TO "check_role_`},
			warnings: []string{"DEFAULT"},
		},
		{
			name: "role with REPLICATION and SELECT",
			setup: []string{ordersDDL, ordersPubDDL, `CREATE ROLE {role} LOGIN REPLICATION`,
				`GRANT SELECT ON public.orders TO {role}`, `SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')`},
			as:       "{role}",
			warnings: []string{"DEFAULT"},
			report: func(t *testing.T, _ *checkEnv, r cdc.Report) {
				if r.SystemID == "" || !r.Slot.Exists || !r.PublicationExists {
					t.Errorf("report %+v; want the system id, the slot and the publication", r)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newCheckEnv(t)
			e.exec(`CREATE SCHEMA sales`)
			e.exec(tc.setup...)
			if tc.prepare != nil {
				tc.prepare(t, e)
			}
			spec := e.spec()
			if tc.spec != nil {
				tc.spec(&spec)
			}
			conn := e.connectAs(strings.ReplaceAll(tc.as, "{role}", e.role))
			report, err := runCheck(t, conn, spec)
			if tc.wantErr != nil {
				wantSetupError(t, err, tc.wantErr...)
			} else if err != nil {
				t.Fatalf("Check: %v", err)
			}
			wantWarnings(t, report.Warnings, tc.warnings...)
			if tc.report != nil {
				tc.report(t, e, report)
			}
		})
	}
}

func TestCheckWALLevelReplica(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t, pgserver.Options{Settings: map[string]string{"wal_level": "replica"}})
	e := newCheckEnvAt(t, pgtest.NewDatabaseOn(t, srv))
	e.exec(ordersDDL, ordersPubDDL, `ALTER TABLE public.orders REPLICA IDENTITY FULL`)
	report, err := runCheck(t, e.admin, e.spec())
	wantSetupError(t, err, "wal_level = replica", "set wal_level = logical in postgresql.conf and restart the source")
	if strings.Contains(err.Error(), "problems") {
		t.Errorf("Check error %q reports more than the wal_level problem", err)
	}
	if report.SystemID == "" || !report.PublicationExists {
		t.Errorf("report %+v; want the other findings despite the error", report)
	}
}

// TestCheckLostSlot makes the server invalidate a slot by writing past
// max_slot_wal_keep_size, then expects Check to refuse it.
func TestCheckLostSlot(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t, pgserver.Options{Settings: map[string]string{
		"max_slot_wal_keep_size": "1MB",
		"min_wal_size":           "32MB",
		"max_wal_size":           "32MB",
		"wal_keep_size":          "0",
	}})
	e := newCheckEnvAt(t, pgtest.NewDatabaseOn(t, srv))
	e.exec(ordersDDL, ordersPubDDL, `ALTER TABLE public.orders REPLICA IDENTITY FULL`,
		`SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')`)
	spec := e.spec()
	spec.Position = storedPosition

	ctx := context.Background()
	walStatus := func() string {
		t.Helper()
		var s *string
		if err := e.admin.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&s); err != nil {
			t.Fatal(err)
		}
		if s == nil {
			return ""
		}
		return *s
	}
	sawUnreserved := false
	checkUnreserved := func() {
		t.Helper()
		if sawUnreserved || walStatus() != "unreserved" {
			return
		}
		// Between the WAL switches and the checkpoint that removes the
		// slot's WAL, the slot is at risk: Check warns but accepts it.
		sawUnreserved = true
		report, err := runCheck(t, e.admin, spec)
		if err != nil {
			t.Fatalf("Check of an unreserved slot: %v", err)
		}
		wantWarnings(t, report.Warnings, "about to lose WAL")
	}
	deadline := time.Now().Add(waitfor.Timeout)
	for status := walStatus(); status != "lost"; status = walStatus() {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not invalidate the slot within %s (wal_status %q)", waitfor.Timeout, status)
		}
		e.exec(`INSERT INTO public.orders SELECT g, 'c' || g FROM generate_series(1, 1000) g ON CONFLICT (id) DO UPDATE SET note = 'x'`,
			`SELECT pg_switch_wal()`)
		checkUnreserved()
		e.exec(`CHECKPOINT`)
	}
	if !sawUnreserved {
		t.Log("the slot went from reserved to lost without a visible unreserved state; the warning went untested")
	}

	report, err := runCheck(t, e.admin, spec)
	wantSetupError(t, err, "sources.shop.cdc.slot", e.slot+" has lost WAL it needed", "the changes since "+report.Slot.ConfirmedFlush.String()+" are gone",
		"tidemark resync shop --new-slot", "max_slot_wal_keep_size")
	if report.Slot.WALStatus != "lost" || report.Slot.ConfirmedFlush == 0 {
		t.Errorf("Slot %+v; want a lost slot with its confirmed position", report.Slot)
	}
	// A slot tidemark replaces (tidemark resync --new-slot) is not held
	// to the WAL it lost.
	spec.Replace = true
	if _, err := runCheck(t, e.admin, spec); err != nil {
		t.Errorf("Check of a lost slot to replace: %v", err)
	}
}
