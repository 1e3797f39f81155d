package pgconnect_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestReadDeadlineNear checks when ReadDeadlineNear moves a session's read
// deadline, by how long a read on the idle session takes to time out: it
// keeps a deadline in force that is at most slack earlier, takes an
// earlier one or a much later one, and sets one after the deadlines were
// cleared, as pgconn clears them after a call whose context ended (a
// deadline it took to be still in force would leave the read waiting
// forever).
func TestReadDeadlineNear(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	for _, tc := range []struct {
		name        string
		first, then time.Duration // the deadlines asked for, from now
		slack       time.Duration
		clear       bool          // the deadlines cleared between the two
		want        time.Duration // the deadline expected in force
	}{
		{"kept within slack", 200 * time.Millisecond, 3 * time.Second, 5 * time.Second, false, 200 * time.Millisecond},
		{"moved beyond slack", 200 * time.Millisecond, 3 * time.Second, time.Millisecond, false, 3 * time.Second},
		{"moved earlier", 5 * time.Second, 200 * time.Millisecond, 10 * time.Second, false, 200 * time.Millisecond},
		{"set after pgconn cleared it", 200 * time.Millisecond, 3 * time.Second, 5 * time.Second, true, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, err := pgconnect.Parse(dsn, "tidemark-test")
			if err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.ConnectConfig(context.Background(), cc)
			if err != nil {
				t.Fatal(err)
			}
			pc := conn.PgConn()
			// Whatever happens, the read below ends by this.
			stop := time.AfterFunc(20*time.Second, func() { _ = pc.Conn().Close() })
			defer stop.Stop()
			defer conn.Close(context.Background())

			start := time.Now()
			if err := pgconnect.ReadDeadlineNear(pc.Conn(), start.Add(tc.first), tc.slack); err != nil {
				t.Fatal(err)
			}
			if tc.clear {
				// As pgconn does when a call's context ends.
				if err := pc.Conn().SetDeadline(time.Time{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := pgconnect.ReadDeadlineNear(pc.Conn(), start.Add(tc.then), tc.slack); err != nil {
				t.Fatal(err)
			}
			_, err = pc.ReceiveMessage(context.Background())
			took := time.Since(start)
			if !pgconn.Timeout(err) {
				t.Fatalf("the read on an idle session ended after %s with %v, want a timeout", took, err)
			}
			// The two deadlines of a case are at least 2.8 s apart: the
			// read must time out after the expected one and well before
			// the other.
			if took < tc.want || took > tc.want+2*time.Second {
				t.Fatalf("the read timed out after %s, want the deadline %s after the start", took.Round(time.Millisecond), tc.want)
			}
		})
	}
}
