package grants_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/grants"
	"github.com/tidemark-dev/tidemark/internal/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/pgtest"
	"github.com/tidemark-dev/tidemark/internal/syncbuf"
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
