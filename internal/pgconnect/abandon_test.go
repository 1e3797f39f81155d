package pgconnect_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/faultproxy"
	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestAbandonedSessionsCloseSoon gives up on pool sessions behind a
// stalled or half-open network and checks that the pool closes within a
// few seconds, where pgconn alone waits 15 seconds per session for the
// cancel request and the drain of the old connection.
func TestAbandonedSessionsCloseSoon(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(p *faultproxy.Proxy)
	}{
		{"stall", (*faultproxy.Proxy).Stall},
		{"half-open", (*faultproxy.Proxy).HalfOpen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct := pgtest.NewDatabase(t)
			dsn, px := faulttest.Front(t, direct)
			check := pgtest.Pool(t, direct)
			ctx := context.Background()
			pool, err := pgconnect.Pool(ctx, pgconnect.Settings{DSN: dsn, MaxConns: 3}, "tidemark-test")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			// Three sessions, each in the middle of a call when the
			// fault strikes.
			done := make(chan error, 3)
			for range 3 {
				go func() {
					qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					defer cancel()
					_, err := pool.Exec(qctx, "SELECT pg_sleep(1.5)")
					done <- err
				}()
			}
			// The server runs the three calls: the fault strikes them
			// mid-call.
			waitfor.Until(t, "the server to run the three calls", func() bool {
				var n int
				if err := check.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND query = 'SELECT pg_sleep(1.5)' AND state = 'active'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 3
			})
			tc.fault(px)
			for range 3 {
				if err := <-done; err == nil {
					t.Fatal("a call succeeded through the fault")
				}
			}
			start := time.Now()
			pool.Close()
			if took := time.Since(start); took > 3*pgconnect.AbandonTimeout {
				t.Errorf("pool.Close took %s, want at most %s", took.Round(time.Millisecond), 3*pgconnect.AbandonTimeout)
			} else {
				t.Logf("pool.Close took %s", took.Round(time.Millisecond))
			}
		})
	}
}

// TestGivenUpCallCancelledOnServer checks that a call whose context ends
// is still cancelled on a reachable server, not merely abandoned by the
// client.
func TestGivenUpCallCancelledOnServer(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	pool, err := pgconnect.Pool(ctx, pgconnect.Settings{DSN: dsn}, "tidemark-test")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	check := pgtest.Pool(t, dsn)
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := pool.Exec(qctx, "SELECT pg_sleep(60)"); err == nil {
		t.Fatal("pg_sleep(60) returned within 300ms")
	}
	waitfor.Within(t, pgconnect.AbandonTimeout, "the server to cancel the call the client gave up", func() bool {
		var n int
		if err := check.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'SELECT pg_sleep(60)' AND state = 'active'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}
