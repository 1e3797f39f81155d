package pgconnect_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/faulttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestCleanupIsBounded rolls back a transaction, and closes its
// connection, after its caller gave up and while the network stalls:
// each returns within CleanupTimeout (and the close of the abandoned
// session), where a rollback with a context that cannot end waited for
// good. A chaos run found a poll run's deferred rollback holding the
// shutdown this way.
func TestCleanupIsBounded(t *testing.T) {
	faulttest.CheckNoLeaks(t)
	dsn, px := faulttest.Front(t, pgtest.NewDatabase(t))
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgconnect.Warehouse(ctx, pgconnect.Settings{DSN: dsn}, "tidemark-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "CREATE TEMP TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	px.Stall()
	cancel()
	bound := pgconnect.CleanupTimeout + 2*pgconnect.AbandonTimeout + time.Second
	for _, step := range []struct {
		name string
		do   func()
	}{
		{"rollback", func() { pgconnect.Rollback(ctx, tx) }},
		{"close", func() { pgconnect.Close(ctx, conn) }},
	} {
		began := time.Now()
		step.do()
		if took := time.Since(began); took > bound {
			t.Errorf("%s behind a stall took %s, want at most %s", step.name, took.Round(100*time.Millisecond), bound)
		}
	}
	px.Resume()
}
