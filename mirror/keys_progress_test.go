package mirror_test

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/internal/progress"
	"github.com/tidemark-dev/tidemark/internal/testkit/syncbuf"
	"github.com/tidemark-dev/tidemark/mirror"
)

// TestKeysProgress: a key reconciliation counts the first level's key
// ranges as it resolves them. In lines mode its logger gets "keys
// progress" lines while differing ranges are listed and one at the end
// with every range; in bar mode the bar shows the ranges with a rate and
// the time left; without a display the run shows nothing of the kind.
func TestKeysProgress(t *testing.T) {
	e := newKeyEnv(t, "", "")
	e.srcExec(customersDDL)
	e.srcExec(`INSERT INTO src_customers SELECT i, 'c' || i, 'free', '2026-10-05 10:00+00' FROM generate_series(1, 8000) AS i`)
	tbl := e.mirror("customers", "src_customers", "dw_customers", []string{"customer_id"}, "soft")
	e.whExec(`INSERT INTO dw_customers (customer_id, email, tier, updated_at, loaded_at)
		SELECT i, 'c' || i, 'free', '2026-10-05 10:00+00', '2026-10-05 11:00+00' FROM generate_series(1, 8000) AS i`)
	// Drift in every range: each is listed and looked up at the source.
	e.srcExec(`DELETE FROM src_customers WHERE customer_id % 50 = 0`)
	run := func(d *progress.Display) string {
		t.Helper()
		var logs syncbuf.Buffer
		k, err := mirror.NewKeyReconciler(tbl, e.srcDSN, e.wh, mirror.KeyOptions{Now: e.clock.Now, Ranges: 16,
			Logger: slog.New(slog.NewTextHandler(&logs, nil)), Progress: d})
		if err != nil {
			t.Fatal(err)
		}
		if rep := e.run(k, true); rep.Deleted != 160 {
			t.Fatalf("%d keys missing at the source, want 160", rep.Deleted)
		}
		return logs.String()
	}

	text := run(progress.New(progress.Lines, nil, time.Millisecond))
	total := regexp.MustCompile(`msg="keys progress" .*done=(\d+) total=(\d+) unit=ranges .*finished=true`).FindStringSubmatch(text)
	if total == nil || total[1] != total[2] || total[1] == "1" {
		t.Fatalf("no last progress line with every one of several ranges:\n%s", text)
	}
	if !regexp.MustCompile(`msg="keys progress" .*done=[1-9]\d* total=` + total[2] + ` unit=ranges rate="[0-9.]+ ranges/s" eta=\S+ elapsed=\S+\n`).MatchString(text) {
		t.Errorf("no periodic progress line while ranges were resolved:\n%s", text)
	}
	if strings.ContainsAny(text, "\r\x1b") {
		t.Errorf("lines mode wrote terminal control characters: %q", text)
	}

	var bar bytes.Buffer
	run(progress.New(progress.Bar, &bar, 0))
	if !regexp.MustCompile(`keys +\d+% \|[^|]*\| \(\d+/` + total[2] + `, \d+ ranges/(s|min|hr)\) \[\d\S*:\d\S*\]`).MatchString(bar.String()) {
		t.Errorf("no bar with the ranges, a rate and the time left: %q", bar.String())
	}
	if !strings.Contains(bar.String(), "100%") {
		t.Errorf("the bar did not complete: %q", bar.String())
	}

	if text := run(nil); strings.Contains(text, "progress") {
		t.Errorf("a run without a display logged progress:\n%s", text)
	}
}
