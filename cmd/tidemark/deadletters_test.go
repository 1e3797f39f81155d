package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
)

// TestDeadLettersCommand: records too old for max_age become dead
// letters; after max_age is widened, `dead-letters replay` loads them (a
// dry run first writes nothing), `dead-letters list` and `status` show
// them replayed, and `reconcile --once` counts them in the aggregate. Bad
// flags and sources exit 2, naming the flag.
func TestDeadLettersCommand(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 1, "events")
	config := func(name, maxAge string) string {
		return writeFile(t, name, fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: [%q], group: dead-letters-test, session_timeout: 1s}
ingest: {batch_max_age: 10ms}
sources:
  app_events:
    kafka: {topics: [events]}
    event_id: /event_id
    event_time: /event_time
    max_age: %s
  sales:
    table: {name: sales, key: [id], event_time: at, ingested_at: loaded}
aggregates:
  daily:
    source: app_events
    table: daily
    partition: {by: day, column: day}
    lateness_horizon: 30d
    sql: SELECT {{partition}} AS day, count(*) AS n FROM {{events}} GROUP BY 1
`, dsn, kc.ListenAddrs()[0], maxAge))
	}
	narrow, wide := config("narrow.yaml", "1d"), config("wide.yaml", "30d")
	old := serviceClock
	t.Cleanup(func() { serviceClock = old })
	serviceClock = func() time.Time { return time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC) }

	var recs []*kgo.Record
	// e2 is sent twice: its dead letters load once.
	for _, ev := range [][2]string{{"e0", "05"}, {"e1", "05"}, {"e2", "02"}, {"e2", "02"}, {"e3", "02"}, {"e4", "01"}} {
		recs = append(recs, &kgo.Record{Topic: "events",
			Value: fmt.Appendf(nil, `{"event_id":%q,"event_time":"2026-10-%sT10:00:00Z"}`, ev[0], ev[1])})
	}
	recs = append(recs, &kgo.Record{Topic: "events", Value: []byte(`{"event_time":"2026-10-05T10:00:00Z"}`)})
	kafkatest.Produce(t, kafkatest.Producer(t, kc), recs...)
	ingestUntil(t, narrow, pool, "dead-letters-test", "events", map[int32]int64{0: int64(len(recs))})

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // a regular expression the output must match
	}{
		{"no subcommand", []string{"dead-letters", "-c", wide}, exitUsage, "list or replay"},
		{"unknown subcommand", []string{"dead-letters", "redo", "-c", wide}, exitUsage, `unknown subcommand "redo"`},
		{"help", []string{"dead-letters", "-h"}, exitOK, "Usage of tidemark dead-letters:"},
		{"list of an unknown source", []string{"dead-letters", "list", "-c", wide, "--source", "nope"}, exitUsage,
			`--source: "nope" is not a configured source \(configured: app_events, sales\)`},
		{"list with a replay flag", []string{"dead-letters", "list", "-c", wide, "--dry-run"}, exitUsage, "--dry-run applies to replay only"},
		{"replay without a source", []string{"dead-letters", "replay", "-c", wide}, exitUsage, "--source is required"},
		{"unknown source", []string{"dead-letters", "replay", "-c", wide, "--source", "nope"}, exitUsage,
			`--source: "nope" is not a Kafka source \(configured: app_events\)`},
		{"not a Kafka source", []string{"dead-letters", "replay", "-c", wide, "--source", "sales"}, exitUsage, `--source: "sales" is not a Kafka source \(configured: app_events\)`},
		{"unknown reason", []string{"dead-letters", "replay", "-c", wide, "--source", "app_events", "--reason", "late"}, exitUsage,
			`--reason: "late" is not a dead-letter reason`},
		{"bad since", []string{"dead-letters", "replay", "-c", wide, "--source", "app_events", "--since", "monday"}, exitUsage,
			`--since: "monday" is neither`},
		{"list before", []string{"dead-letters", "list", "-c", wide}, exitOK,
			`app_events +missing_id +1 +0 .*\napp_events +time_out_of_range +4 +0 +2026-`},
		{"dry run", []string{"dead-letters", "replay", "-c", wide, "--source", "app_events", "--since", "1h", "--dry-run"}, exitOK,
			`app_events: read 5 dead letters not yet replayed \(dry run: nothing written\)\n +would load +3 +event times 2026-10-01T10:00:00Z to 2026-10-02T10:00:00Z\n +already stored +1\n +still failing +1 +missing_id 1`},
		{"replay", []string{"dead-letters", "replay", "-c", wide, "--source", "app_events", "--since", "2026-10-05T00:00:00Z"}, exitOK,
			`loaded +3 +event times 2026-10-01T10:00:00Z to 2026-10-02T10:00:00Z\n +already stored +1\n +still failing +1 +missing_id 1`},
		{"replay again", []string{"dead-letters", "replay", "-c", wide, "--source", "app_events"}, exitOK,
			`app_events: read 1 dead letters not yet replayed\n +loaded +0\n`},
		{"list after", []string{"dead-letters", "list", "-c", wide, "--source", "app_events"}, exitOK,
			`app_events +time_out_of_range +0 +4 `},
		{"status", []string{"status", "-c", wide}, exitOK, `dead letters +5 \(missing_id 1, time_out_of_range 4\), 1 not replayed\n`},
		{"reconcile", []string{"reconcile", "--once", "-c", wide}, exitOK, "daily: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := invoke(t, tc.args...)
			if code != tc.code || !regexp.MustCompile(tc.want).MatchString(out+errOut) {
				t.Errorf("%s: exit %d, want %d with output matching %q:\n%s%s", strings.Join(tc.args, " "), code, tc.code, tc.want, out, errOut)
			}
		})
	}
	if n := ingesttest.Scalar(t, pool, "SELECT count(*) FROM raw.app_events"); n != 5 {
		t.Errorf("raw.app_events holds %d events, want 5", n)
	}
	ingesttest.AssertLedger(t, pool, "app_events")
	if n := ingesttest.Scalar(t, pool, "SELECT coalesce(sum(n), 0)::bigint FROM daily WHERE day < '2026-10-05'"); n != 3 {
		t.Errorf("the aggregate counts %d replayed events, want 3", n)
	}
}
