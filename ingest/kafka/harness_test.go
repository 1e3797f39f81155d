package kafka_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/clock"
	"github.com/tidemark-dev/tidemark/internal/promreg"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/migrate"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testNow is the service clock of these tests: event times are generated
// around it, never around today's date.
var testNow = time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)

// group is the consumer group of these tests.
const group = "tidemark-test"

type bundle struct {
	dsn       string
	pool      *pgxpool.Pool
	kafka     *kfake.Cluster
	producer  *kgo.Client
	clock     *clock.Settable
	topic     string
	parts     int32
	yaml      string // extra source keys
	kafkaYAML string // extra kafka keys
	// ingestYAML holds extra ingest keys, each on its own line indented
	// by two spaces.
	ingestYAML string
	// warehouseYAML holds extra warehouse keys in flow style, each
	// after a comma: ", write_timeout: 1s".
	warehouseYAML string
	// Settings that replace the defaults of configYAML when not empty.
	brokers          string // kafka.brokers[0]; default the cluster's address
	rebalanceTimeout string // default 5s
	batchMaxAge      string // default 50ms
	maxAge           string // sources.app_events.max_age; default 30d
}

// setup gives a test a migrated warehouse database and a kfake cluster
// with one topic, "events", of parts partitions.
func setup(t *testing.T, parts int32) *bundle {
	t.Helper()
	return setupOn(t, parts, pgtest.NewDatabase(t))
}

// setupOn is setup with the warehouse database at dsn.
func setupOn(t *testing.T, parts int32, dsn string) *bundle {
	t.Helper()
	return setupWith(t, parts, dsn, kafkatest.NewCluster(t, parts, "events"))
}

// setupWith is setup with the warehouse at dsn and the given cluster, which
// must have a topic "events".
func setupWith(t *testing.T, parts int32, dsn string, c *kfake.Cluster, producerOpts ...kgo.Opt) *bundle {
	t.Helper()
	pool := pgtest.Pool(t, dsn)
	if _, err := migrate.Up(context.Background(), dsn, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &bundle{
		dsn: dsn, pool: pool, kafka: c, topic: "events", parts: parts,
		producer: kafkatest.Producer(t, c, append(producerOpts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...),
		clock:    clock.New(testNow),
	}
}

// configYAML is the configuration the tests run with.
func (b *bundle) configYAML() string {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	return fmt.Sprintf(`
warehouse: {dsn: "%s"%s}
http: {listen: "off"}
kafka:
  brokers: [%q]
  group: %s
  session_timeout: 1s
  rebalance_timeout: %s
%s
ingest:
  batch_max_rows: 5000
  batch_max_age: %s
%s
sources:
  app_events:
    kafka: {topics: [%s]}
    event_id: /event_id
    event_time: /event_time
    max_age: %s
%s`, b.dsn, b.warehouseYAML, or(b.brokers, b.kafka.ListenAddrs()[0]), group, or(b.rebalanceTimeout, "5s"), b.kafkaYAML,
		or(b.batchMaxAge, "50ms"), b.ingestYAML, b.topic, or(b.maxAge, "30d"), b.yaml)
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
	in     *kafka.Ingester
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// start runs an ingester until the test ends or stop is called.
func (b *bundle) start(t *testing.T, extra ...kgo.Opt) *running {
	t.Helper()
	return b.startWith(t, kafka.Options{KafkaOpts: extra})
}

// startWith is start with options; a nil Logger logs warnings to the
// test log, and Registerer and Now are always the test's.
func (b *bundle) startWith(t *testing.T, opts kafka.Options) *running {
	t.Helper()
	return b.startConfig(t, kafka.ConfigFrom(b.config(t)), opts)
}

// startConfig is startWith with the ingester's Config.
func (b *bundle) startConfig(t *testing.T, c kafka.Config, opts kafka.Options) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	opts.Registerer, opts.Now = reg, b.clock.Now
	in, err := kafka.New(c, opts)
	if err != nil {
		t.Fatalf("kafka.New: %v", err)
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

// produced tracks the end offsets of what a test sent.
type produced struct {
	mu  sync.Mutex
	end map[int32]int64 // next offset per partition
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

// produceStream produces recs in chunks with a pause between them, in the
// background; the returned channel yields the outcome once everything is
// produced, and p's end offsets include the stream's from then on.
func (b *bundle) produceStream(p *produced, recs []*kgo.Record, chunk int, pause time.Duration) <-chan error {
	stream := kafkatest.ProduceStream(b.producer, recs, chunk, pause)
	done := make(chan error, 1)
	go func() {
		end, err := stream.Wait()
		p.mu.Lock()
		for part, o := range end {
			p.end[part] = max(p.end[part], o)
		}
		p.mu.Unlock()
		done <- err
	}()
	return done
}

// storedTotal is the sum of the stored next offsets.
func (b *bundle) storedTotal(t *testing.T) int64 {
	t.Helper()
	var n int64
	for _, o := range ingesttest.StoredOffsets(t, b.pool, group, b.topic) {
		n += max(o, 0)
	}
	return n
}

// waitProgress waits until at least n records are stored.
func (b *bundle) waitProgress(t *testing.T, n int64, timeout time.Duration) {
	t.Helper()
	if err := waitfor.Poll(timeout, func() bool { return b.storedTotal(t) >= n }); err != nil {
		t.Fatalf("fewer than %d records stored after %s (have %d)", n, timeout, b.storedTotal(t))
	}
}

func (b *bundle) waitStored(t *testing.T, end map[int32]int64, timeout time.Duration) {
	t.Helper()
	ingesttest.WaitStored(t, b.pool, group, b.topic, end, timeout)
}

// counterSum adds up every series of a counter or gauge in r's registry.
func counterSum(t *testing.T, r *running, name string) float64 {
	t.Helper()
	sum, err := promreg.Sum(r.reg, name)
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	return sum
}
