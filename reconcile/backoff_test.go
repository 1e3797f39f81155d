package reconcile_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/status"
)

// checkFailing checks a failing partition's queue row.
func checkFailing(t *testing.T, what string, p pendingRow, attempts int, since, next time.Time) {
	t.Helper()
	if p.attempts != attempts {
		t.Errorf("%s: attempts %d, want %d", what, p.attempts, attempts)
	}
	if p.lastError == nil || !strings.Contains(*p.lastError, "invalid input syntax for type numeric") {
		t.Errorf("%s: last_error %v, want the cast error", what, p.lastError)
	}
	if p.failingSince == nil || !p.failingSince.Equal(since) {
		t.Errorf("%s: failing_since %v, want %v", what, p.failingSince, since)
	}
	if p.nextAttempt == nil || !p.nextAttempt.Equal(next) {
		t.Errorf("%s: next_attempt_at %v, want %v", what, p.nextAttempt, next)
	}
}

// TestFailingPartitionBacksOff: a partition whose rebuild keeps failing on
// its data is tried again after reconcile.every, then after twice as long
// each time, up to an hour; it is not picked before then, so it takes no
// place of max_partitions_per_run, and new data for it does not reset the
// delay. Status and the failing-partitions gauge show it until a rebuild
// succeeds.
func TestFailingPartitionBacksOff(t *testing.T) {
	b := setup(t, 1, dailySales("correction"))
	b.cfg.Reconcile.MaxPartitionsPerRun = 1
	b.startIngest()
	r, reg := b.reconciler()
	every := b.cfg.Reconcile.Every.Duration()
	if every != time.Minute {
		t.Fatalf("reconcile.every %v, want the default 1m", every)
	}

	// An amount that does not cast to numeric: the query fails for 5 October.
	first := at("2026-10-05 10:00")
	b.ingestAt("2026-10-05 10:00", event(0, "bad", "2026-10-05T09:00:00Z", `"bad"`))
	rep := b.runAt(r, first)
	if len(rep.Failed) != 1 || rep.Failed[0] != "2026-10-05" || len(rep.Rebuilt) != 0 {
		t.Fatalf("first run: %+v", rep)
	}
	checkFailing(t, "after the first failure", b.pending("2026-10-05 00:00"), 1, first, first.Add(every))
	if got := gauge(t, reg, "tidemark_reconcile_failing_partitions", "daily_sales"); got != 1 {
		t.Errorf("failing partitions gauge %v, want 1", got)
	}

	// Runs before the next attempt leave it alone and rebuild what is due,
	// even with one partition per run.
	rep = b.runAt(r, first.Add(30*time.Second))
	if len(rep.Failed) != 0 || len(rep.Rebuilt) != 0 {
		t.Errorf("run before the next attempt: %+v", rep)
	}
	b.ingestAt("2026-10-05 10:00", event(0, "d4", "2026-10-04T12:00:00Z", "4"))
	rep = b.runAt(r, first.Add(40*time.Second))
	if len(rep.Failed) != 0 || len(rep.Rebuilt) != 1 || rep.Rebuilt[0] != "2026-10-04" {
		t.Errorf("run with a due partition: %+v", rep)
	}
	checkFailing(t, "before the next attempt", b.pending("2026-10-05 00:00"), 1, first, first.Add(every))

	// Each attempt is due at the previous one plus a delay that doubles
	// from reconcile.every and stops at an hour.
	clock := first
	for failures, delay := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute,
		16 * time.Minute, 32 * time.Minute, time.Hour, time.Hour} {
		next := clock.Add(delay)
		if rep := b.runAt(r, next.Add(-time.Second)); len(rep.Failed) != 0 {
			t.Errorf("run a second before attempt %d: %+v", failures+2, rep)
		}
		clock = next
		if rep := b.runAt(r, clock); len(rep.Failed) != 1 {
			t.Errorf("attempt %d at %s did not fail: %+v", failures+2, clock.Format(time.TimeOnly), rep)
		}
		want := min(2*delay, time.Hour)
		checkFailing(t, "attempt "+clock.Format(time.TimeOnly), b.pending("2026-10-05 00:00"), failures+2, first, clock.Add(want))
	}
	// first + 1+2+4+8+16+32+60+60 minutes
	if want := at("2026-10-05 13:03"); !clock.Equal(want) {
		t.Errorf("last attempt at %s, want %s", clock, want)
	}
	if got := gauge(t, reg, "tidemark_reconcile_rebuild_errors_total", "daily_sales"); got != 9 {
		t.Errorf("rebuild errors %v, want 9", got)
	}

	// New data for the failing partition queues nothing new: it keeps its
	// attempts and its next attempt.
	b.ingestAt("2026-10-05 13:03", event(0, "more", "2026-10-05T08:00:00Z", "3"))
	rep = b.runAt(r, clock.Add(time.Minute))
	if rep.Queued != 1 || len(rep.Failed) != 0 || len(rep.Rebuilt) != 0 || rep.Remaining != 1 {
		t.Errorf("run after new data: %+v", rep)
	}
	checkFailing(t, "after new data", b.pending("2026-10-05 00:00"), 9, first, clock.Add(time.Hour))
	if queue := b.rows("SELECT partition_start::text FROM tidemark.pending_partitions"); len(queue) != 1 {
		t.Errorf("queue %q, want one row", queue)
	}

	// tidemark status shows it.
	rpt, text := b.status(clock.Add(time.Minute))
	ag := rpt.Aggregates[0]
	if ag.FailingCount != 1 || len(ag.Failing) != 1 {
		t.Fatalf("status: %d failing partitions %+v", ag.FailingCount, ag.Failing)
	}
	f := ag.Failing[0]
	if f.Key != "2026-10-05" || f.Attempts != 9 || f.FailingSince == nil || !f.FailingSince.Equal(first) ||
		f.NextAttempt == nil || !f.NextAttempt.Equal(at("2026-10-05 14:03")) || !strings.Contains(f.LastError, "SQLSTATE 22P02") {
		t.Errorf("status failing partition %+v", f)
	}
	var js bytes.Buffer
	if err := rpt.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  failing partitions    1\n",
		"    2026-10-05          failing since 2026-10-05T10:00:00Z (9 attempts, next attempt 2026-10-05T14:03:00Z): " +
			`rebuild daily_sales 2026-10-05: ERROR: invalid input syntax for type numeric: "bad" (SQLSTATE 22P02)` + "\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("status text lacks %q:\n%s", want, text)
		}
	}
	for _, want := range []string{`"failing_partitions": 1`, `"failing_since": "2026-10-05T10:00:00Z"`,
		`"next_attempt_at": "2026-10-05T14:03:00Z"`, `"attempts": 9`} {
		if !strings.Contains(js.String(), want) {
			t.Errorf("status JSON lacks %q:\n%s", want, js.String())
		}
	}

	// Once the data is fixed, clearing next_attempt_at (the runbook's
	// step) makes the next run rebuild it, and the failure is gone.
	for _, sql := range []string{
		`UPDATE raw.app_events SET payload = payload || '{"amount": 7}' WHERE event_id = 'bad'`,
		`UPDATE tidemark.pending_partitions SET next_attempt_at = NULL WHERE aggregate = 'daily_sales' AND attempts > 0`,
	} {
		if _, err := b.pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	rep = b.runAt(r, clock.Add(2*time.Minute))
	if len(rep.Rebuilt) != 1 || rep.Rebuilt[0] != "2026-10-05" || rep.Remaining != 0 {
		t.Errorf("run after the fix: %+v", rep)
	}
	pgtest.Equal(t, "daily_sales after the fix", b.rows("SELECT sale_date::text, total::text, event_count FROM daily_sales ORDER BY 1"),
		[]string{"2026-10-04 | 4.00 | 1", "2026-10-05 | 10.00 | 2"})
	if got := gauge(t, reg, "tidemark_reconcile_failing_partitions", "daily_sales"); got != 0 {
		t.Errorf("failing partitions gauge after the fix %v, want 0", got)
	}
	rpt, text = b.status(clock.Add(2 * time.Minute))
	if ag := rpt.Aggregates[0]; ag.FailingCount != 0 || len(ag.Failing) != 0 || strings.Contains(text, "failing") {
		t.Errorf("status after the fix: %d failing %+v\n%s", ag.FailingCount, ag.Failing, text)
	}

	// The report lists the five longest failing partitions and counts the
	// rest.
	for i := range 7 {
		if _, err := b.pool.Exec(context.Background(), `INSERT INTO tidemark.pending_partitions
			(aggregate, partition_start, partition_end, reason, queued_at, attempts, last_error, failing_since, next_attempt_at)
			VALUES ('daily_sales', $1::timestamptz, $1::timestamptz + interval '1 day', 'late', $2, 2, 'boom', $2, $3)`,
			at("2026-09-01 00:00").AddDate(0, 0, i), at("2026-10-05 12:00").Add(time.Duration(i)*time.Minute), at("2026-10-05 15:00")); err != nil {
			t.Fatal(err)
		}
	}
	rpt, text = b.status(clock.Add(2 * time.Minute))
	ag = rpt.Aggregates[0]
	var listed []string
	for _, f := range ag.Failing {
		listed = append(listed, f.Key)
	}
	pgtest.Equal(t, "failing partitions listed", listed, []string{"2026-09-01", "2026-09-02", "2026-09-03", "2026-09-04", "2026-09-05"})
	for _, want := range []string{
		"  failing partitions    7\n",
		"    2026-09-01          failing since 2026-10-05T12:00:00Z (2 attempts, next attempt 2026-10-05T15:00:00Z): boom\n",
		"    … and 2 more\n",
	} {
		if ag.FailingCount != 7 || !strings.Contains(text, want) {
			t.Errorf("status text (%d failing) lacks %q:\n%s", ag.FailingCount, want, text)
		}
	}
}

// status gathers tidemark status at the service time now and renders it
// as text.
func (b *bundle) status(now time.Time) (*status.Report, string) {
	b.t.Helper()
	rpt, err := status.Gather(context.Background(), b.pool, b.cfg, nil, now)
	if err != nil {
		b.t.Fatal(err)
	}
	var text bytes.Buffer
	if err := rpt.WriteText(&text); err != nil {
		b.t.Fatal(err)
	}
	return rpt, text.String()
}
