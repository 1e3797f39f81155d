package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// TestReplayDuringRegistryOutage: `dead-letters replay` of an Avro
// source while the schema registry does not answer says that the
// registry is down, where and why, and that nothing was changed (or, when
// it stopped answering after a first chunk, what that chunk did), exits
// 1, and leaves the dead letters to a later replay, which loads them.
func TestReplayDuringRegistryOutage(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	kc := kafkatest.NewCluster(t, 1, "events")
	g := srtest.New(t)
	cfg := writeFile(t, "avro.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: [%q], group: replay-registry-test, session_timeout: 1s}
schema_registry: {url: %q, timeout: 300ms}
ingest: {batch_max_age: 10ms}
sources:
  app_events:
    kafka: {topics: [events]}
    format: avro
    event_id: /event_id
    event_time: /event_time
    max_age: 30d
`, dsn, kc.ListenAddrs()[0], g.URL()))
	old := serviceClock
	t.Cleanup(func() { serviceClock = old })
	serviceClock = func() time.Time { return time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC) }

	// The records name schema ids the registry does not hold yet: they
	// become unknown_schema dead letters, 1,000 (one replay chunk) of
	// the first id, then 3 of the second.
	const schema = `{"type":"record","name":"E","fields":[{"name":"event_id","type":"string"},{"name":"event_time","type":"string"}]}`
	const first, second = 40, 41
	var recs []*kgo.Record
	for i := range 1003 {
		id := first
		if i >= 1000 {
			id = second
		}
		recs = append(recs, &kgo.Record{Topic: "events", Value: srtest.AvroEncoder(t, id, schema)(map[string]any{
			"event_id": fmt.Sprintf("e%d", i), "event_time": "2026-10-05T10:00:00Z"})})
	}
	kafkatest.Produce(t, kafkatest.Producer(t, kc), recs...)
	ingestUntil(t, cfg, pool, "replay-registry-test", "events", map[int32]int64{0: int64(len(recs))})
	notReplayed := func() int64 {
		return ingesttest.Scalar(t, pool, "SELECT count(*) FROM tidemark.dead_letters WHERE replayed_at IS NULL")
	}
	if n := notReplayed(); n != int64(len(recs)) {
		t.Fatalf("%d dead letters, want %d", n, len(recs))
	}
	g.RegisterAs("events-value", first, sr.Schema{Schema: schema})
	g.RegisterAs("events-value", second, sr.Schema{Schema: schema})

	replay := func(t *testing.T, extra ...string) (int, string, string) {
		t.Helper()
		return invoke(t, append([]string{"dead-letters", "replay", "-c", cfg, "--source", "app_events"}, extra...)...)
	}
	steps := []struct {
		name        string
		fail        func()
		args        []string
		code        int
		stdout      []string // "" for none
		stderr      []string
		notReplayed int64
	}{
		{"registry down", func() { g.Fail(http.StatusServiceUnavailable, "down for maintenance") }, nil, exitFailure, nil,
			[]string{
				"tidemark dead-letters replay: the schema registry at " + g.URL() + " is unavailable: ",
				fmt.Sprintf("schema id %d: HTTP 503 from %s/schemas/ids/%d: down for maintenance", first, g.URL(), first),
				"tidemark dead-letters replay: nothing was changed: the dead letters of app_events stay as they were; replay again once the registry answers",
			}, 1003},
		{"credentials refused", func() { g.Fail(http.StatusUnauthorized, `{"error_code":40101,"message":"Unauthorized"}`) }, nil, exitFailure, nil,
			[]string{
				"the schema registry at " + g.URL() + " refused the credentials: ",
				"no credentials are configured: set schema_registry.basic or schema_registry.bearer",
				"nothing was changed",
			}, 1003},
		{"dry run, down after a chunk", func() { g.Answer(second, http.StatusBadGateway, "<html>bad gateway</html>") }, []string{"--dry-run"}, exitFailure,
			[]string{"app_events: read 1000 dead letters not yet replayed (dry run: nothing written)", "would load 1000"},
			[]string{
				fmt.Sprintf("is unavailable: schema id %d: HTTP 502", second),
				"the counts above are of the 1000 dead letters read before the registry stopped answering (dry run: nothing written)",
			}, 1003},
		{"down after a chunk", func() { g.Answer(second, http.StatusBadGateway, "<html>bad gateway</html>") }, nil, exitFailure,
			[]string{"app_events: read 1000 dead letters not yet replayed", "loaded 1000"},
			[]string{
				fmt.Sprintf("is unavailable: schema id %d: HTTP 502", second),
				"the counts above are of the 1000 dead letters replayed before the registry stopped answering; the others are unchanged",
			}, 3},
		{"registry back", func() {}, nil, exitOK, []string{"app_events: read 3 dead letters not yet replayed", "loaded 3"}, nil, 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.fail()
			defer g.Heal()
			code, stdout, stderr := replay(t, st.args...)
			if code != st.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, st.code, stdout, stderr)
			}
			if st.stdout == nil && stdout != "" {
				t.Errorf("stdout:\n%s\nwant nothing", stdout)
			}
			compact := strings.Join(strings.Fields(stdout), " ") // the columns' padding aside
			for _, want := range st.stdout {
				if !strings.Contains(compact, want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout)
				}
			}
			for _, want := range st.stderr {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr)
				}
			}
			if n := notReplayed(); n != st.notReplayed {
				t.Errorf("%d dead letters not replayed, want %d", n, st.notReplayed)
			}
		})
	}
	if n := ingesttest.Scalar(t, pool, "SELECT count(*) FROM raw.app_events"); n != int64(len(recs)) {
		t.Errorf("%d rows stored, want %d", n, len(recs))
	}
}
