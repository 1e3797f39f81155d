package reconcile_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
	"github.com/tidemark-dev/tidemark/reconcile"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const group = "tidemark-test"

// at parses "2006-01-02 15:04" as UTC.
func at(s string) time.Time {
	t, err := time.Parse("2006-01-02 15:04", s)
	if err != nil {
		panic(err)
	}
	return t
}

// dailySalesSQL is the worked example's aggregate.
const dailySalesSQL = `SELECT {{partition}} AS sale_date, sum((payload->>'amount')::numeric(12,2)) AS total, count(*)::int AS event_count
      FROM {{events}} GROUP BY 1`

type bundle struct {
	t        *testing.T
	dsn      string
	pool     *pgxpool.Pool
	kafka    *kfake.Cluster
	producer *kgo.Client
	clock    *clock.Settable
	end      map[int32]int64
	cfg      *config.Config
}

// aggregateYAML configures one aggregate over app_events.
type aggregateYAML struct {
	name, table, by, column, zone, horizon, policy, sql string
}

func (a aggregateYAML) String() string {
	return fmt.Sprintf(`
  %s:
    source: app_events
    table: %s
    partition: {by: %s, column: %s, time_zone: %q}
    lateness_horizon: %s
    beyond_horizon: %s
    sql: |
      %s
`, a.name, a.table, a.by, a.column, a.zone, a.horizon, a.policy, a.sql)
}

func dailySales(policy string) aggregateYAML {
	return aggregateYAML{name: "daily_sales", table: "daily_sales", by: "day", column: "sale_date", zone: "UTC",
		horizon: "72h", policy: policy, sql: dailySalesSQL}
}

// setup gives a test a migrated warehouse, a kfake topic app-events with
// parts partitions, and a configuration with the given aggregates.
func setup(t *testing.T, parts int32, aggs ...aggregateYAML) *bundle {
	t.Helper()
	return setupOn(t, pgtest.NewDatabase(t), parts, aggs...)
}

// setupOn is setup on the empty database dsn.
func setupOn(t *testing.T, dsn string, parts int32, aggs ...aggregateYAML) *bundle {
	t.Helper()
	pool := pgtest.Pool(t, dsn)
	if _, err := migrate.Up(context.Background(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	c := kafkatest.NewCluster(t, parts, "app-events")
	b := &bundle{t: t, dsn: dsn, pool: pool, kafka: c, end: map[int32]int64{},
		producer: kafkatest.Producer(t, c, kgo.RecordPartitioner(kgo.ManualPartitioner())),
		clock:    clock.New(at("2026-10-01 00:00"))}
	b.cfg = b.configure(aggs...)
	return b
}

// configure parses a configuration of the bundle's warehouse and broker
// with the given aggregates: another instance's, or this one's after a
// change.
func (b *bundle) configure(aggs ...aggregateYAML) *config.Config {
	b.t.Helper()
	var specs strings.Builder
	for _, a := range aggs {
		specs.WriteString(a.String())
	}
	yaml := fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka: {brokers: [%q], group: %s, session_timeout: 1s}
ingest: {batch_max_age: 10ms}
sources:
  app_events:
    kafka: {topics: [app-events]}
    event_id: /event_id
    event_time: /event_time
    max_age: 365d
aggregates:%s
`, b.dsn, b.kafka.ListenAddrs()[0], group, specs.String())
	cfg, err := config.Parse("test.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		b.t.Fatalf("config: %v\n%s", err, yaml)
	}
	return cfg
}

// startIngest runs an ingester on the bundle's clock until the test ends.
func (b *bundle) startIngest() {
	b.t.Helper()
	in, err := kafka.New(kafka.ConfigFrom(b.cfg), kafka.Options{Now: b.clock.Now, Logger: testLogger(b.t)})
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("ingester: %v", err)
		}
	})
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("TIDEMARK_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// event is a sale of amount at the given event time.
func event(part int32, id, eventTime, amount string) *kgo.Record {
	return &kgo.Record{Topic: "app-events", Partition: part, Key: []byte(id),
		Value: []byte(fmt.Sprintf(`{"event_id":%q,"event_time":%q,"amount":%s}`, id, eventTime, amount))}
}

// ingestAt sets the service clock and ingests the records, waiting until
// they are stored.
func (b *bundle) ingestAt(clock string, recs ...*kgo.Record) {
	b.t.Helper()
	b.clock.Set(at(clock))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := b.producer.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		b.t.Fatal(err)
	}
	for _, r := range res {
		b.end[r.Record.Partition] = max(b.end[r.Record.Partition], r.Record.Offset+1)
	}
	ingesttest.WaitStored(b.t, b.pool, group, "app-events", b.end, time.Minute)
}

// reconciler builds a reconciler on the bundle's clock with its own
// registry.
func (b *bundle) reconciler(opts ...func(*reconcile.Options)) (*reconcile.Reconciler, *prometheus.Registry) {
	b.t.Helper()
	reg := prometheus.NewRegistry()
	o := reconcile.Options{Now: b.clock.Now, Registerer: reg, Logger: testLogger(b.t)}
	for _, f := range opts {
		f(&o)
	}
	r, err := reconcile.New(b.cfg, b.pool, o)
	if err != nil {
		b.t.Fatal(err)
	}
	return r, reg
}

// runOnce reconciles an aggregate once, failing the test on error.
func (b *bundle) runOnce(r *reconcile.Reconciler, name string) reconcile.Report {
	b.t.Helper()
	rep, err := r.RunOnce(context.Background(), name, true)
	if err != nil {
		b.t.Fatalf("reconcile %s: %v", name, err)
	}
	return rep
}

// rows returns a query's rows, each formatted as "a | b | c".
func (b *bundle) rows(sql string, args ...any) []string {
	b.t.Helper()
	return pgtest.Lines(b.t, b.pool, sql, args...)
}

// sourceAndWarehouse starts a source database and a migrated warehouse,
// and returns their pools and DSNs and a function running SQL on the
// source.
func sourceAndWarehouse(t *testing.T) (src *pgxpool.Pool, srcDSN string, wh *pgxpool.Pool, whDSN string, exec func(string)) {
	t.Helper()
	src, srcDSN = pgtest.NewPool(t)
	wh, whDSN = pgtest.NewPool(t)
	if _, err := migrate.Up(context.Background(), whDSN, nil); err != nil {
		t.Fatal(err)
	}
	exec = func(sql string) {
		t.Helper()
		if _, err := src.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return src, srcDSN, wh, whDSN, exec
}

// parseConfig parses a test configuration without environment.
func parseConfig(t *testing.T, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("t.yaml", []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
