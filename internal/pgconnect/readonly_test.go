package pgconnect_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/pgserver"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestReadOnlySessionsEvicted: a warehouse.dsn names two servers, a and
// b, with target_session_attrs=read-write. The sessions open on a, which
// is then fenced (default_transaction_read_only, as a failover does to a
// primary it demotes): the sessions stay on it, healthy but read-only.
// The first write of each fails with read_only_sql_transaction, an
// unavailable server; the session is ended, and the next write, on a new
// session, lands on b. Without the eviction the pool hands the same
// read-only session out again and every write fails.
func TestReadOnlySessionsEvicted(t *testing.T) {
	ctx := context.Background()
	a := pgtest.NewServer(t, pgserver.Options{})
	b := pgtest.NewServer(t, pgserver.Options{})
	// The same database on both, as a promoted standby would have it.
	const db = "warehouse"
	for _, srv := range []*pgserver.Server{a, b} {
		if _, err := pgtest.Conn(t, srv.URL("postgres")).Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
		if _, err := pgtest.Conn(t, srv.URL(db)).Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
	}
	dsn := pgtest.MultiHostDSN(t, a.URL(db), a, b)
	w := pgconnect.Settings{DSN: dsn, MaxConns: 1}
	// Two pools of one session each: one writes outside a transaction,
	// the other in one.
	var pools [2]*pgxpool.Pool
	for i := range pools {
		p, err := pgconnect.Pool(ctx, w, "tidemark-test")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pools[i] = p
	}
	conn, err := pgconnect.Warehouse(ctx, w, "tidemark-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	port := func(q querier) int {
		t.Helper()
		var p int
		if err := q.QueryRow(ctx, "SELECT inet_server_port()").Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, q := range []querier{pools[0], pools[1], conn} {
		if port(q) != a.Port {
			t.Fatalf("a session is not on the first host")
		}
	}

	if err := a.Configure(ctx, map[string]string{"default_transaction_read_only": "on"}); err != nil {
		t.Fatal(err)
	}
	// A session takes the reload in between two statements.
	for _, q := range []querier{pools[0], pools[1], conn} {
		waitfor.Until(t, "a session to be read-only", func() bool {
			var ro string
			return q.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro) == nil && ro == "on"
		})
	}

	writes := []func(id int) error{
		func(id int) error { _, err := pools[0].Exec(ctx, "INSERT INTO t VALUES ($1)", id); return err },
		func(id int) error {
			return pgx.BeginFunc(ctx, pools[1], func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO t VALUES ($1)", id)
				return err
			})
		},
	}
	for i, write := range writes {
		err := write(i)
		if !pgerr.ReadOnly(err) || !pgerr.Unavailable(err) {
			t.Fatalf("pool %d: a write on the fenced server: %v, want a read-only error, unavailable", i, err)
		}
		if err := write(10 + i); err != nil {
			t.Errorf("pool %d: the next write: %v", i, err)
		}
		if got := port(pools[i]); got != b.Port {
			t.Errorf("pool %d: after a write failed read-only, the session is on port %d, want b's %d", i, got, b.Port)
		}
	}

	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (3)")
	if !pgerr.ReadOnly(err) {
		t.Fatalf("a write on the dedicated connection: %v, want a read-only error", err)
	}
	if !conn.IsClosed() {
		t.Error("the dedicated connection stays open on a read-only server")
	}
}

type querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}
