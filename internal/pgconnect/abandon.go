package pgconnect

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// AbandonTimeout bounds what pgconn does with a connection it has given
// up on (a call's context ended, or the connection broke mid-call).
//
// pgconn then closes the connection in the background: it sends a cancel
// request to the server over a new connection, waits for the server to
// acknowledge it, sends Terminate and reads what is left on the
// connection, all within a fixed 15 seconds. pgxpool's Close, and its
// destructor of every connection, wait for that to finish. Behind a
// stalled network, where the cancel request is accepted and never
// answered and the old connection stays silent, each abandoned
// connection therefore held a pool's Close for 15 seconds.
//
// With the connections of this package, the cancel request (its dial and
// its exchange) gets AbandonTimeout, and once a cancel request has been
// sent for a connection, every deadline set on that connection is at
// most AbandonTimeout away. A reachable server acknowledges a cancel
// request in milliseconds, so the server-side cancel still happens in
// the normal case; an unreachable one costs at most about twice
// AbandonTimeout.
const AbandonTimeout = 2 * time.Second

// guardedConn is a network connection of a PostgreSQL session: it bounds
// the deadlines set on it once the session has been given up.
type guardedConn struct {
	net.Conn
	// abandoned is set when a cancel request is sent for the session;
	// it is never cleared, since pgconn only cancels a session it is
	// about to close or has stopped waiting for.
	abandoned atomic.Bool

	// mu orders the deadlines set, so that readDeadline is the read
	// deadline in force: the zero time for none.
	mu           sync.Mutex
	readDeadline time.Time
}

func (c *guardedConn) bound(t time.Time) time.Time {
	if t.IsZero() || !c.abandoned.Load() {
		return t
	}
	if limit := time.Now().Add(AbandonTimeout); t.After(limit) {
		return limit
	}
	return t
}

// SetDeadline implements net.Conn.
func (c *guardedConn) SetDeadline(t time.Time) error { return c.setRead(t, c.Conn.SetDeadline) }

// SetReadDeadline implements net.Conn.
func (c *guardedConn) SetReadDeadline(t time.Time) error { return c.setRead(t, c.Conn.SetReadDeadline) }

// setRead sets a deadline that includes the read deadline with set,
// bounded, and records it.
func (c *guardedConn) setRead(t time.Time, set func(time.Time) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	t = c.bound(t)
	c.readDeadline = t
	return set(t)
}

// ReadDeadlineNear sets the read deadline of conn, a connection of this
// package's sessions, to t unless the one in force is already at most
// slack before t, and not after it: a stream that reads many small
// messages spends more on re-arming the runtime's timer for each than on
// reading most of them, while the deadline it wants moves little. A read
// then times out at most slack early. Other connections always get t.
func ReadDeadlineNear(conn net.Conn, t time.Time, slack time.Duration) error {
	g := guarded(conn)
	if g == nil {
		return conn.SetReadDeadline(t)
	}
	g.mu.Lock()
	at := g.readDeadline
	g.mu.Unlock()
	if !at.IsZero() && !at.After(t) && t.Sub(at) <= slack {
		return nil
	}
	return conn.SetReadDeadline(t)
}

// SetWriteDeadline implements net.Conn.
func (c *guardedConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.bound(t))
}

// NetConn returns the underlying connection.
func (c *guardedConn) NetConn() net.Conn { return c.Conn }

// guarded returns the guardedConn under conn (itself, or the transport of
// a TLS connection), or nil.
func guarded(conn net.Conn) *guardedConn {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	g, _ := conn.(*guardedConn)
	return g
}

// guard makes the connections of cc guarded: the dial of a session, and,
// once a session is established, the dials of its cancel requests.
//
// pgconn dials a cancel request with the DialFunc of the configuration of
// the session it cancels. pgx.ConnectConfig and pgxpool give every
// session its own copy of the configuration, and so does every caller of
// pgconn.ConnectConfig in tidemark; guard relies on this: once the
// session's network connection is up (AfterNetConnect), the session's
// configuration dials cancel requests, for that session only.
func guard(cc *pgconn.Config, d *net.Dialer) {
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &guardedConn{Conn: c}, nil
	}
	next := cc.AfterNetConnect
	cc.AfterNetConnect = func(ctx context.Context, config *pgconn.Config, conn net.Conn) (net.Conn, error) {
		if next != nil {
			var err error
			if conn, err = next(ctx, config, conn); err != nil {
				return nil, err
			}
		}
		session := guarded(conn)
		if session != nil {
			// A fallback host dialed after an earlier attempt got
			// this far was dialed as a cancel request: it is a
			// session after all.
			session.abandoned.Store(false)
			_ = session.SetDeadline(time.Time{})
		}
		config.DialFunc = cancelDial(d, session)
		return conn, nil
	}
}

// cancelDial returns the DialFunc of the cancel requests of session: the
// request, dial included, gets AbandonTimeout, and session's deadlines
// are bounded from then on.
func cancelDial(d *net.Dialer, session *guardedConn) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if session != nil {
			session.abandoned.Store(true)
		}
		dctx, cancel := context.WithTimeout(ctx, AbandonTimeout)
		defer cancel()
		c, err := d.DialContext(dctx, network, addr)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(AbandonTimeout))
		return &guardedConn{Conn: c}, nil
	}
}
