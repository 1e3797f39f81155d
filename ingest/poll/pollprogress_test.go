package poll_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/ingest/poll"
	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
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
	poller := func(d *progress.Display) (*poll.Poller, *syncbuf.Buffer) {
		var logs syncbuf.Buffer
		p, err := poll.New(pollConfig(t, e.config("chunk_rows: 100"), "customers"), e.wh, poll.Options{Now: e.clock.Now,
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

// TestPollFirstLoadWithoutEstimate: a source role that may read its table
// but not the statistics views (an administrator revoked pg_stat_all_tables
// from PUBLIC) cannot estimate the table's size; the first load still
// loads every row, its progress counts them against an unknown total (its
// last line takes the count as the total), and the poller warns
// about the estimate once, not at every first load.
func TestPollFirstLoadWithoutEstimate(t *testing.T) {
	t.Setenv(progress.Env, "")
	e := newPollEnv(t, customersDDL)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "poll_role_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := e.src.Exec(ctx, `DROP OWNED BY `+role+`; DROP ROLE `+role); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	e.srcExec(`INSERT INTO src_customers SELECT i, 'c' || i || '@example.com', 'free',
		timestamptz '2026-10-05 09:00+00' + i * interval '1 second' FROM generate_series(1, 3000) AS i; ANALYZE src_customers`)
	e.srcExec(`CREATE ROLE ` + role + ` LOGIN; GRANT SELECT ON src_customers TO ` + role +
		`; REVOKE SELECT ON pg_catalog.pg_stat_all_tables FROM PUBLIC`)
	u, err := url.Parse(e.srcDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	e.srcDSN = u.String()

	var logs syncbuf.Buffer
	p, err := poll.New(pollConfig(t, e.config("chunk_rows: 100"), "customers"), e.wh, poll.Options{Now: e.clock.Now,
		Logger:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Progress: progress.New(progress.Lines, nil, time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	for range 2 {
		if rep := e.run(p, "2026-10-05 12:00", nil); rep.Read != 3000 {
			t.Fatalf("first load read %d rows, want 3000", rep.Read)
		}
		e.int(`WITH d AS (DELETE FROM tidemark.poll_watermarks RETURNING 1) SELECT count(*) FROM d`)
	}
	text := logs.String()
	final := regexp.MustCompile(`msg="poll first load progress" source=customers done=3000 total=3000 unit=rows .*finished=true`)
	if n := len(final.FindAllString(text, -1)); n != 2 {
		t.Errorf("%d last progress lines with every row, want one per first load:\n%s", n, text)
	}
	warn := regexp.MustCompile(`msg="[^"]*estimate[^"]*" source=customers .*pg_stat_all_tables`)
	if n := len(warn.FindAllString(text, -1)); n != 1 {
		t.Errorf("%d lines about the failed estimate, want 1:\n%s", n, text)
	}
}
