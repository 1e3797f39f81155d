package grants_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// rolesFile is the generic script, committed for operators without a
// configuration at hand.
const rolesFile = "../deploy/postgres/roles.sql"

// TestRolesFileIsGeneric: deploy/postgres/roles.sql is the script of the
// generic plan. Regenerate it with TIDEMARK_UPDATE_ROLES=1.
func TestRolesFileIsGeneric(t *testing.T) {
	want := grants.Script(grants.Generic())
	if os.Getenv("TIDEMARK_UPDATE_ROLES") == "1" {
		if err := os.WriteFile(rolesFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(rolesFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from grants.Script(grants.Generic()); regenerate it with TIDEMARK_UPDATE_ROLES=1 go test ./grants -run TestRolesFileIsGeneric", rolesFile)
	}
}

// TestStateTables: StateTables lists every table the migrations create in
// schema tidemark, besides schema_migrations.
func TestStateTables(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT tablename::text FROM pg_tables WHERE schemaname = 'tidemark' AND tablename <> 'schema_migrations' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(grants.StateTables)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("tables in schema tidemark: %v\ngrants.StateTables: %v", got, want)
	}
}

// TestGenericScriptRuns runs roles.sql with psql, twice (it is
// idempotent), with its variables set, and checks the roles it made.
func TestGenericScriptRuns(t *testing.T) {
	bin, err := pgserver.FindPSQL()
	if err != nil {
		t.Fatal(err)
	}
	srv := pgtest.NewServer(t, pgserver.Options{})
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.SocketURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, sql := range []string{"CREATE DATABASE wh", "CREATE DATABASE app",
		"CREATE TABLE accounts (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)",
		"CREATE TABLE orders (id bigint PRIMARY KEY)"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	vars := []string{"migration_role=tm_owner", "runtime_role=tm_run", "poll_role=tm_poll", "cdc_role=tm_cdc",
		"warehouse_db=wh", "data_schema=reports", "poll_db=postgres", "poll_schema=public", "poll_table=accounts",
		"cdc_db=postgres", "cdc_schema=public", "cdc_table=orders", "publication=tm_pub"}
	for range 2 {
		args := []string{"-X", "-q", "-d", srv.SocketURL("postgres"), "-f", rolesFile}
		for _, v := range vars {
			args = append(args, "-v", v)
		}
		var out bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("psql -f %s: %v\n%s", rolesFile, err, out.String())
		}
	}
	var got string
	err = admin.QueryRow(ctx, `SELECT string_agg(rolname || ' ' || rolreplication, ', ' ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'tm_%'`).Scan(&got)
	if want := "tm_cdc true, tm_owner false, tm_poll false, tm_run false"; err != nil || got != want {
		t.Errorf("roles: %q (%v), want %q", got, err, want)
	}
	var checks string
	err = admin.QueryRow(ctx, `SELECT concat_ws(' ',
		has_table_privilege('tm_poll', 'public.accounts', 'SELECT'), has_table_privilege('tm_cdc', 'public.orders', 'SELECT'),
		has_table_privilege('tm_poll', 'public.orders', 'SELECT'),
		(SELECT count(*) FROM pg_publication_tables WHERE pubname = 'tm_pub' AND tablename = 'orders'))`).Scan(&checks)
	if want := "t t f 1"; err != nil || checks != want {
		t.Errorf("source grants and publication: %q (%v), want %q", checks, err, want)
	}
	wh, err := pgx.Connect(ctx, srv.SocketURL("wh"))
	if err != nil {
		t.Fatal(err)
	}
	defer wh.Close(ctx)
	err = wh.QueryRow(ctx, `SELECT concat_ws(' ',
		(SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'tidemark'),
		(SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'reports'),
		has_schema_privilege('tm_run', 'raw', 'CREATE'), has_schema_privilege('tm_run', 'tidemark', 'CREATE'),
		has_database_privilege('tm_run', 'wh', 'CREATE'))`).Scan(&checks)
	if want := "tm_owner tm_owner t f f"; err != nil || checks != want {
		t.Errorf("warehouse: %q (%v), want %q", checks, err, want)
	}
	if !strings.Contains(grants.Script(grants.Generic()), `:"runtime_role"`) {
		t.Error("the generic script does not use psql variables")
	}
}

// TestCheckSourcesBounded: a source whose network path swallows
// everything (connections accepted, nothing answered) costs the
// privilege check at most its bound, and is reported as out of reach; the
// check does not hold `tidemark run` before it starts.
func TestCheckSourcesBounded(t *testing.T) {
	cc, err := pgx.ParseConfig(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(fmt.Sprintf("%s:%d", cc.Host, cc.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	proxy.Stall()
	grants.SetSourceCheckTimeout(t, time.Second)
	cfg := &config.Config{Sources: map[string]*config.Source{"customers": {Poll: &config.PollSource{
		DSN: fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", cc.User, proxy.Port(), cc.Database)}}}}
	var log syncbuf.Buffer
	done := make(chan error, 1)
	started := time.Now()
	go func() {
		done <- grants.CheckSources(context.Background(), cfg, []string{"customers"}, slog.New(slog.NewTextHandler(&log, nil)))
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("CheckSources = %v, want nil (an unreachable source is left to its component)", err)
		}
		if took := time.Since(started); took > 5*time.Second {
			t.Errorf("CheckSources took %v, want about the 1s bound", took)
		}
		if !strings.Contains(log.String(), "cannot check the privileges of the source's role now") {
			t.Errorf("log does not report the unreachable source:\n%s", log.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("CheckSources still waits on a stalled source after 20s")
	}
}

// TestScriptNames runs the script of a configuration whose every name is
// hostile but legal (a \! shell command, a backquoted command, psql
// variables, quotes, backslashes, a connection string) with psql, in
// three settings: as is; with a client encoding, SJIS, in which the last
// byte of a UTF-8 letter swallows the quote after it; and with
// standard_conforming_strings off, with which a backslash escapes the
// quote after it. Each time the script must run no shell command and
// grant what it grants to exactly the names given.
func TestScriptNames(t *testing.T) {
	bin, err := pgserver.FindPSQL()
	if err != nil {
		t.Fatal(err)
	}
	// Short paths: a name holds at most 63 bytes.
	dir, err := os.MkdirTemp("", "tm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	pwned := filepath.Join(dir, "p")
	shell := `\! touch ` + pwned
	roles := grants.Roles{
		Migration: shell + " #Á",
		Runtime:   shell + ` #\`,
		Poll:      "`touch " + pwned + "`",
		CDC:       `:DBNAME :'x' :"x" ` + shell,
	}
	wh, pollDB, cdcDB := `wh "q" 'q' `+shell+" #Á", shell+` #\`, "postgresql://x/ host=/x"
	dataSchema, pollSchema, pollTable := `:"x" `+shell+" #Á", shell+` #\`, `t'`+shell+` #\`
	cdcSchema, cdcTable, publication := "public", "`touch "+pwned+"` #Á", `p" `+shell+` #\`
	dsn := func(db string) string { return "postgres://x@127.0.0.1:1/" + url.PathEscape(db) }
	cfg := &config.Config{
		Warehouse: config.Warehouse{DSN: dsn(wh)},
		Sources: map[string]*config.Source{
			"poll\n" + shell: {Poll: &config.PollSource{DSN: dsn(pollDB), Table: pollSchema + "." + pollTable},
				Mirror: &config.Mirror{Table: dataSchema + ".m"}},
			"cdc\r" + shell: {CDC: &config.CDCSource{DSN: dsn(cdcDB), Tables: []string{cdcSchema + "." + cdcTable},
				Publication: publication}},
		},
	}
	plan, err := grants.FromConfig(cfg, roles)
	if err != nil {
		t.Fatal(err)
	}
	script := grants.Script(plan)

	srv := pgtest.NewServer(t, pgserver.Options{})
	ctx := context.Background()
	connect := func(db string) *pgx.Conn {
		t.Helper()
		cc, err := pgx.ParseConfig(srv.SocketURL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		cc.Database = db
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(ctx) })
		return conn
	}
	run := func(conn *pgx.Conn, sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	admin := connect("postgres")
	for _, db := range []string{wh, pollDB, cdcDB} {
		run(admin, "CREATE DATABASE "+grants.Ident(db))
	}
	poll, cdc := connect(pollDB), connect(cdcDB)
	run(poll, "CREATE SCHEMA "+grants.Ident(pollSchema))
	run(poll, "CREATE TABLE "+grants.Ident(pollSchema)+"."+grants.Ident(pollTable)+" (id bigint PRIMARY KEY)")
	run(cdc, "CREATE TABLE "+grants.Ident(cdcSchema)+"."+grants.Ident(cdcTable)+" (id bigint PRIMARY KEY)")
	file := filepath.Join(dir, "grants.sql")
	if err := os.WriteFile(file, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, env := range []string{"", "PGCLIENTENCODING=SJIS", "PGOPTIONS=-c standard_conforming_strings=off"} {
		t.Run(env, func(t *testing.T) {
			cmd := exec.Command(bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", srv.SocketURL("postgres"), "-f", file)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), env)
			out, err := cmd.CombinedOutput()
			if _, statErr := os.Stat(pwned); statErr == nil {
				t.Errorf("the script ran a shell command: %s exists", pwned)
				_ = os.Remove(pwned)
			}
			if err != nil {
				t.Fatalf("psql: %v\n%s", err, out)
			}
			checks := []struct {
				conn *pgx.Conn
				what string
				sql  string
				args []any
			}{
				{admin, "the roles", `SELECT count(*) = 4 FROM pg_roles WHERE rolname = ANY($1)`,
					[]any{[]string{roles.Migration, roles.Runtime, roles.Poll, roles.CDC}}},
				{connect(wh), "schema tidemark owned by the migration role",
					`SELECT nspowner = (SELECT oid FROM pg_roles WHERE rolname = $1) FROM pg_namespace WHERE nspname = 'tidemark'`,
					[]any{roles.Migration}},
				{connect(wh), "CREATE on the data schema for the runtime role", `SELECT has_schema_privilege($1, $2, 'CREATE')`,
					[]any{roles.Runtime, dataSchema}},
				{poll, "SELECT on the polled table for the poll role", `SELECT has_table_privilege($1, format('%I.%I', $2::text, $3::text), 'SELECT')`,
					[]any{roles.Poll, pollSchema, pollTable}},
				{cdc, "REPLICATION for the CDC role", `SELECT rolreplication FROM pg_roles WHERE rolname = $1`, []any{roles.CDC}},
				{cdc, "the publication of the CDC table", `SELECT count(*) = 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`,
					[]any{publication, cdcSchema, cdcTable}},
			}
			for _, c := range checks {
				var ok bool
				if err := c.conn.QueryRow(ctx, c.sql, c.args...).Scan(&ok); err != nil || !ok {
					t.Errorf("%s: %v (%v)", c.what, ok, err)
				}
			}
		})
	}
}
