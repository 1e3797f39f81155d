package ingest_test

import (
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/ingest"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/internal/syncbuf"
)

// TestPollFirstLoadProgress: a poll source's first load (no watermark
// yet) logs "poll first load progress" lines in rows against the source
// table's estimated size, every interval and at the end, never with
// terminal control characters; later runs log none. Without a display, a
// poller logs them through its logger every progress.DefaultEvery and at
// the end, as the poll component of `tidemark run` does, unless
// TIDEMARK_PROGRESS is off.
func TestPollFirstLoadProgress(t *testing.T) {
	t.Setenv(progress.Env, "")
	e := newPollEnv(t, customersDDL)
	e.srcExec(`INSERT INTO src_customers SELECT i, 'c' || i || '@example.com', 'free',
		timestamptz '2026-10-05 09:00+00' + i * interval '1 second' FROM generate_series(1, 3000) AS i; ANALYZE src_customers`)
	poller := func(d *progress.Display) (*ingest.Poller, *syncbuf.Buffer) {
		var logs syncbuf.Buffer
		p, err := ingest.NewPoller(e.config("chunk_rows: 100"), "customers", e.wh, ingest.PollOptions{Now: e.clock.Now,
			Logger: slog.New(slog.NewTextHandler(&logs, nil)), Progress: d})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p, &logs
	}
	final := regexp.MustCompile(`msg="poll first load progress" source=customers done=3000 total=3000 unit=rows .*finished=true`)

	p, logs := poller(progress.New(progress.Lines, nil, 2*time.Millisecond))
	if rep := e.run(p, "2026-10-05 12:00", nil); rep.Read != 3000 {
		t.Fatalf("first load read %d rows, want 3000", rep.Read)
	}
	text := logs.String()
	if !regexp.MustCompile(`msg="poll first load progress" source=customers done=\d+ total=3000 unit=rows rate="[0-9.]+ rows/s" eta=\S+ elapsed=\S+\n`).MatchString(text) {
		t.Errorf("no periodic progress line against the estimated 3000 rows:\n%s", text)
	}
	if !final.MatchString(text) {
		t.Errorf("no last progress line with every row:\n%s", text)
	}
	if strings.ContainsAny(text, "\r\x1b") {
		t.Errorf("the poller's log holds terminal control characters: %q", text)
	}
	e.srcExec(`UPDATE src_customers SET tier = 'pro', updated_at = updated_at + interval '1 hour' WHERE customer_id <= 10`)
	e.run(p, "2026-10-05 12:00", nil)
	if after := strings.TrimPrefix(logs.String(), text); strings.Contains(after, "progress") {
		t.Errorf("a run after the first load logged progress:\n%s", after)
	}

	// A source without a watermark again: the service's default display.
	e.int(`WITH d AS (DELETE FROM tidemark.poll_watermarks RETURNING 1) SELECT count(*) FROM d`)
	p, logs = poller(nil)
	e.run(p, "2026-10-05 12:00", nil)
	if !final.MatchString(logs.String()) {
		t.Errorf("a poller without a display logged no progress of its first load:\n%s", logs.String())
	}
	t.Setenv(progress.Env, "off")
	e.int(`WITH d AS (DELETE FROM tidemark.poll_watermarks RETURNING 1) SELECT count(*) FROM d`)
	p, logs = poller(nil)
	e.run(p, "2026-10-05 12:00", nil)
	if strings.Contains(logs.String(), "progress") {
		t.Errorf("%s=off: the first load logged progress:\n%s", progress.Env, logs.String())
	}
}
