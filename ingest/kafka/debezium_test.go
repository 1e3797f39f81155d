package kafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/testkit/debeziumtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/waitfor"
	"github.com/tidemark-dev/tidemark/reconcile"
)

// debeziumYAML is a configuration with one Debezium source, customers,
// reading the bundle's topic into dw.customers.
func (b *bundle) debeziumYAML(batchRows int) string {
	return fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
kafka:
  brokers: [%q]
  group: %s
  session_timeout: 1s
  rebalance_timeout: 5s
ingest: {batch_max_rows: %d, batch_max_age: 50ms}
sources:
  customers:
    kafka: {topics: [%s]}
    format: debezium
    mirror: {table: dw.customers}
`, b.dsn, b.kafka.ListenAddrs()[0], group, batchRows, b.topic)
}

// startDebezium runs an ingester of the Debezium source until the test
// ends or stop is called; extra is appended to the configuration.
func (b *bundle) startDebezium(t *testing.T, batchRows int, extra ...string) *running {
	t.Helper()
	cfg := b.debeziumConfig(t, batchRows, extra...)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	in, err := kafka.New(kafka.ConfigFrom(cfg), kafka.Options{Now: b.clock.Now, Logger: log})
	if err != nil {
		t.Fatalf("kafka.New: %v", err)
	}
	return b.run(t, in)
}

// debeziumConfig parses debeziumYAML with extra appended.
func (b *bundle) debeziumConfig(t *testing.T, batchRows int, extra ...string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(b.debeziumYAML(batchRows)+strings.Join(extra, "\n")), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// run runs in until the test ends or stop is called.
func (b *bundle) run(t *testing.T, in *kafka.Ingester) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{in: in, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- in.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// createMirror creates dw.customers as a user would for a connector
// without schemas.enable.
func createMirror(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `CREATE SCHEMA dw;
CREATE TABLE dw.customers (id integer PRIMARY KEY, name text, bio text, balance numeric(12,2))`); err != nil {
		t.Fatal(err)
	}
}

// TestDebeziumStream loads streams of the PostgreSQL and MySQL connectors,
// with and without schemas, as envelopes and flattened, in large and small
// batches: the mirror is the
// expected table and there is one raw change row per change; the same
// stream produced again at new offsets, as a restarted connector sends
// it, changes nothing.
func TestDebeziumStream(t *testing.T) {
	tests := []struct {
		connector string
		schemas   bool
		batchRows int
		// twice sends the stream twice before the ingester starts, so
		// that both copies meet in its batches.
		twice     bool
		flattened bool
		// avro writes the records as the AvroConverter does, through
		// the in-test registry.
		avro bool
		// decoding: the case differs from the first four only in how
		// records decode, which the server does not change.
		decoding bool
	}{
		{debeziumtest.PostgreSQL, true, 5000, false, false, false, false},
		{debeziumtest.PostgreSQL, true, 7, false, false, false, false},
		{debeziumtest.PostgreSQL, true, 5000, true, false, false, false},
		{debeziumtest.PostgreSQL, false, 5000, false, false, false, false},
		{debeziumtest.PostgreSQL, true, 13, false, true, false, true},
		{debeziumtest.MySQL, true, 5000, false, false, false, true},
		{debeziumtest.MySQL, false, 11, false, false, false, true},
		{debeziumtest.MySQL, true, 50, true, false, false, true},
		{debeziumtest.MySQL, false, 5000, false, true, false, true},
		{debeziumtest.PostgreSQL, true, 5000, true, false, true, true},
		{debeziumtest.PostgreSQL, true, 7, false, false, true, true},
		{debeziumtest.MySQL, true, 50, true, false, true, true},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprintf("%s/schemas=%v/batch=%d/twice=%v/flattened=%v/avro=%v", tt.connector, tt.schemas, tt.batchRows, tt.twice, tt.flattened, tt.avro), func(t *testing.T) {
			if tt.decoding {
				pgtest.ServerIndependent(t)
			}
			b := setup(t, 2)
			if !tt.schemas {
				createMirror(t, b.pool)
			}
			s := debeziumtest.New(tt.connector, tt.schemas, b.topic, 2, testNow.Add(-48*time.Hour))
			s.Flattened = tt.flattened
			var extra []string
			if tt.avro {
				_, registry := avroDebezium(t, s)
				extra = append(extra, registry)
			}
			debeziumtest.RandomInto(s, uint64(10+i), 40, 80)
			p := &produced{end: map[int32]int64{}}
			b.produce(t, p, s.Records)
			if tt.twice {
				b.produce(t, p, s.Again())
			}
			r := b.startDebezium(t, tt.batchRows, extra...)
			b.waitStored(t, p.end, time.Minute)
			debeziumtest.AssertMirror(t, b.pool, "dw.customers", s)
			debeziumtest.AssertChanges(t, b.pool, "customers", s)

			if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM pg_attribute
				WHERE attrelid = 'dw.customers'::regclass AND attnum > 0 AND NOT attisdropped`); n != 7 && n != 8 {
				t.Errorf("the mirror has %d columns, want those of the table and tidemark's three", n)
			}
			if pgtest.OnCitus() && tt.schemas {
				// A mirror tidemark created is distributed; one the user
				// created stays as it is.
				if got := pgtest.Placement(t, b.pool, "dw.customers"); got != "distributed by id" {
					t.Errorf("the mirror tidemark created on a Citus warehouse is %q, want distributed by id", got)
				}
			}
			b.produce(t, p, s.Again())
			b.waitStored(t, p.end, time.Minute)
			r.stop(t)
			debeziumtest.AssertMirror(t, b.pool, "dw.customers", s)
			debeziumtest.AssertChanges(t, b.pool, "customers", s)
			ingesttest.AssertLedger(t, b.pool, "customers")
		})
	}
}

// avroDebezium makes s write its records as the AvroConverter does, with
// the schemas of its connector registered in a new in-test registry, and
// returns the registry and its configuration.
func avroDebezium(t *testing.T, s *debeziumtest.Stream) (*srtest.Registry, string) {
	t.Helper()
	g := srtest.New(t)
	key, value := debeziumtest.AvroSchemas(s.Connector)
	kid := g.Register(s.Topic+"-key", sr.Schema{Schema: key, Type: sr.TypeAvro})
	vid := g.Register(s.Topic+"-value", sr.Schema{Schema: value, Type: sr.TypeAvro})
	s.Avro = debeziumtest.NewAvroEncoders(s.Connector, kid, vid, func(id int, schema string, example any) func(any) []byte {
		return srtest.AvroEncoderOf(t, id, schema, example)
	})
	return g, fmt.Sprintf("schema_registry: {url: %q, timeout: 300ms}", g.URL())
}

// TestDebeziumBadRecords: records that are no change tidemark can apply are
// dead letters with their reason; tombstones are skipped and counted.
func TestDebeziumBadRecords(t *testing.T) {
	b := setup(t, 1)
	createMirror(t, b.pool)
	s := debeziumtest.New(debeziumtest.PostgreSQL, false, b.topic, 1, testNow)
	s.Insert(1, debeziumtest.Values{Name: "a", Bio: "b", Balance: 100})
	s.Delete(1)
	s.Commit()
	recs := append(s.Records,
		&kgo.Record{Topic: b.topic, Key: []byte(`{"id": 2}`), Value: []byte(`{"op": "c", "after": {"id": 2}, "source": {"connector": "oracle", "ts_ms": 1}}`)},
		&kgo.Record{Topic: b.topic, Value: []byte(`{"op": "c", "after": {"id": 3}, "source": {"connector": "postgresql", "ts_ms": 1, "lsn": 5}}`)},
		&kgo.Record{Topic: b.topic, Key: []byte(`{"id": 4}`), Value: []byte(`not json`)},
	)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, recs)
	b.startDebezium(t, 100)
	b.waitStored(t, p.end, time.Minute)
	want := map[string]int64{"invalid_envelope": 1, "missing_key": 1, "invalid_json": 1}
	for reason, n := range want {
		if got := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM tidemark.dead_letters WHERE source = 'customers' AND reason = $1`, reason); got != n {
			t.Errorf("%d dead letters %s, want %d", got, reason, n)
		}
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM raw.customers`); n != 2 {
		t.Errorf("%d change rows, want 2 (the insert and the delete; the tombstone is skipped)", n)
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT records - rows_written - dead_letters FROM tidemark.kafka_offsets WHERE topic = $1`, b.topic); n != 1 {
		t.Errorf("records neither written nor dead letters: %d, want 1 (the tombstone)", n)
	}
}

// TestDebeziumNoMirror: without schemas and without the mirror, the
// source stalls, saying what to create, and loads once it exists.
func TestDebeziumNoMirror(t *testing.T) {
	b := setup(t, 1)
	s := debeziumtest.New(debeziumtest.MySQL, false, b.topic, 1, testNow)
	s.Insert(1, debeziumtest.Values{Name: "a", Bio: "b", Balance: 100})
	s.Commit()
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, s.Records)
	r := b.startDebezium(t, 100)
	waitfor.Until(t, "the ingester to report the missing mirror", func() bool {
		st := r.in.Stalls()
		return len(st) == 1 && strings.Contains(st[0].Error(), "create it with the source table's columns")
	})
	createMirror(t, b.pool)
	b.waitStored(t, p.end, time.Minute)
	debeziumtest.AssertMirror(t, b.pool, "dw.customers", s)
}

// TestDebeziumAggregate: an aggregate over a Debezium source is rebuilt
// from its raw change rows, as over a CDC source, and counts every change
// once although the stream was sent twice.
func TestDebeziumAggregate(t *testing.T) {
	b := setup(t, 2)
	aggregate := `aggregates:
  daily_changes:
    source: customers
    table: daily_changes
    partition: {by: day, column: day}
    lateness_horizon: 30d
    sql: |
      SELECT {{partition}} AS day, count(*)::int AS changes, count(*) FILTER (WHERE op = 'delete')::int AS deletes
      FROM {{events}}
`
	s := debeziumtest.Random(debeziumtest.MySQL, true, b.topic, 2, testNow.Add(-36*time.Hour), 77, 30, 200)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, s.Records)
	b.produce(t, p, s.Again())
	r := b.startDebezium(t, 100, aggregate)
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	rc, err := reconcile.New(b.debeziumConfig(t, 100, aggregate), b.pool, reconcile.Options{Now: b.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.RunOnce(context.Background(), "daily_changes", true); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	deletes := int64(0)
	for _, rec := range s.Records {
		if rec.Value != nil && strings.Contains(string(rec.Value), `"op":"d"`) {
			deletes++
		}
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT coalesce(sum(changes), 0)::bigint FROM daily_changes`); n != int64(s.Changes) {
		t.Errorf("the aggregate counts %d changes, want %d", n, s.Changes)
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT coalesce(sum(deletes), 0)::bigint FROM daily_changes`); n != deletes {
		t.Errorf("the aggregate counts %d deletes, want %d", n, deletes)
	}
}

// TestDebeziumTextValues: without schemas, a bytea column takes the
// base64 the connector sends and a jsonb column the JSON text; a value
// that is neither is refused, not stored wrong.
func TestDebeziumTextValues(t *testing.T) {
	b := setup(t, 1)
	if _, err := b.pool.Exec(context.Background(), `CREATE SCHEMA dw;
CREATE TABLE dw.customers (id integer PRIMARY KEY, photo bytea, doc jsonb)`); err != nil {
		t.Fatal(err)
	}
	change := func(id int, photo, doc string) *kgo.Record {
		return &kgo.Record{Topic: b.topic, Key: []byte(fmt.Sprintf(`{"id": %d}`, id)), Value: []byte(fmt.Sprintf(
			`{"op": "c", "after": {"id": %d, "photo": %s, "doc": %s}, "source": {"connector": "postgresql", "ts_ms": %d, "lsn": %d}}`,
			id, photo, doc, testNow.UnixMilli(), 100+id))}
	}
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, []*kgo.Record{
		change(1, `"3q2+7w=="`, `"{\"a\": [1, 2]}"`),
		change(2, `null`, `"\"text\""`),
		change(3, `"not base64!"`, `null`),
		change(4, `null`, `"{not json"`),
	})
	b.startDebezium(t, 100)
	b.waitStored(t, p.end, time.Minute)
	var got []string
	rows, err := b.pool.Query(context.Background(), `SELECT id || ' ' || coalesce(encode(photo, 'hex'), '-') || ' ' || coalesce(doc::text, '-') FROM dw.customers ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{`1 deadbeef {"a": [1, 2]}`, `2 - "text"`}; !slices.Equal(got, want) {
		t.Errorf("mirror = %q, want %q", got, want)
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM tidemark.dead_letters WHERE reason = 'rejected'`); n != 2 {
		t.Errorf("%d rejected dead letters, want 2", n)
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM raw.customers`); n != 2 {
		t.Errorf("%d change rows, want 2: a refused change is a dead letter, not a change row", n)
	}
}

// TestDebeziumMirrorWithoutKey: a mirror without a primary key is refused
// with the key to fix: the source stalls, and nothing is loaded.
func TestDebeziumMirrorWithoutKey(t *testing.T) {
	b := setup(t, 1)
	if _, err := b.pool.Exec(context.Background(), `CREATE SCHEMA dw; CREATE TABLE dw.customers (id integer, name text)`); err != nil {
		t.Fatal(err)
	}
	r := b.startDebezium(t, 100)
	waitfor.Until(t, "the ingester to refuse the mirror", func() bool {
		st := r.in.Stalls()
		return len(st) == 1 && strings.Contains(st[0].Error(), "sources.customers.mirror.table") && strings.Contains(st[0].Error(), "no primary key")
	})
}

// TestDebeziumAvroRegistryOutage: while the registry is down, no change of
// an AvroConverter stream is loaded nor dead-lettered and the ingester
// says why; once it is back, the stream loads as if it had never been
// down.
func TestDebeziumAvroRegistryOutage(t *testing.T) {
	pgtest.ServerIndependent(t)
	b := setup(t, 2)
	s := debeziumtest.New(debeziumtest.PostgreSQL, true, b.topic, 2, testNow.Add(-24*time.Hour))
	g, registry := avroDebezium(t, s)
	debeziumtest.RandomInto(s, 91, 30, 40)
	g.Fail(http.StatusServiceUnavailable, "")
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, s.Records)
	opts := kafka.Options{Now: b.clock.Now, Registerer: prometheus.NewRegistry()}
	kafka.SetRegistryRetry(&opts, 20*time.Millisecond, 200*time.Millisecond)
	in, err := kafka.New(kafka.ConfigFrom(b.debeziumConfig(t, 100, registry)), opts)
	if err != nil {
		t.Fatal(err)
	}
	r := b.run(t, in)
	r.reg = opts.Registerer.(*prometheus.Registry)
	waitfor.Until(t, "attempts at the registry fail", func() bool {
		return counterSum(t, r, "tidemark_schema_registry_errors_total") >= 5 && r.in.RegistryError() != nil
	})
	for _, q := range []string{`SELECT count(*) FROM tidemark.dead_letters`, `SELECT coalesce(sum(rows_written), 0)::bigint FROM tidemark.kafka_offsets`} {
		if n := ingesttest.Scalar(t, b.pool, q); n != 0 {
			t.Errorf("%s = %d while the registry is down, want 0", q, n)
		}
	}
	g.Heal()
	b.waitStored(t, p.end, time.Minute)
	r.stop(t)
	debeziumtest.AssertMirror(t, b.pool, "dw.customers", s)
	debeziumtest.AssertChanges(t, b.pool, "customers", s)
	if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM tidemark.dead_letters`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	if r.in.RegistryError() != nil {
		t.Errorf("registry error after it came back: %v", r.in.RegistryError())
	}
}

// TestDebeziumAvroWithoutRegistry: an AvroConverter's change on a source
// without schema_registry is a wrong_format dead letter that names the key
// to set.
func TestDebeziumAvroWithoutRegistry(t *testing.T) {
	b := setup(t, 1)
	createMirror(t, b.pool)
	s := debeziumtest.New(debeziumtest.PostgreSQL, true, b.topic, 1, testNow)
	avroDebezium(t, s)
	s.Insert(1, debeziumtest.Values{Name: "a", Bio: "b", Balance: 100})
	s.Commit()
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, s.Records)
	b.startDebezium(t, 100)
	b.waitStored(t, p.end, time.Minute)
	var reason, detail string
	if err := b.pool.QueryRow(context.Background(), `SELECT reason, detail FROM tidemark.dead_letters WHERE source = 'customers'`).Scan(&reason, &detail); err != nil {
		t.Fatal(err)
	}
	if reason != "wrong_format" || !strings.Contains(detail, "schema_registry") {
		t.Errorf("dead letter %s: %s; want wrong_format naming schema_registry", reason, detail)
	}
	if n := ingesttest.Scalar(t, b.pool, `SELECT count(*) FROM raw.customers`); n != 0 {
		t.Errorf("%d change rows, want 0", n)
	}
}
