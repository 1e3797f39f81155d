package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/lateness"
	"github.com/tidemark-dev/tidemark/migrate"
)

// TestLatenessCommand runs `tidemark lateness` over a table source with
// known delays: the text names the quantiles and the recommended
// horizon, --json carries the numbers that direct SQL computes, and bad
// flags are usage errors naming the flag.
func TestLatenessCommand(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, dsn, nil); err != nil {
		t.Fatal(err)
	}
	// 100 sales on 2 October, the i-th arriving i hours after the day's
	// end (sale 0 at the end itself).
	if _, err := pool.Exec(ctx, `CREATE TABLE sales (id int PRIMARY KEY, at timestamptz NOT NULL, loaded timestamptz NOT NULL);
		INSERT INTO sales SELECT i, timestamptz '2026-10-02 12:00+00', timestamptz '2026-10-03 00:00+00' + i * interval '1 hour'
		FROM generate_series(0, 99) i`); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
sources:
  sales:
    table: {name: sales, key: [id], event_time: at, ingested_at: loaded}
aggregates:
  daily:
    source: sales
    table: daily
    partition: {by: day, column: day}
    lateness_horizon: 72h
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
`, dsn))
	args := []string{"lateness", "-c", cfg, "--source", "sales", "--since", "7d", "--until", "2026-10-08T00:00:00Z", "--target", "95%"}
	code, out, errOut := invoke(t, args...)
	if code != exitOK {
		t.Fatalf("lateness: exit %d: %s", code, errOut)
	}
	// 95% of 100 events: the 95th smallest delay after the end, 94 hours;
	// the horizon of 72h keeps sales 0 to 72.
	for _, want := range []string{"100 events; delay of ingestion after the event time:",
		"aggregate daily (day in UTC, lateness_horizon 72h)", "p50 49h", "73% of events (27 beyond it)",
		"smallest horizon keeping 95%  94h (lateness_horizon: 94h)"} {
		if !strings.Contains(out, want) {
			t.Errorf("lateness output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = invoke(t, append(args, "--json")...)
	if code != exitOK {
		t.Fatalf("lateness --json: exit %d: %s", code, errOut)
	}
	var rep lateness.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("lateness --json is not JSON: %v\n%s", err, out)
	}
	var beyond int64
	var p95 float64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE loaded > timestamptz '2026-10-03 00:00+00' + interval '72 hours'),
		percentile_disc(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM loaded - timestamptz '2026-10-03 00:00+00'))::float8 FROM sales`).Scan(&beyond, &p95); err != nil {
		t.Fatal(err)
	}
	if len(rep.Aggregates) != 1 || rep.Aggregates[0].Beyond != beyond || rep.Aggregates[0].Recommended.Seconds() != p95 || rep.Target != 0.95 {
		t.Errorf("lateness --json: %s\nSQL: %d beyond, p95 %vs", out, beyond, p95)
	}

	for _, c := range []struct{ flag, value, want string }{
		{"--target", "120%", "--target: \"120%\" is not a share"},
		{"--target", "abc", "--target: \"abc\" is not a share"},
		{"--since", "-1d", "--since:"},
		{"--until", "yesterday", "--until:"},
		{"--source", "nope", "--source: no source named \"nope\" (configured: sales)"},
	} {
		code, _, errOut := invoke(t, "lateness", "-c", cfg, "--source", "sales", c.flag, c.value)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("lateness %s %s: exit %d, %q; want exit 2 and %q", c.flag, c.value, code, errOut, c.want)
		}
	}
}
