package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestForgetReleasesRetention: an aggregate removed from the
// configuration still has what it needs kept by retention (it has not
// read the loads since it left); `tidemark forget` removes its state,
// after which prune drops what it held. forget refuses an aggregate that
// is configured, reconciled within the hour, or unknown.
func TestForgetReleasesRetention(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 1, "events")
	config := func(name string, aggregates ...string) string {
		var aggs strings.Builder
		for _, a := range aggregates {
			fmt.Fprintf(&aggs, `
  %s:
    source: app_events
    table: %s
    partition: {by: day, column: sale_date}
    lateness_horizon: 2d
    sql: SELECT {{partition}} AS sale_date, count(*) AS n FROM {{events}} GROUP BY 1
`, a, a)
		}
		return writeFile(t, name, fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: [%q], group: forget-test, session_timeout: 1s}
ingest: {batch_max_age: 10ms}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
    retention: {raw: 5d}
aggregates:%s`, dsn, kc.ListenAddrs()[0], aggs.String()))
	}
	both, alone := config("both.yaml", "daily_sales", "old_sales"), config("alone.yaml", "daily_sales")
	old := serviceClock
	t.Cleanup(func() { serviceClock = old })
	setClock := func(s string) {
		at, err := time.Parse(time.DateTime, s)
		if err != nil {
			t.Fatal(err)
		}
		serviceClock = func() time.Time { return at }
	}
	produce := func(cfg string, offset int64, days ...string) {
		t.Helper()
		var recs []*kgo.Record
		for i, day := range days {
			recs = append(recs, &kgo.Record{Topic: "events",
				Value: []byte(fmt.Sprintf(`{"event_id":"e%d","event_time":"2026-10-%sT10:00:00Z"}`, int(offset)+i, day))})
		}
		kafkatest.Produce(t, kafkatest.Producer(t, kc), recs...)
		ingestUntil(t, cfg, pool, "forget-test", "events", map[int32]int64{0: offset + int64(len(days))})
	}
	expect := func(wantCode int, want string, args ...string) string {
		t.Helper()
		code, out, errOut := invoke(t, args...)
		if code != wantCode || !strings.Contains(out+errOut, want) {
			t.Errorf("%v: exit %d, want %d with %q:\n%s%s", args, code, wantCode, want, out, errOut)
		}
		return out
	}

	setClock("2026-10-04 00:00:00")
	produce(both, 0, "01", "02", "03")
	expect(exitOK, "", "reconcile", "--once", "-c", both)
	expect(exitFailure, "it was reconciled at 2026-10-04T00:00:00Z, less than 1h0m0s ago", "forget", "-c", alone, "--aggregate", "old_sales")

	// old_sales is gone from the configuration; a late event arrives for
	// the 2nd, which old_sales never reads.
	setClock("2026-10-20 00:00:00")
	produce(alone, 3, "02")
	expect(exitOK, "", "reconcile", "--once", "-c", alone)
	expect(exitOK, "app_events_p20261002 (2026-10-02 .. 2026-10-03) is kept: aggregate old_sales (not in this configuration", "prune", "-c", alone)

	expect(exitOK, "aggregate old_sales (not in this configuration: source app_events, horizon 2d, last run 2026-10-04T00:00:00Z)", "status", "-c", alone)
	expect(exitUsage, "daily_sales is in the configuration", "forget", "-c", alone, "--aggregate", "daily_sales")
	registered := "SELECT string_agg(aggregate, ',' ORDER BY aggregate) FROM tidemark.load_watermarks"
	out := expect(exitOK, "would remove the state of aggregate old_sales", "forget", "-c", alone, "--aggregate", "old_sales", "--dry-run")
	if !strings.Contains(strings.Join(strings.Fields(out), " "), "tidemark.partitions 3") {
		t.Errorf("forget --dry-run does not count old_sales' 3 partitions:\n%s", out)
	}
	pgtest.Equal(t, "after the dry run", pgtest.Lines(t, pool, registered), []string{"daily_sales,old_sales"})
	expect(exitOK, "removed the state of aggregate old_sales", "forget", "-c", alone, "--aggregate", "old_sales")
	pgtest.Equal(t, "after forget", pgtest.Lines(t, pool, registered), []string{"daily_sales"})
	pgtest.Equal(t, "old_sales' partitions", pgtest.Lines(t, pool, "SELECT count(*) FROM tidemark.partitions WHERE aggregate = 'old_sales'"), []string{"0"})
	expect(exitOK, "raw.app_events: removed", "prune", "-c", alone)
	pgtest.Equal(t, "raw rows after forget and prune", pgtest.Lines(t, pool, "SELECT count(*) FROM raw.app_events"), []string{"0"})
	expect(exitFailure, "no aggregate of that name is registered", "forget", "-c", alone, "--aggregate", "old_sales")
	if _, out, _ := invoke(t, "status", "-c", alone); strings.Contains(out, "old_sales") {
		t.Errorf("status still shows old_sales after forget:\n%s", out)
	}
}
