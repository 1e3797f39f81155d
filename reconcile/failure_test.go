package reconcile_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/internal/pgerr"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// pendingRow is a partition's row in tidemark.pending_partitions.
type pendingRow struct {
	attempts     int
	lastError    *string
	failingSince *time.Time
	nextAttempt  *time.Time
}

// pending reads the queue row of a partition of daily_sales.
func (b *bundle) pending(start string) pendingRow {
	b.t.Helper()
	var p pendingRow
	err := b.pool.QueryRow(context.Background(), `SELECT attempts, last_error, failing_since, next_attempt_at
		FROM tidemark.pending_partitions WHERE aggregate = 'daily_sales' AND partition_start = $1`, at(start)).
		Scan(&p.attempts, &p.lastError, &p.failingSince, &p.nextAttempt)
	if err != nil {
		b.t.Fatalf("queue row of %s: %v", start, err)
	}
	return p
}

// runAt sets the service clock and reconciles daily_sales once.
func (b *bundle) runAt(r *reconcile.Reconciler, clock time.Time) reconcile.Report {
	b.t.Helper()
	b.clock.Set(clock)
	return b.runOnce(r, "daily_sales")
}

// skipOnCitus skips a test whose aggregate query calls rebuild_gate(): on
// a Citus cluster the function runs on the workers, where public.gate does
// not exist.
func skipOnCitus(t *testing.T) {
	t.Helper()
	if pgtest.OnCitus() {
		t.Skip("rebuild_gate() reads a table of the coordinator; Citus runs it on the workers")
	}
}

// gateSQL is daily_sales's query behind rebuild_gate(), which the tests
// use to hold a rebuild (an advisory lock), or to make it fail as a full
// disk does or, the first public.gate.deadlocks times, as a deadlock
// victim does.
const gateSQL = `SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*)::int AS event_count
      FROM {{events}} WHERE rebuild_gate() GROUP BY 1`

const gateFunctionSQL = `
CREATE TABLE public.gate (mode text NOT NULL, deadlocks int NOT NULL DEFAULT 0);
INSERT INTO public.gate VALUES ('open');
CREATE SEQUENCE public.gate_calls;
CREATE FUNCTION public.rebuild_gate() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(4242);
    IF (SELECT mode FROM public.gate) = 'disk full' THEN
        RAISE EXCEPTION 'could not extend file "base/1/2": No space left on device' USING ERRCODE = 'disk_full';
    END IF;
    IF nextval('public.gate_calls') <= (SELECT deadlocks FROM public.gate) THEN
        RAISE EXCEPTION 'deadlock detected' USING ERRCODE = 'deadlock_detected';
    END IF;
    RETURN true;
END $$`

// TestWarehouseFailureIsNotThePartitions: a rebuild that fails because the
// warehouse cannot work (its session terminated by an administrator, a
// full disk) ends the run, with that failure as its error, without
// counting an attempt against the partition or going on to the next one;
// the next run rebuilds both.
func TestWarehouseFailureIsNotThePartitions(t *testing.T) {
	skipOnCitus(t)
	for _, tc := range []struct {
		name string
		code string // SQLSTATE of the run's error
		// fail makes the rebuild of the run that runs in the background
		// fail, and returns that run's error.
		fail func(t *testing.T, b *bundle, run func() <-chan error) error
	}{
		{"terminated", pgerrcode.AdminShutdown, func(t *testing.T, b *bundle, run func() <-chan error) error {
			t.Helper()
			ctx := context.Background()
			hold, err := b.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Release()
			if _, err := hold.Exec(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
				t.Fatal(err)
			}
			defer func() { _, _ = hold.Exec(ctx, "SELECT pg_advisory_unlock(4242)") }()
			done := run()
			var pid int32
			waitfor.Until(t, "the rebuild to reach the gate", func() bool {
				return b.pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted
					AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&pid) == nil
			})
			var ok bool
			if err := b.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 60000)", pid).Scan(&ok); err != nil || !ok {
				t.Fatalf("terminate the reconciler's session %d: %v %v", pid, ok, err)
			}
			return waitRun(t, done)
		}},
		{"disk full", pgerrcode.DiskFull, func(t *testing.T, b *bundle, run func() <-chan error) error {
			t.Helper()
			if _, err := b.pool.Exec(context.Background(), "UPDATE public.gate SET mode = 'disk full'"); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if _, err := b.pool.Exec(context.Background(), "UPDATE public.gate SET mode = 'open'"); err != nil {
					t.Error(err)
				}
			}()
			return waitRun(t, run())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := dailySales("correction")
			a.sql = gateSQL
			b := setup(t, 1, a)
			if _, err := b.pool.Exec(context.Background(), gateFunctionSQL); err != nil {
				t.Fatal(err)
			}
			b.startIngest()
			r, reg := b.reconciler()
			b.ingestAt("2026-10-05 10:00", event(0, "e1", "2026-10-05T09:00:00Z", "5"), event(0, "e2", "2026-10-04T09:00:00Z", "2"))
			b.clock.Set(at("2026-10-05 10:01"))
			err := tc.fail(t, b, func() <-chan error {
				done := make(chan error, 1)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					_, err := r.RunOnce(ctx, "daily_sales", true)
					done <- err
				}()
				return done
			})
			if !pgerr.Is(err, tc.code) {
				t.Errorf("run error %v, want SQLSTATE %s", err, tc.code)
			}
			for _, start := range []string{"2026-10-05 00:00", "2026-10-04 00:00"} {
				p := b.pending(start)
				if p.attempts != 0 || p.lastError != nil || p.failingSince != nil || p.nextAttempt != nil {
					t.Errorf("partition %s was blamed: attempts %d, last_error %v, failing_since %v, next_attempt_at %v",
						start, p.attempts, deref(p.lastError), p.failingSince, p.nextAttempt)
				}
			}
			checkCounters(t, reg, map[string]float64{"tidemark_reconcile_rebuild_errors_total": 0,
				"tidemark_reconcile_partitions_rebuilt_total": 0})

			b.clock.Set(at("2026-10-05 10:02"))
			rep := b.runOnce(r, "daily_sales")
			pgtest.Equal(t, "rebuilt by the next run", rep.Rebuilt, []string{"2026-10-05", "2026-10-04"})
			if len(rep.Failed) != 0 || rep.Remaining != 0 {
				t.Errorf("next run: %+v", rep)
			}
			pgtest.Equal(t, "daily_sales", b.rows("SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1"),
				[]string{"2026-10-04 | 2.00 | 1", "2026-10-05 | 5.00 | 1"})
			checkCounters(t, reg, map[string]float64{"tidemark_reconcile_rebuild_errors_total": 0,
				"tidemark_reconcile_partitions_rebuilt_total": 2, "tidemark_reconcile_failing_partitions": 0})
		})
	}
}

// TestDeadlockIsTriedAgain: a rebuild chosen as a deadlock victim is run
// again at once, in a new transaction, and only counts as the partition's
// failure when every attempt fails.
func TestDeadlockIsTriedAgain(t *testing.T) {
	skipOnCitus(t)
	for _, tc := range []struct {
		name      string
		deadlocks int
		rebuilt   []string
		attempts  int
	}{
		{"then succeeds", 2, []string{"2026-10-05"}, 0},
		{"every time", 3, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := dailySales("correction")
			a.sql = gateSQL
			b := setup(t, 1, a)
			if _, err := b.pool.Exec(context.Background(), gateFunctionSQL); err != nil {
				t.Fatal(err)
			}
			if _, err := b.pool.Exec(context.Background(), "UPDATE public.gate SET deadlocks = $1", tc.deadlocks); err != nil {
				t.Fatal(err)
			}
			b.startIngest()
			r, reg := b.reconciler()
			b.ingestAt("2026-10-05 10:00", event(0, "e1", "2026-10-05T09:00:00Z", "5"))
			rep := b.runAt(r, at("2026-10-05 10:01"))
			pgtest.Equal(t, "rebuilt", rep.Rebuilt, tc.rebuilt)
			pgtest.Equal(t, "gate calls", b.rows("SELECT last_value FROM public.gate_calls"), []string{"3"})
			var failed float64
			if tc.attempts > 0 {
				failed = 1
				p := b.pending("2026-10-05 00:00")
				if p.attempts != tc.attempts || p.lastError == nil || !strings.Contains(*p.lastError, "SQLSTATE 40P01") ||
					p.nextAttempt == nil || !p.nextAttempt.Equal(at("2026-10-05 10:02")) {
					t.Errorf("queue row: attempts %d, last_error %s, next_attempt_at %v", p.attempts, deref(p.lastError), p.nextAttempt)
				}
			}
			checkCounters(t, reg, map[string]float64{"tidemark_reconcile_rebuild_errors_total": failed,
				"tidemark_reconcile_failing_partitions": failed})
		})
	}
}

// waitRun waits for a run started in the background to end.
func waitRun(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("the run did not end within two minutes")
		return nil
	}
}

// checkCounters compares series of daily_sales with their wanted values.
func checkCounters(t *testing.T, reg *prometheus.Registry, want map[string]float64) {
	t.Helper()
	for name, v := range want {
		if got := gauge(t, reg, name, "daily_sales"); got != v {
			t.Errorf("%s %v, want %v", name, got, v)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
