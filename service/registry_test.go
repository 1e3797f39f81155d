package service_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/service"
)

// TestReadyzNamesRegistryOutage: while the schema registry of an Avro
// source does not answer, /readyz fails its schema_registry check saying
// since when, and the status page names it; once it answers, both clear.
func TestReadyzNamesRegistryOutage(t *testing.T) {
	g := srtest.New(t)
	const schema = `{"type":"record","name":"E","fields":[{"name":"id","type":"string"},{"name":"ts","type":"string"}]}`
	id := g.Register("events-value", sr.Schema{Schema: schema})
	kc := kafkatest.NewCluster(t, 1, "events")
	kafkatest.Produce(t, kafkatest.Producer(t, kc), &kgo.Record{Topic: "events",
		Value: srtest.AvroEncoder(t, id, schema)(map[string]any{"id": "e-1", "ts": testNow.Add(-time.Minute).Format(time.RFC3339)})})
	g.Fail(http.StatusBadGateway, "<html>bad gateway</html>")
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "127.0.0.1:0"}
kafka: {brokers: [%q], group: registry-test, session_timeout: 1s}
schema_registry: {url: %q, timeout: 500ms}
sources:
  app_events:
    kafka: {topics: [events]}
    format: avro
    event_id: /id
    event_time: /ts
`, pgtest.NewDatabase(t), kc.ListenAddrs()[0], g.URL())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := runService(t, cfg, service.Options{Now: func() time.Time { return testNow }})
	var code int
	var checks map[string]string
	if waitfor.Poll(waitfor.Timeout, func() bool {
		code, checks = readyz(t, addr)
		return code == http.StatusServiceUnavailable && strings.HasPrefix(checks["schema_registry"], "schema registry unreachable since ")
	}) != nil {
		t.Fatalf("/readyz = %d %v during the outage", code, checks)
	}
	t.Logf("/readyz schema_registry: %s", checks["schema_registry"])
	if page := get(t, "http://"+addr+"/"); !strings.Contains(page, `id="schema-registry"`) || !strings.Contains(page, "HTTP 502") {
		t.Errorf("the status page does not name the outage")
	}
	g.Heal()
	if waitfor.Poll(waitfor.Timeout, func() bool {
		code, checks = readyz(t, addr)
		return code == http.StatusOK && checks["schema_registry"] == "ok"
	}) != nil {
		t.Fatalf("/readyz = %d %v after the outage", code, checks)
	}
}

// get returns the body of a GET of url.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
