package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// privileges is a server whose tidemark roles log in with passwords over
// TCP, set up with the script of `tidemark grants`.
type privileges struct {
	srv *pgserver.Server
	// admin is the superuser on the warehouse and source databases,
	// through the unix socket.
	admin, adminSrc *pgxpool.Pool
	// runtime is the runtime role on the warehouse.
	runtime *pgxpool.Pool
	// migrateCfg connects as the migration role, runCfg as the runtime
	// and source roles.
	migrateCfg, runCfg string
	kafka              *kgo.Client
}

// rolePassword is the password of every tidemark role of the test.
const rolePassword = "s3cret-for-tests"

// newPrivileges starts the server, creates the warehouse and the source
// database with a poll table and a CDC table, writes the configurations
// and applies the grants script to it with psql.
func newPrivileges(t *testing.T) *privileges {
	t.Helper()
	srv := pgtest.NewServer(t, pgserver.Options{HBA: []string{
		"host all all 127.0.0.1/32 scram-sha-256",
		"host replication all 127.0.0.1/32 scram-sha-256",
	}})
	ctx := context.Background()
	boot, err := pgx.Connect(ctx, srv.SocketURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer boot.Close(ctx)
	for _, db := range []string{"warehouse", "shop"} {
		if _, err := boot.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
	}
	p := &privileges{srv: srv, admin: pgtest.Pool(t, srv.SocketURL("warehouse")), adminSrc: pgtest.Pool(t, srv.SocketURL("shop"))}
	if _, err := p.adminSrc.Exec(ctx, `
		CREATE TABLE src_customers (customer_id bigint PRIMARY KEY, email text NOT NULL, updated_at timestamptz NOT NULL);
		INSERT INTO src_customers SELECT i, 'c' || i || '@example.com', now() - interval '1 hour' + i * interval '1 second'
		FROM generate_series(1, 20) AS i;
		CREATE TABLE orders (order_id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL);
		INSERT INTO orders SELECT i, i FROM generate_series(1, 30) AS i`); err != nil {
		t.Fatal(err)
	}
	kc := kafkatest.NewCluster(t, 1, "events")
	p.kafka = kafkatest.Producer(t, kc)
	dsn := func(role, db string) string {
		return fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", role, rolePassword, srv.Host, srv.Port, db)
	}
	body := fmt.Sprintf(`http: {listen: "off"}
kafka: {brokers: [%q], group: privileges, session_timeout: 1s}
ingest: {batch_max_age: 10ms}
reconcile: {every: 1s}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
  customers:
    poll: {dsn: %q, table: src_customers, key: [customer_id], updated_at: updated_at, every: 1s}
    mirror: {table: dw_customers}
  shop:
    cdc: {dsn: %q, tables: [orders], status_every: 200ms, heartbeat_every: 1s}
    mirror: {schema: shop_mirror}
aggregates:
  daily_sales:
    source: app_events
    table: reports.daily_sales
    partition: {by: day, column: sale_date}
    sql: |
      SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*) AS event_count
      FROM {{events}} GROUP BY 1
`, kc.ListenAddrs()[0], dsn("tidemark_poll", "shop"), dsn("tidemark_cdc", "shop"))
	p.runCfg = writeFile(t, "run.yaml", fmt.Sprintf("warehouse: {dsn: %q, migrate: false}\n", dsn("tidemark_run", "warehouse"))+body)
	p.migrateCfg = writeFile(t, "migrate.yaml", fmt.Sprintf("warehouse: {dsn: %q}\n", dsn("tidemark_owner", "warehouse"))+body)

	p.applyGrants(t)
	for _, role := range []string{"tidemark_owner", "tidemark_run", "tidemark_poll", "tidemark_cdc"} {
		if _, err := boot.Exec(ctx, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, rolePassword)); err != nil {
			t.Fatal(err)
		}
	}
	p.runtime = pgtest.Pool(t, dsn("tidemark_run", "warehouse"))
	return p
}

// applyGrants prints the script with `tidemark grants` and runs it with
// psql as the superuser.
func (p *privileges) applyGrants(t *testing.T) {
	t.Helper()
	code, script, errOut := invoke(t, "grants", "-c", p.runCfg)
	if code != exitOK {
		t.Fatalf("grants: exit %d: %s", code, errOut)
	}
	psql(t, p.srv, script)
}

// psql runs script with psql, through the socket as the superuser.
func psql(t *testing.T, srv *pgserver.Server, script string) {
	t.Helper()
	bin, err := pgserver.FindPSQL()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", srv.SocketURL("postgres"), "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("psql: %v\n%s\nscript:\n%s", err, out.String(), script)
	}
}

// exec runs statements as the superuser on the warehouse (db "warehouse")
// or the source database ("shop").
func (p *privileges) exec(t *testing.T, db, sql string) {
	t.Helper()
	pool := p.admin
	if db == "shop" {
		pool = p.adminSrc
	}
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (p *privileges) count(t *testing.T, sql string) int64 {
	t.Helper()
	var n int64
	if err := p.admin.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		return -1
	}
	return n
}

// TestPrivilegeLeastRoles runs every component and command under the
// roles that `tidemark grants` sets up, and nothing more: migrate as the
// migration role; run with a Kafka, a poll and a CDC source and an
// aggregate, reconcile, backfill, verify, poll, keys, prune and status as
// the runtime role with the sources' roles. It then checks that the
// runtime role cannot change what it does not own, and that a statement
// refused at run time points at `tidemark grants`.
func TestPrivilegeLeastRoles(t *testing.T) {
	p := newPrivileges(t)
	ctx := context.Background()
	var attrs string
	if err := p.admin.QueryRow(ctx, `SELECT string_agg(rolname || ':' || rolsuper || rolcreaterole || rolcreatedb || rolreplication, ' ' ORDER BY rolname)
		FROM pg_roles WHERE rolname LIKE 'tidemark_%'`).Scan(&attrs); err != nil {
		t.Fatal(err)
	}
	if want := "tidemark_cdc:falsefalsefalsetrue tidemark_owner:falsefalsefalsefalse tidemark_poll:falsefalsefalsefalse tidemark_run:falsefalsefalsefalse"; attrs != want {
		t.Errorf("role attributes (super, createrole, createdb, replication):\n got %s\nwant %s", attrs, want)
	}

	// The runtime role cannot migrate; the migration role can.
	if code, _, errOut := invoke(t, "migrate", "-c", p.runCfg); code != exitFailure || !strings.Contains(errOut, "tidemark grants") {
		t.Errorf("migrate as the runtime role: exit %d, want %d with a pointer to tidemark grants:\n%s", code, exitFailure, errOut)
	}
	if code, out, errOut := invoke(t, "migrate", "-c", p.migrateCfg); code != exitOK {
		t.Fatalf("migrate as the migration role: exit %d\n%s%s", code, out, errOut)
	}
	p.applyGrants(t) // again after migrating, as documented

	now := time.Now().UTC()
	day := func(d time.Time) string { return d.Format("2006-01-02") }
	e1, e2 := now.Add(-30*time.Hour), now.Add(-time.Hour)
	kafkatest.Produce(t, p.kafka,
		&kgo.Record{Topic: "events", Value: fmt.Appendf(nil, `{"event_id":"e1","event_time":%q,"amount":10}`, e1.Format(time.RFC3339))},
		&kgo.Record{Topic: "events", Value: fmt.Appendf(nil, `{"event_id":"e2","event_time":%q,"amount":20}`, e2.Format(time.RFC3339))},
		&kgo.Record{Topic: "events", Value: fmt.Appendf(nil, `{"event_id":"e3","event_time":%q,"amount":5}`, e2.Format(time.RFC3339))})

	// Every component of `tidemark run`.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	var runErr syncbuf.Buffer // read while run writes it
	go func() { done <- run(runCtx, []string{"run", "-c", p.runCfg}, &bytes.Buffer{}, &runErr) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("run exited %d:\n%s", code, runErr.String())
		}
	}
	defer stop()
	wait := func(what, sql string, want int64) {
		t.Helper()
		var got int64
		if waitfor.Poll(90*time.Second, func() bool { got = p.count(t, sql); return got == want }) != nil {
			t.Fatalf("timed out waiting for %s (%s = %d, want %d):\n%s", what, sql, got, want, runErr.String())
		}
	}
	wait("the Kafka events", "SELECT count(*) FROM raw.app_events", 3)
	wait("the poll source's rows", "SELECT count(*) FROM dw_customers", 20)
	wait("the CDC snapshot", "SELECT count(*) FROM shop_mirror.orders", 30)
	p.exec(t, "shop", "UPDATE orders SET amount = 0 WHERE order_id <= 5; DELETE FROM orders WHERE order_id = 30")
	wait("the streamed changes", "SELECT count(*) FROM shop_mirror.orders WHERE amount = 0 OR deleted_at IS NOT NULL", 6)
	wait("the aggregate", "SELECT count(*) FROM reports.daily_sales", int64(len(map[string]bool{day(e1): true, day(e2): true})))
	stop()
	if strings.Contains(runErr.String(), "permission denied") || strings.Contains(runErr.String(), "tidemark grants") {
		t.Errorf("run logged a refused statement:\n%s", runErr.String())
	}
	want := map[string]string{day(e1): "10.00 1", day(e2): "25.00 2"}
	if day(e1) == day(e2) {
		want = map[string]string{day(e1): "35.00 3"}
	}
	for d, w := range want {
		var got string
		if err := p.admin.QueryRow(ctx, "SELECT total || ' ' || event_count FROM reports.daily_sales WHERE sale_date = $1", d).Scan(&got); err != nil || got != w {
			t.Errorf("daily_sales %s: %q (%v), want %q", d, got, err, w)
		}
	}

	// The commands, as the runtime role. A dead letter that decodes now
	// (the warehouse once refused it) is there for replay to load.
	if _, err := p.admin.Exec(ctx, `INSERT INTO tidemark.dead_letters (source, reason, detail, topic, partition, "offset", record_value, ingested_at)
		VALUES ('app_events', 'rejected', 'refused once', 'events', 0, 99, convert_to($1, 'UTF8'), now())`,
		fmt.Sprintf(`{"event_id":"e4","event_time":%q,"amount":1}`, e2.Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
	from, to := day(e1), day(e2)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"reconcile", "--once"}, exitOK, "daily_sales: read"},
		{[]string{"verify", "--aggregate", "daily_sales"}, exitOK, "0 differ"},
		{[]string{"backfill", "--aggregate", "daily_sales", "--from", from, "--to", to, "--reprocess", "completed"}, exitOK, "0 failed"},
		{[]string{"backfill", "--aggregate", "daily_sales", "--from", from, "--to", to, "--shadow"}, exitOK, "daily_sales__shadow"},
		{[]string{"backfill", "--aggregate", "daily_sales", "--from", from, "--to", to, "--publish"}, exitOK, "published"},
		{[]string{"refresh", "--aggregate", "daily_sales", "--full"}, exitOK, "0 failed"},
		{[]string{"poll", "--once", "--source", "customers"}, exitOK, "customers: window"},
		{[]string{"keys", "--source", "customers"}, exitOK, "0 missing at the source"},
		{[]string{"keys", "--source", "shop", "--dry-run"}, exitOK, "0 missing at the source"},
		{[]string{"prune"}, exitOK, ""},
		{[]string{"status"}, exitOK, "source shop"},
		{[]string{"lateness", "--source", "app_events"}, exitOK, "lateness of source app_events"},
		{[]string{"lateness", "--source", "shop"}, exitOK, "lateness of source shop"},
		{[]string{"dead-letters", "list"}, exitOK, "app_events"},
		{[]string{"dead-letters", "replay", "--source", "app_events"}, exitOK, "loaded          1"},
	} {
		code, out, errOut := invoke(t, append(c.args, "-c", p.runCfg)...)
		if code != c.code || !strings.Contains(out+errOut, c.want) {
			t.Errorf("%v: exit %d (want %d), output lacks %q?\n%s%s", c.args, code, c.code, c.want, out, errOut)
		}
	}

	// What the runtime role must not do.
	for _, sql := range []string{
		"DROP TABLE tidemark.kafka_offsets",
		"ALTER TABLE tidemark.ingest_ledger ADD COLUMN x int",
		"TRUNCATE tidemark.partitions",
		"ALTER SCHEMA tidemark RENAME TO elsewhere",
		"DROP SCHEMA raw CASCADE",
		"CREATE TABLE tidemark.intruder (x int)",
		"INSERT INTO tidemark.schema_migrations (version, name, checksum) VALUES (9999, 'x', 'x')",
		"DELETE FROM tidemark.schema_migrations",
		"CREATE SCHEMA intruder",
		"CREATE ROLE intruder",
		"CREATE DATABASE intruder",
	} {
		_, err := p.runtime.Exec(ctx, sql)
		if err == nil || !strings.Contains(err.Error(), "42501") {
			t.Errorf("the runtime role ran %q: %v; want SQLSTATE 42501", sql, err)
		}
	}
	// Key checks of a CDC source are not checked beforehand: the refused
	// statement carries the hint.
	p.exec(t, "shop", "REVOKE SELECT ON orders FROM tidemark_cdc")
	code, out, errOut := invoke(t, "keys", "--source", "shop", "--dry-run", "-c", p.runCfg)
	for _, w := range []string{"permission denied for table orders", "SQLSTATE 42501", "`tidemark grants` prints what each role needs"} {
		if code != exitFailure || !strings.Contains(errOut, w) {
			t.Errorf("keys with SELECT on orders revoked: exit %d, want %d with %q:\n%s%s", code, exitFailure, w, out, errOut)
		}
	}
	p.exec(t, "shop", "GRANT SELECT ON orders TO tidemark_cdc")

	// Passwords are checked over TCP: one role's password is not another's.
	bad := fmt.Sprintf("postgres://tidemark_owner:wrong@%s:%d/warehouse?sslmode=disable", p.srv.Host, p.srv.Port)
	if c, err := pgx.Connect(ctx, bad); err == nil {
		c.Close(ctx)
		t.Error("the migration role logged in with a wrong password")
	}
}

// TestPrivilegeRefused revokes one grant at a time and checks that the
// command refuses to start with a message naming the grant.
func TestPrivilegeRefused(t *testing.T) {
	p := newPrivileges(t)
	if code, out, errOut := invoke(t, "migrate", "-c", p.migrateCfg); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	p.applyGrants(t)
	// Tables created by a first run: the raw tables and mirrors.
	if code, out, errOut := invoke(t, "poll", "--once", "--source", "customers", "-c", p.runCfg); code != exitOK {
		t.Fatalf("poll: exit %d\n%s%s", code, out, errOut)
	}
	for _, c := range []struct {
		name          string
		db            string // where revoke and grant run
		revoke, grant string
		args          []string
		wants         []string
	}{
		{
			name: "insert on a state table", db: "warehouse",
			revoke: "REVOKE INSERT ON tidemark.ingest_ledger FROM tidemark_run", grant: "GRANT INSERT ON tidemark.ingest_ledger TO tidemark_run",
			args: []string{"reconcile", "--once"},
			wants: []string{`warehouse.dsn: the warehouse role "tidemark_run" lacks INSERT on tidemark.ingest_ledger: ` +
				"GRANT INSERT ON tidemark.ingest_ledger TO tidemark_run (see tidemark grants)"},
		},
		{
			name: "two at once", db: "warehouse",
			revoke: "REVOKE UPDATE ON tidemark.kafka_offsets FROM tidemark_run; REVOKE CREATE ON SCHEMA raw FROM tidemark_run",
			grant:  "GRANT UPDATE ON tidemark.kafka_offsets TO tidemark_run; GRANT CREATE ON SCHEMA raw TO tidemark_run",
			args:   []string{"run", "--only", "ingest"},
			wants: []string{"2 missing privilege(s)",
				`the warehouse role "tidemark_run" lacks UPDATE on tidemark.kafka_offsets: GRANT UPDATE ON tidemark.kafka_offsets TO tidemark_run`,
				`the warehouse role "tidemark_run" lacks CREATE on schema raw: GRANT CREATE ON SCHEMA raw TO tidemark_run`},
		},
		{
			name: "ownership of a raw table", db: "warehouse",
			revoke: "ALTER TABLE raw.customers OWNER TO tidemark_owner", grant: "ALTER TABLE raw.customers OWNER TO tidemark_run",
			args: []string{"prune", "--dry-run"},
			wants: []string{`the warehouse role "tidemark_run" does not own raw.customers, which it must to create and drop its partitions: ` +
				"ALTER TABLE raw.customers OWNER TO tidemark_run"},
		},
		{
			name: "select on the poll source table", db: "shop",
			revoke: "REVOKE SELECT ON src_customers FROM tidemark_poll", grant: "GRANT SELECT ON src_customers TO tidemark_poll",
			args: []string{"poll", "--once", "--source", "customers"},
			wants: []string{`sources.customers.poll.dsn: the poll source role "tidemark_poll" lacks SELECT on public.src_customers: ` +
				"GRANT SELECT ON public.src_customers TO tidemark_poll (see tidemark grants)"},
		},
		{
			name: "replication of the CDC role", db: "shop",
			revoke: "ALTER ROLE tidemark_cdc NOREPLICATION", grant: "ALTER ROLE tidemark_cdc REPLICATION",
			args:  []string{"run", "--only", "cdc"},
			wants: []string{`sources.shop.cdc.dsn: the CDC source role "tidemark_cdc" lacks REPLICATION: ALTER ROLE tidemark_cdc REPLICATION (see tidemark grants)`},
		},
		{
			name: "the CDC publication", db: "shop",
			revoke: "DROP PUBLICATION tidemark_shop", grant: "CREATE PUBLICATION tidemark_shop FOR TABLE orders WITH (publish_via_partition_root = true)",
			args: []string{"run", "--only", "cdc"},
			wants: []string{`sources.shop.cdc.publication: publication tidemark_shop does not exist, and the CDC source role "tidemark_cdc" cannot create it`,
				"CREATE PUBLICATION tidemark_shop FOR TABLE public.orders WITH (publish_via_partition_root = true)"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			p.exec(t, c.db, c.revoke)
			defer p.exec(t, c.db, c.grant)
			// A check that lets the command start would leave `run`
			// running: the timeout ends it.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var outb, errb bytes.Buffer
			code := run(ctx, append(c.args, "-c", p.runCfg), &outb, &errb)
			out, errOut := outb.String(), errb.String()
			if code != exitFailure {
				t.Errorf("%v: exit %d, want %d\n%s%s", c.args, code, exitFailure, out, errOut)
			}
			for _, w := range c.wants {
				if !strings.Contains(errOut, w) {
					t.Errorf("%v: stderr lacks %q:\n%s", c.args, w, errOut)
				}
			}
		})
	}
}
