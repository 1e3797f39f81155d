// Package pgconnect opens every PostgreSQL connection tidemark makes, to
// the warehouse and to sources, so that none of them can wait forever on
// the network:
//
//   - a connect timeout (connect_timeout) when the connection string has
//     none;
//   - the dialer of package dialer: TCP keepalives and TCP_USER_TIMEOUT;
//   - a bound on closing a connection given up on (AbandonTimeout);
//   - on warehouse sessions, the server-side limits of warehouse.*:
//     statement_timeout, lock_timeout and
//     idle_in_transaction_session_timeout, unless the connection string
//     sets them itself;
//   - on warehouse sessions to a Citus coordinator, synchronous_commit
//     local where the server's is off (citus.KeepCommitsDurable);
//   - on warehouse sessions, the end of a session that a write finds on a
//     read-only server (see EvictReadOnly), and, in the warehouse pool,
//     of sessions whose server reports them read-only (ReadOnlySession).
//
// A connection string may name several hosts (host=a,b or
// postgres://a:5432,b:5432/db) with target_session_attrs=read-write or
// primary: each connection goes to the first host that accepts it and
// has those attributes, so that after a failover new sessions find the
// promoted primary.
//
// Source sessions get no server-side limits: they run long snapshots and
// cursors, and the source's settings are its owner's. The deadlines of
// the calls themselves are the callers' (see Watchdog).
package pgconnect

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/citus"
	"github.com/tidemark-dev/tidemark/internal/dialer"
	"github.com/tidemark-dev/tidemark/internal/pgerr"
)

// DefaultConnectTimeout bounds a connection attempt, TLS and
// authentication included, when the connection string has no
// connect_timeout.
const DefaultConnectTimeout = 10 * time.Second

// PingTimeout bounds the ping with which the warehouse pool checks an
// idle connection before handing it out, unless the connection string
// sets pool_ping_timeout.
const PingTimeout = 2 * time.Second

// Harden sets the connect timeout and the dialer of cc, and bounds the
// close of a session given up on (see AbandonTimeout). A hardened
// configuration serves one session at a time when given to
// pgconn.ConnectConfig directly; pgx.ConnectConfig and pgxpool copy it
// for each session.
func Harden(cc *pgconn.Config) {
	if cc.ConnectTimeout <= 0 {
		cc.ConnectTimeout = DefaultConnectTimeout
	}
	guard(cc, dialer.New(cc.ConnectTimeout))
}

// Settings say how to reach the warehouse: its connection string, the
// size of its pool and the limits of its sessions (zero leaves the
// server's).
type Settings struct {
	DSN                                              string
	MaxConns                                         int
	StatementTimeout, LockTimeout, IdleInTransaction time.Duration
}

// Session returns the server-side settings of warehouse sessions, as
// startup parameters.
func Session(w Settings) map[string]string {
	out := map[string]string{}
	set := func(name string, d time.Duration) {
		if d > 0 {
			out[name] = fmt.Sprintf("%dms", max(1, d.Milliseconds()))
		}
	}
	set("statement_timeout", w.StatementTimeout)
	set("lock_timeout", w.LockTimeout)
	set("idle_in_transaction_session_timeout", w.IdleInTransaction)
	return out
}

// apply hardens cc and adds params that the connection string does not
// set, with the session in UTC and application_name app.
func apply(cc *pgconn.Config, params map[string]string, app string) {
	Harden(cc)
	for k, v := range params {
		if _, ok := cc.RuntimeParams[k]; !ok {
			cc.RuntimeParams[k] = v
		}
	}
	cc.RuntimeParams["application_name"] = app
	cc.RuntimeParams["timezone"] = "UTC"
	cc.AfterConnect = citus.KeepCommitsDurable
	EvictReadOnly(cc)
}

// EvictReadOnly makes every session of cc end as soon as the server
// refuses one of its statements because the session is read-only
// (pgerr.ReadOnly): the statement still returns that error, and the
// session is closed.
//
// After a failover, a session may stay on a server that no longer takes
// writes (a primary demoted or fenced with default_transaction_read_only,
// a read-write endpoint still pointing at a standby) and land there
// again: the error is then a healthy session's, which a pool would hand
// out again and again. Ended, the session leaves the pool (pgxpool
// destroys a closed connection on release) or is replaced by its owner,
// and the next session is opened from the connection string, whose
// target_session_attrs finds the writable host. The check costs nothing
// until the error comes, unlike a check of transaction_read_only or
// pg_is_in_recovery() on every acquire; and it catches the sessions that
// became read-only after they were opened, which target_session_attrs,
// checked at connect, cannot.
func EvictReadOnly(cc *pgconn.Config) {
	next := cc.OnPgError
	cc.OnPgError = func(conn *pgconn.PgConn, err *pgconn.PgError) bool {
		if pgerr.ReadOnly(err) {
			return false
		}
		return next == nil || next(conn, err)
	}
}

// WarehouseConfig parses warehouse.dsn for a connection of its own, with
// the session settings of w and extra settings (which the connection
// string's and w's take precedence over).
func WarehouseConfig(w Settings, app string, extra map[string]string) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(w.DSN)
	if err != nil {
		return nil, fmt.Errorf("warehouse.dsn: %w", err)
	}
	params := Session(w)
	for k, v := range extra {
		if _, ok := params[k]; !ok {
			params[k] = v
		}
	}
	apply(&cc.Config, params, app)
	return cc, nil
}

// Warehouse opens a warehouse connection of its own (see WarehouseConfig).
func Warehouse(ctx context.Context, w Settings, app string, extra map[string]string) (*pgx.Conn, error) {
	cc, err := WarehouseConfig(w, app, extra)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect to the warehouse: %w", err)
	}
	return conn, nil
}

// Pool opens the warehouse pool of w.DSN with w.MaxConns connections and
// the session settings of w. Connections copied from its configuration
// (pool.Config().ConnConfig.Copy()) keep them.
func Pool(ctx context.Context, w Settings, app string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(w.DSN)
	if err != nil {
		return nil, fmt.Errorf("warehouse.dsn: %w", err)
	}
	if w.MaxConns > 0 {
		pc.MaxConns = int32(min(w.MaxConns, math.MaxInt32))
	}
	if pc.PingTimeout <= 0 {
		// pgxpool pings a connection idle for a second before handing
		// it out, and without a ping timeout a ping whose caller gave
		// up waits up to a minute on a silent connection, keeping it,
		// and Close, that long.
		pc.PingTimeout = PingTimeout
	}
	apply(&pc.ConnConfig.Config, Session(w), app)
	var self atomic.Pointer[pgxpool.Pool]
	pc.PrepareConn = func(_ context.Context, conn *pgx.Conn) (bool, error) {
		if !ReadOnlySession(conn.PgConn()) {
			return true, nil
		}
		// The pool's other sessions are most likely on the same
		// server: all go, and the next acquire opens a new one.
		if p := self.Load(); p != nil {
			p.Reset()
		}
		return false, fmt.Errorf("warehouse: %w", pgerr.ErrReadOnly)
	}
	pc.AfterRelease = func(conn *pgx.Conn) bool { return !ReadOnlySession(conn.PgConn()) }
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("warehouse pool: %w", err)
	}
	self.Store(pool)
	return pool, nil
}

// ReadOnlySession reports whether the server of conn said, when it last
// answered, that the session cannot write: it is a hot standby
// (in_hot_standby) or its transactions are read-only by default
// (default_transaction_read_only, as a failover sets it to fence a
// primary it demotes). PostgreSQL 14 and later report both parameters
// whenever they change, with the answer to the next statement, so the
// check costs no round trip.
//
// The warehouse pool gives up such a session when it is released, and,
// when it is acquired (after the ping pgxpool sends a session idle for a
// second, which also brings news of a reload), empties itself and fails
// the acquire with pgerr.ErrReadOnly: unavailable, retried with a new
// session. Without this, a session left on a demoted primary that only
// reads would go on reading its stale state.
func ReadOnlySession(conn *pgconn.PgConn) bool {
	return conn.ParameterStatus("in_hot_standby") == "on" || conn.ParameterStatus("default_transaction_read_only") == "on"
}

// Parse parses a connection string for a session without server-side
// limits (a source, or migrations), hardened, with
// application_name app.
func Parse(dsn, app string) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	Harden(&cc.Config)
	cc.RuntimeParams["application_name"] = app
	return cc, nil
}

// Replication parses a source's connection string for a logical
// replication connection, hardened, with application_name app.
func Replication(dsn, app string) (*pgconn.Config, error) {
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	Harden(pc)
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = app
	return pc, nil
}
