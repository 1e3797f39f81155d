package pgtest_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// on returns dsn, a URL for a database of one server, pointed at srv.
func on(t *testing.T, dsn string, srv *pgserver.Server) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = srv.Host + ":" + strconv.Itoa(srv.Port)
	return u.String()
}

func count(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insert(t *testing.T, conn *pgx.Conn, from, to int) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), "INSERT INTO t SELECT generate_series($1::int, $2::int)", from, to); err != nil {
		t.Fatal(err)
	}
}

func setting(t *testing.T, conn *pgx.Conn, name string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestStandby makes a standby of a running server, asynchronous and
// synchronous: it streams and replays what the primary commits, refuses
// writes, is skipped by a multi-host connection string while it is a
// standby and chosen once the primary crashed and it was promoted, and
// then holds every commit the primary acknowledged.
func TestStandby(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("synchronous=%v", sync), func(t *testing.T) {
			ctx := context.Background()
			primary := pgtest.NewServer(t, pgserver.Options{})
			dsn := pgtest.NewDatabaseOn(t, primary)
			pc := pgtest.Conn(t, dsn)
			if _, err := pc.Exec(ctx, "CREATE TABLE t (i int PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			insert(t, pc, 1, 10)

			sb := pgtest.NewStandby(t, primary, pgserver.StandbyOptions{Name: "replica_a", Synchronous: sync,
				Settings: map[string]string{"max_standby_streaming_delay": "5s"}})
			insert(t, pc, 11, 20)
			pgtest.WaitReplayed(t, primary, sb)
			sc := pgtest.Conn(t, on(t, dsn, sb))
			if n := count(t, sc); n != 20 {
				t.Errorf("the standby has %d rows, want 20", n)
			}
			_, err := sc.Exec(ctx, "INSERT INTO t VALUES (100)")
			if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.ReadOnlySQLTransaction {
				t.Errorf("a write on the standby: %v, want SQLSTATE %s", err, pgerrcode.ReadOnlySQLTransaction)
			}
			for name, want := range map[string]string{"hot_standby_feedback": "on", "synchronous_standby_names": "",
				"max_standby_streaming_delay": "5s", "primary_slot_name": "replica_a"} {
				if got := setting(t, sc, name); got != want {
					t.Errorf("standby: %s = %q, want %q", name, got, want)
				}
			}
			wantSync := "async"
			if sync {
				wantSync = "sync"
			}
			var state string
			if err := pc.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'replica_a'").Scan(&state); err != nil {
				t.Fatal(err)
			}
			if state != wantSync {
				t.Errorf("primary: the standby's sync_state is %s, want %s", state, wantSync)
			}

			// The standby first: a client that asks for read-write
			// skips it.
			multi := pgtest.MultiHostDSN(t, dsn, sb, primary)
			mc := pgtest.Conn(t, multi)
			if setting(t, mc, "transaction_read_only") != "off" || mc.PgConn().Conn().RemoteAddr().String() != fmt.Sprintf("%s:%d", primary.Host, primary.Port) {
				t.Errorf("the multi-host connection is not on the primary: %s", mc.PgConn().Conn().RemoteAddr())
			}
			_ = mc.Close(ctx)

			insert(t, pc, 21, 30)
			if !sync {
				// Asynchronous: only what the standby received survives.
				pgtest.WaitReplayed(t, primary, sb)
			}
			pgtest.Failover(t, primary, sb)
			after := pgtest.Conn(t, multi)
			if n := count(t, after); n != 30 {
				t.Errorf("after the failover, %d rows, want 30", n)
			}
			insert(t, after, 31, 31)
			if n := count(t, after); n != 31 {
				t.Errorf("the promoted standby does not take writes: %d rows, want 31", n)
			}
		})
	}
}

// TestStandbyCutOff shows what synchronous replication is for: with the
// replication connection stalled, an asynchronous primary acknowledges a
// commit that its promoted standby then lacks; a synchronous one does not
// acknowledge it at all.
func TestStandbyCutOff(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("synchronous=%v", sync), func(t *testing.T) {
			ctx := context.Background()
			primary := pgtest.NewServer(t, pgserver.Options{})
			proxy, err := faultproxy.New(fmt.Sprintf("%s:%d", primary.Host, primary.Port))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			dsn := pgtest.NewDatabaseOn(t, primary)
			pc := pgtest.Conn(t, dsn)
			if _, err := pc.Exec(ctx, "CREATE TABLE t (i int PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			sb := pgtest.NewStandby(t, primary, pgserver.StandbyOptions{Synchronous: sync, PrimaryAddr: proxy.Addr()})
			insert(t, pc, 1, 10)
			pgtest.WaitReplayed(t, primary, sb)

			proxy.Stall()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = pc.Exec(cctx, "INSERT INTO t VALUES (11)")
			cancel()
			acknowledged := err == nil
			if acknowledged == sync {
				t.Fatalf("the commit with replication stalled: err %v, want it acknowledged only without synchronous replication", err)
			}
			pgtest.Failover(t, primary, sb)
			n := count(t, pgtest.Conn(t, on(t, dsn, sb)))
			if n != 10 {
				t.Errorf("the promoted standby has %d rows, want the 10 replicated before the stall", n)
			}
		})
	}
}
