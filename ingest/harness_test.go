package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest"
	"github.com/tidemark-dev/tidemark/internal/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/pgtest"
	"github.com/tidemark-dev/tidemark/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testNow is the service clock of these tests: event times are generated
// around it, never around today's date.
var testNow = time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)

// clock is a settable service clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

type bundle struct {
	dsn      string
	pool     *pgxpool.Pool
	kafka    *kfake.Cluster
	producer *kgo.Client
	clock    *clock
	topic    string
	parts    int32
	yaml     string // extra source keys
}

// setup gives a test a migrated warehouse database and a kfake cluster
// with one topic, "events", of parts partitions.
func setup(t *testing.T, parts int32) *bundle {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	if _, err := migrate.Up(context.Background(), dsn, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	c := kafkatest.NewCluster(t, parts, "events")
	return &bundle{
		dsn: dsn, pool: pool, kafka: c, topic: "events", parts: parts,
		producer: kafkatest.Producer(t, c, kgo.RecordPartitioner(kgo.ManualPartitioner())),
		clock:    &clock{t: testNow},
	}
}

// configYAML is the configuration the tests run with.
func (b *bundle) configYAML() string {
	return fmt.Sprintf(`
warehouse: {dsn: "%s"}
http: {listen: "off"}
kafka:
  brokers: [%q]
  group: tidemark-test
  session_timeout: 1s
  rebalance_timeout: 5s
ingest:
  batch_max_rows: 5000
  batch_max_age: 50ms
sources:
  app_events:
    kafka: {topics: [%s]}
    event_id: /event_id
    event_time: /event_time
    max_age: 30d
%s`, b.dsn, b.kafka.ListenAddrs()[0], b.topic, b.yaml)
}

func (b *bundle) config(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(b.configYAML()), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// running is an ingester started by a test.
type running struct {
	in     *ingest.Ingester
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// start runs an ingester until the test ends or stop is called.
func (b *bundle) start(t *testing.T, extra ...kgo.Opt) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	in, err := ingest.New(b.config(t), ingest.Options{Logger: log, Registerer: reg, Now: b.clock.Now, KafkaOpts: extra})
	if err != nil {
		t.Fatalf("ingest.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{in: in, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- in.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("ingester Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("ingester did not stop within 60s")
		}
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	if os.Getenv("TIDEMARK_TEST_LOG") != "" {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

// produced tracks what a test sent, to compute the expected outcome.
type produced struct {
	end  map[int32]int64 // next offset per partition
	good map[string]bool // distinct good event ids
}

func (b *bundle) produce(t *testing.T, p *produced, recs []*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results := b.producer.ProduceSync(ctx, recs...)
	if err := results.FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	for _, r := range results {
		if r.Record.Offset+1 > p.end[r.Record.Partition] {
			p.end[r.Record.Partition] = r.Record.Offset + 1
		}
	}
}

// waitStored waits until the stored offsets of the test group reach end.
func (b *bundle) waitStored(t *testing.T, end map[int32]int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		stored := b.storedOffsets(t)
		done := true
		for p, e := range end {
			if stored[p] < e {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored offsets %v did not reach %v within %s", stored, end, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *bundle) storedOffsets(t *testing.T) map[int32]int64 {
	t.Helper()
	rows, err := b.pool.Query(context.Background(),
		"SELECT partition, next_offset FROM tidemark.kafka_offsets WHERE consumer_group = 'tidemark-test' AND topic = $1", b.topic)
	if err != nil {
		t.Fatalf("read offsets: %v", err)
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			t.Fatalf("read offsets: %v", err)
		}
		out[p] = o
	}
	return out
}

// assertRawEquals checks that raw.app_events holds exactly the ids in want,
// each once.
func (b *bundle) assertRawEquals(t *testing.T, want map[string]bool) {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT event_id FROM raw.app_events")
	if err != nil {
		t.Fatalf("read raw: %v", err)
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatalf("read raw: %v", err)
		}
		got[id]++
	}
	var missing, doubled, extra []string
	for id := range want {
		switch got[id] {
		case 0:
			missing = append(missing, id)
		case 1:
		default:
			doubled = append(doubled, id)
		}
	}
	for id := range got {
		if !want[id] {
			extra = append(extra, id)
		}
	}
	if len(missing)+len(doubled)+len(extra) > 0 {
		sort.Strings(missing)
		sort.Strings(doubled)
		sort.Strings(extra)
		t.Fatalf("raw table differs from the produced set: %d missing %v, %d doubled %v, %d unexpected %v",
			len(missing), head(missing), len(doubled), head(doubled), len(extra), head(extra))
	}
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}

func (b *bundle) scalar(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// counterSum adds up every series of a counter or gauge in r's registry.
func counterSum(t *testing.T, r *running, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}
