package reconcile_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// started is a reconciler's Run in the background, with its log.
type started struct {
	log    *syncbuf.Buffer
	cancel context.CancelFunc
	done   chan error
}

// start runs a reconciler of the bundle's configuration on pool until
// stop, or the end of the test.
func (b *bundle) start(pool *pgxpool.Pool) *started {
	b.t.Helper()
	s := &started{log: &syncbuf.Buffer{}, done: make(chan error, 1)}
	r, err := reconcile.New(b.cfg, pool, reconcile.Options{Now: b.clock.Now,
		Logger: slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.done <- r.Run(ctx) }()
	b.t.Cleanup(cancel)
	return s
}

// stop cancels Run and returns what it returned.
func (s *started) stop() error {
	s.cancel()
	return <-s.done
}

// logged waits until the reconciler has logged text.
func (s *started) logged(t *testing.T, text string) {
	t.Helper()
	waitfor.Until(t, "the log line "+text, func() bool { return strings.Contains(s.log.String(), text) })
}

// TestRunWaitsForTheWarehouse: Run waits out a warehouse that cannot be
// reached, or that refuses the connection itself (an unknown database),
// trying to prepare the aggregates again; once it can, it prepares them
// (creating the target table) and reconciles. Cancelled, it returns nil.
func TestRunWaitsForTheWarehouse(t *testing.T) {
	t.Run("unreachable", func(t *testing.T) {
		b := setup(t, 1, dailySales("correction"))
		dsn, px := faulttest.Front(t, b.dsn)
		px.Refuse()
		s := b.start(pgtest.Pool(t, dsn))
		s.logged(t, "cannot prepare aggregates; retrying")
		px.Resume()
		waitfor.Until(t, "daily_sales to be created and reconciled", func() bool {
			return b.rows(`SELECT to_regclass('daily_sales') IS NOT NULL
				AND EXISTS (SELECT FROM tidemark.load_watermarks WHERE aggregate = 'daily_sales' AND last_run_at IS NOT NULL)`)[0] == "true"
		})
		if err := s.stop(); err != nil {
			t.Errorf("Run = %v after cancel, want nil", err)
		}
	})
	t.Run("unknown database", func(t *testing.T) {
		b := setup(t, 1, dailySales("correction"))
		u, err := url.Parse(b.dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/no_such_database"
		s := b.start(pgtest.Pool(t, u.String()))
		s.logged(t, "cannot prepare aggregates; retrying")
		if err := s.stop(); err != nil {
			t.Errorf("Run = %v after cancel, want nil", err)
		}
	})
}

// TestRunEndsOnConfigurationError: a query the warehouse refuses (a
// column that does not exist) ends Run with the error, which names the
// key to fix.
func TestRunEndsOnConfigurationError(t *testing.T) {
	a := dailySales("correction")
	a.sql = "SELECT {{partition}} AS sale_date, sum(no_such_column) AS total FROM {{events}} GROUP BY 1"
	b := setup(t, 1, a)
	s := b.start(b.pool)
	var err error
	select {
	case err = <-s.done:
	case <-time.After(waitfor.Timeout):
		t.Fatalf("Run did not end within %s:\n%s", waitfor.Timeout, s.log)
	}
	if err == nil || !strings.Contains(err.Error(), "aggregates.daily_sales.sql") || !strings.Contains(err.Error(), "no_such_column") {
		t.Errorf("Run = %v, want the query's error under aggregates.daily_sales.sql", err)
	}
	if strings.Contains(s.log.String(), "cannot prepare aggregates") {
		t.Errorf("the configuration's error was retried:\n%s", s.log)
	}
}
