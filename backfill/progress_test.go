package backfill_test

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/backfill"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestProgress: a run reports each chunk it finishes, failed ones
// included. In lines mode the run's logger gets a "backfill progress"
// line every interval while chunks are rebuilt (done of the chunks to
// run, rate, time left) and one at the end; in bar mode the bar ends at
// every chunk with a rate and time left; without a display the run shows
// nothing of the kind.
func TestProgress(t *testing.T) {
	w := newWarehouse(t, "correction")
	for _, day := range []string{"01", "02", "03", "04", "05", "06"} {
		w.sale("s"+day, "2026-09-"+day+" 10:00", 1)
	}
	// The third day's chunk waits for an advisory lock the test holds
	// until a periodic line has come, however late the interval fires on
	// a busy machine; the fifth day fails and counts as done with too.
	w.exec(`CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.sale_date = '2026-09-03' THEN PERFORM pg_advisory_lock_shared(4242); PERFORM pg_advisory_unlock_shared(4242); END IF;
			IF NEW.sale_date = '2026-09-05' THEN RAISE EXCEPTION 'source busy'; END IF;
			RETURN NEW;
		END $$`)
	w.exec(`CREATE TRIGGER slow BEFORE INSERT ON daily_sales FOR EACH ROW EXECUTE FUNCTION slow()`)
	hold, err := w.pool.Acquire(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	if _, err := hold.Exec(w.ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	unlock := sync.OnceFunc(func() {
		if _, err := hold.Exec(w.ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
			t.Error(err)
		}
	})
	defer unlock()

	var logs syncbuf.Buffer
	type result struct {
		rep *backfill.Report
		err error
	}
	ran := make(chan result, 1)
	go func() {
		rep, err := w.backfill("2026-09-01", "2026-09-06", backfill.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			Progress: progress.New(progress.Lines, nil, 10*time.Millisecond)})
		ran <- result{rep, err}
	}()
	periodic := regexp.MustCompile(`msg="backfill progress" aggregate=daily_sales run=1 done=[1-5] total=6 unit=chunks rate="[0-9.]+ chunks/s" eta=\S+ elapsed=\S+\n`)
	// Whether a periodic line came while the last chunk was held is checked below.
	_ = waitfor.Poll(10*time.Second, func() bool { return periodic.MatchString(logs.String()) })
	unlock()
	res := <-ran
	if rep, err := res.rep, res.err; err != nil || rep.Done != 5 || len(rep.Failed) != 1 {
		t.Fatalf("first run: %v, %+v", err, rep)
	}
	text := logs.String()
	if !periodic.MatchString(text) {
		t.Errorf("no periodic progress line while chunks were rebuilt:\n%s", text)
	}
	final := regexp.MustCompile(`msg="backfill progress" aggregate=daily_sales run=1 done=6 total=6 .*finished=true`)
	if !final.MatchString(text) {
		t.Errorf("no last progress line with all 6 chunks done:\n%s", text)
	}
	if i, j := strings.LastIndex(text, `msg="chunk `), final.FindStringIndex(text); j == nil || i > j[0] {
		t.Errorf("the last progress line is not the last word of the run:\n%s", text)
	}

	var bar bytes.Buffer
	w.exec(`CREATE OR REPLACE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
	rep, err := w.backfill("2026-09-01", "2026-09-06", backfill.Options{Reprocess: backfill.Completed, Concurrency: 2,
		Progress: progress.New(progress.Bar, &bar, 0)})
	if err != nil || rep.Done != 6 {
		t.Fatalf("second run: %v, %+v", err, rep)
	}
	if !regexp.MustCompile(`backfill +\d+% \|[^|]*\| \([1-5]/6, \d+ chunks/(s|min|hr)\) \[\d\S*:\d\S*\]`).MatchString(bar.String()) {
		t.Errorf("no bar drawn with a rate and time left: %q", bar.String())
	}
	if !regexp.MustCompile(`backfill 100% \|[^|]*\| \(6/6, \d+ chunks/(s|min|hr)\) \[\d\S*\]\n$`).MatchString(bar.String()) {
		t.Errorf("the bar did not end complete, with the time taken: %q", bar.String())
	}

	logs = syncbuf.Buffer{}
	if _, err := w.backfill("2026-09-01", "2026-09-02", backfill.Options{Reprocess: backfill.Completed,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "progress") {
		t.Errorf("a run without a display logged progress:\n%s", logs.String())
	}
}
