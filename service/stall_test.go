package service_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/service"
)

// TestReadyzNamesStalledSource: while the warehouse refuses a source's
// writes (a Debezium source without schemas whose mirror does not exist),
// /readyz fails a check named after the source that says what to do, and
// the status page names it; once the mirror exists, both clear.
func TestReadyzNamesStalledSource(t *testing.T) {
	kc := kafkatest.NewCluster(t, 1, "customers")
	kafkatest.Produce(t, kafkatest.Producer(t, kc), &kgo.Record{Topic: "customers", Key: []byte(`{"id": 1}`),
		Value: []byte(`{"op": "c", "after": {"id": 1, "name": "a"}, "source": {"connector": "postgresql", "ts_ms": 1759658400000, "lsn": 24023128, "txId": 7}}`)})
	dsn := pgtest.NewDatabase(t)
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "127.0.0.1:0"}
kafka: {brokers: [%q], group: stall-test, session_timeout: 1s}
sources:
  customers:
    kafka: {topics: [customers]}
    format: debezium
    mirror: {table: public.customers}
`, dsn, kc.ListenAddrs()[0])), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := runService(t, cfg, service.Options{Now: func() time.Time { return testNow }})
	var code int
	var checks map[string]string
	if waitfor.Poll(waitfor.Timeout, func() bool {
		code, checks = readyz(t, addr)
		return code == http.StatusServiceUnavailable && strings.Contains(checks["source customers"], "create it with the source table's columns")
	}) != nil {
		t.Fatalf("/readyz = %d %v while the source's mirror is missing", code, checks)
	}
	t.Logf("/readyz source customers: %s", checks["source customers"])
	if page := get(t, "http://"+addr+"/"); !strings.Contains(page, `data-stalled="customers"`) || !strings.Contains(page, "sources.customers.mirror.table") {
		t.Errorf("the status page does not name the stalled source")
	}
	if _, err := pgtest.Pool(t, dsn).Exec(context.Background(), `CREATE TABLE public.customers (id integer PRIMARY KEY, name text)`); err != nil {
		t.Fatal(err)
	}
	if waitfor.Poll(waitfor.Timeout, func() bool {
		code, checks = readyz(t, addr)
		_, stalled := checks["source customers"]
		return code == http.StatusOK && !stalled
	}) != nil {
		t.Fatalf("/readyz = %d %v after the mirror was created", code, checks)
	}
}
