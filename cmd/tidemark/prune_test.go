package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestPruneDryRunThenPrune is acceptance item 3 of retention: on a
// populated warehouse `tidemark prune --dry-run` prints what it would
// remove and changes nothing, and `tidemark prune` then removes exactly
// that.
func TestPruneDryRunThenPrune(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 1, "events")
	cfg := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: [%q], group: prune-test, session_timeout: 1s}
ingest: {batch_max_age: 10ms}
retention: {ledger: 1d, runs: 1d}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
    retention: {raw: 5d, dead_letters: 2d}
aggregates:
  daily_sales:
    source: app_events
    table: daily_sales
    partition: {by: day, column: sale_date}
    lateness_horizon: 2d
    sql: |
      SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*) AS event_count
      FROM {{events}} GROUP BY 1
`, dsn, kc.ListenAddrs()[0]))
	old := serviceClock
	t.Cleanup(func() { serviceClock = old })
	setClock := func(s string) {
		at, err := time.Parse(time.DateTime, s)
		if err != nil {
			t.Fatal(err)
		}
		serviceClock = func() time.Time { return at }
	}

	// Three days of sales and a bad message, loaded on the 4th.
	setClock("2026-10-04 00:00:00")
	var recs []*kgo.Record
	for i, day := range []string{"01", "01", "02", "03"} {
		recs = append(recs, &kgo.Record{Topic: "events",
			Value: []byte(fmt.Sprintf(`{"event_id":"e%d","event_time":"2026-10-%sT10:00:00Z","amount":%d}`, i, day, 10*(i+1)))})
	}
	recs = append(recs, &kgo.Record{Topic: "events", Value: []byte(`not json`)})
	kafkatest.Produce(t, kafkatest.Producer(t, kc), recs...)
	ingestUntil(t, cfg, pool, "prune-test", "events", map[int32]int64{0: 5})
	if code, _, errOut := invoke(t, "reconcile", "--once", "-c", cfg); code != exitOK {
		t.Fatalf("reconcile --once: %s", errOut)
	}
	sales := pgtest.Lines(t, pool, "SELECT sale_date::text, total::text FROM daily_sales ORDER BY 1")

	// On the 8th at noon, the 1st and the 2nd are final (horizon 2d) and
	// past five days; the 3rd ends on the 4th, less than five days before.
	setClock("2026-10-08 12:00:00")
	if code, _, errOut := invoke(t, "reconcile", "--once", "-c", cfg); code != exitOK {
		t.Fatalf("reconcile --once: %s", errOut)
	}
	state := func() []string {
		var out []string
		for _, q := range []string{
			"SELECT count(*) FROM raw.app_events", "SELECT count(*) FROM tidemark.ingest_ledger",
			"SELECT count(*) FROM tidemark.dead_letters", "SELECT string_agg(partition_key || ' ' || state, ',' ORDER BY partition_key) FROM tidemark.partitions",
		} {
			out = append(out, pgtest.Lines(t, pool, q)...)
		}
		return out
	}
	before := state()
	code, dry, errOut := invoke(t, "prune", "--dry-run", "-c", cfg)
	if code != exitOK {
		t.Fatalf("prune --dry-run: exit %d: %s", code, errOut)
	}
	pgtest.Equal(t, "state after prune --dry-run", state(), before)
	for _, want := range []string{"(dry run: nothing changed)", "raw.app_events: would remove 2 partitions, 2026-10-01 .. 2026-10-02",
		"aggregate daily_sales: 2 partitions archived"} {
		if !strings.Contains(dry, want) {
			t.Errorf("prune --dry-run lacks %q:\n%s", want, dry)
		}
	}
	code, out, errOut := invoke(t, "prune", "-c", cfg)
	if code != exitOK {
		t.Fatalf("prune: exit %d: %s", code, errOut)
	}
	if got, want := tableLines(out), tableLines(dry); strings.Join(got, "\n") != strings.Join(want, "\n") || len(got) != 3 {
		t.Errorf("prune removed other than the dry run said:\n%s\n--- dry run:\n%s", out, dry)
	}
	for _, want := range []string{"raw.app_events  3  2", "tidemark.ingest_ledger  3  0", "tidemark.dead_letters  1  0"} {
		if !strings.Contains(strings.Join(tableLines(out), "\n"), want) {
			t.Errorf("prune output lacks %q:\n%s", want, out)
		}
	}
	pgtest.Equal(t, "state after prune", state(), []string{"1", "0", "0", "2026-10-01 archived,2026-10-02 archived,2026-10-03 final"})
	pgtest.Equal(t, "daily_sales after prune", pgtest.Lines(t, pool, "SELECT sale_date::text, total::text FROM daily_sales ORDER BY 1"), sales)

	code, out, _ = invoke(t, "prune", "-c", cfg)
	if code != exitOK || !strings.Contains(out, "nothing to remove") {
		t.Errorf("second prune: exit %d:\n%s", code, out)
	}

	// A shadow built over the archived days with --force prints a publish
	// command that works: it needs --force too. Two days later (past
	// retention.ledger) the build is refused, and the hint is a new shadow.
	shadowArgs := []string{"backfill", "-c", cfg, "--aggregate", "daily_sales", "--from", "2026-10-01", "--to", "2026-10-03", "--shadow", "--force"}
	code, out, errOut = invoke(t, shadowArgs...)
	printed := "tidemark backfill --aggregate daily_sales --from 2026-10-01 --to 2026-10-03 --publish --force"
	if code != exitOK || !strings.Contains(out, printed) || !strings.Contains(out, "2 archived partitions were built from the raw rows retention left") {
		t.Fatalf("shadow --force over archived days: exit %d:\n%s%s", code, out, errOut)
	}
	publish := append(strings.Fields(strings.TrimPrefix(printed, "tidemark ")), "-c", cfg)
	unforced := slices.DeleteFunc(slices.Clone(publish), func(a string) bool { return a == "--force" })
	if code, _, errOut = invoke(t, unforced...); code != exitFailure || !strings.Contains(errOut, "add --force") {
		t.Errorf("publish without --force: exit %d: %s", code, errOut)
	}
	setClock("2026-10-10 12:00:00")
	if code, _, errOut = invoke(t, publish...); code != exitFailure || !strings.Contains(errOut, "built longer ago than retention.ledger") ||
		!strings.Contains(errOut, "--from 2026-10-01 --to 2026-10-03 --shadow") {
		t.Errorf("publish of a build older than the ledger: exit %d: %s", code, errOut)
	}
	setClock("2026-10-08 12:00:00")
	if code, out, errOut = invoke(t, publish...); code != exitOK || !strings.Contains(out, "3 chunks published") {
		t.Errorf("the printed publish: exit %d:\n%s%s", code, out, errOut)
	}
}

// tableLines are the rows of prune's table, with runs of blanks made
// one and the bytes column left out (row sizes are estimates).
func tableLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 4 && (strings.HasPrefix(f[0], "raw.") || strings.HasPrefix(f[0], "tidemark.")) {
			lines = append(lines, strings.Join(f[:3], "  "))
		}
	}
	return lines
}
