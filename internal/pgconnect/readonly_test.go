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
// The first write of a session fails with read_only_sql_transaction, an
// unavailable server, and ends the session; a session that only reads is
// given up by its pool once the server has said it is read-only. The next
// session lands on b. Without the eviction a pool hands the same
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
	w := pgconnect.Settings{DSN: dsn, MaxConns: 2}
	// Three pools: one writes outside a transaction, one in one, one
	// only reads.
	var pools [3]*pgxpool.Pool
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
	port := func(q querier) (int, error) {
		var p int
		err := q.QueryRow(ctx, "SELECT inet_server_port()").Scan(&p)
		return p, err
	}
	for _, q := range []querier{pools[0], pools[1], pools[2], conn} {
		if p, err := port(q); err != nil || p != a.Port {
			t.Fatalf("a session is not on the first host: port %d, %v", p, err)
		}
	}

	if err := a.Configure(ctx, map[string]string{"default_transaction_read_only": "on"}); err != nil {
		t.Fatal(err)
	}
	// The server has reloaded when its new sessions are read-only; the
	// open ones take the reload before their next statement.
	waitfor.Until(t, "the fence to take effect", func() bool {
		var ro string
		c, err := pgx.Connect(ctx, a.URL(db))
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		return c.QueryRow(ctx, "SHOW default_transaction_read_only").Scan(&ro) == nil && ro == "on"
	})

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
		if got, err := port(pools[i]); err != nil || got != b.Port {
			t.Errorf("pool %d: after a write failed read-only, the session is on port %d (%v), want b's %d", i, got, err, b.Port)
		}
	}
	// The reader: its first read either runs on a, which then reports
	// the session read-only, or finds it reported so (the pool pings a
	// session idle for a second); the session is given up either way,
	// and the read after lands on b.
	_, err = port(pools[2])
	if err != nil && (!pgerr.ReadOnly(err) || !pgerr.Unavailable(err)) {
		t.Fatalf("a read on the fenced server: %v, want it to succeed or to fail read-only, unavailable", err)
	}
	if got, err := port(pools[2]); err != nil || got != b.Port {
		t.Errorf("the reading pool's session is on port %d (%v), want b's %d", got, err, b.Port)
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
