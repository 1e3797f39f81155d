package cdc_test

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidemark-dev/tidemark/cdc"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
)

// TestSnapshotProgress: the initial snapshot, run by a reader as inside
// `tidemark run`, logs plain "snapshot progress" lines through the
// reader's logger while it copies (done, total planned chunks, rate, time
// left) and a last one with every planned chunk done; never a bar.
func TestSnapshotProgress(t *testing.T) {
	defer cdc.SetSnapshotProgressEvery(5 * time.Millisecond)()
	e := newCDCEnv(t)
	e.exec(`INSERT INTO orders SELECT i, 1, i % 997, timestamptz '2026-10-01 00:00+00' + i * interval '1 second' FROM generate_series(1, 20000) AS i;
		ANALYZE orders`)
	var logs syncbuf.Buffer
	r, err := cdc.New(shopConfig(t, e.config("snapshot_workers: 2\nsnapshot_chunk_rows: 1000", "")), e.readers,
		cdc.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	}()
	if err := waitfor.Poll(waitfor.Timeout, func() bool { return strings.Contains(logs.String(), `msg="snapshot copied"`) }); err != nil {
		t.Fatalf("the snapshot did not finish:\n%s", logs.String())
	}
	text := logs.String()
	planned := regexp.MustCompile(`msg="snapshot planned" .*chunks=(\d+)`).FindStringSubmatch(text)
	if planned == nil || planned[1] == "1" {
		t.Fatalf("no snapshot of several chunks planned:\n%s", text)
	}
	total := planned[1]
	if !regexp.MustCompile(`msg="snapshot progress" .*done=\d+ total=` + total + ` unit=chunks rate="[0-9.]+ chunks/s" eta=\S+ elapsed=\S+\n`).MatchString(text) {
		t.Errorf("no periodic progress line against the %s planned chunks:\n%s", total, text)
	}
	if !regexp.MustCompile(`msg="snapshot progress" .*done=` + total + ` total=` + total + ` .*finished=true`).MatchString(text) {
		t.Errorf("no last progress line with all %s chunks done:\n%s", total, text)
	}
	if strings.ContainsAny(text, "\r\x1b") {
		t.Errorf("the reader's log holds terminal control characters: %q", text)
	}
}
