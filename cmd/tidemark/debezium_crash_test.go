package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/internal/testkit/debeziumtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
	"github.com/tidemark-dev/tidemark/internal/testkit/pgtest"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// TestDebeziumCrashSafety is acceptance item 2 of the Debezium source:
// `tidemark run` loading a Debezium stream (PostgreSQL's connector with
// schemas and unavailable TOAST values, over the JSON converter and over
// the AvroConverter through the schema registry, MySQL's without schemas;
// snapshot reads, deletes with tombstones, a truncate) is SIGKILLed at random moments and
// restarted; then the whole stream is produced again at new offsets, as a
// restarted connector sends it. Afterwards the mirror is the expected
// table and every change has exactly one raw change row.
func TestDebeziumCrashSafety(t *testing.T) {
	for _, tt := range []struct {
		connector string
		schemas   bool
		avro      bool
	}{{debeziumtest.PostgreSQL, true, false}, {debeziumtest.MySQL, false, false}, {debeziumtest.PostgreSQL, true, true}} {
		t.Run(fmt.Sprintf("%s/schemas=%v/avro=%v", tt.connector, tt.schemas, tt.avro), func(t *testing.T) {
			debeziumCrash(t, tt.connector, tt.schemas, tt.avro)
		})
	}
}

// debeziumCrash runs TestDebeziumCrashSafety for a stream of connector,
// with or without schemas (then the mirror is created first, as a user
// would), over the JSON converter or the AvroConverter (avro).
func debeziumCrash(t *testing.T, connector string, schemas, avro bool) {
	kills := 6
	if testing.Short() {
		kills = 4
	}
	const group, topic = "tidemark-dbz", "dbserver1.public.customers"
	pool, dsn := pgtest.NewPool(t)
	if !schemas {
		if _, err := pool.Exec(context.Background(), `CREATE SCHEMA dw;
			CREATE TABLE dw.customers (id integer PRIMARY KEY, name text, bio text, balance numeric(12,2))`); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 10, 5, 12, 0, 0, 0, time.UTC)
	s := debeziumtest.New(connector, schemas, topic, 2, now.Add(-24*time.Hour))
	registry := ""
	if avro {
		g := srtest.New(t)
		key, value := debeziumtest.AvroSchemas(connector)
		kid := g.Register(topic+"-key", sr.Schema{Schema: key})
		vid := g.Register(topic+"-value", sr.Schema{Schema: value})
		s.Avro = debeziumtest.NewAvroEncoders(connector, kid, vid, func(id int, schema string, example any) func(any) []byte {
			return srtest.AvroEncoderOf(t, id, schema, example)
		})
		registry = fmt.Sprintf("schema_registry: {url: %q, timeout: 300ms}\n", g.URL())
	}
	debeziumtest.RandomInto(s, 42, 300, 3000)
	kc := kafkatest.NewCluster(t, 2, topic)
	kafkatest.ExpireSilentMembers(t, kc)
	cfgPath := writeFile(t, "tidemark.yaml", fmt.Sprintf(`
warehouse: {dsn: %q}
http: {listen: "off"}
log: {level: info}
kafka:
  brokers: [%q]
  group: %s
  session_timeout: 1s
  rebalance_timeout: 2s
ingest: {batch_max_rows: 200, batch_max_age: 20ms}
sources:
  customers:
    kafka: {topics: [%s]}
    format: debezium
    mirror: {table: dw.customers}
%s`, dsn, kc.ListenAddrs()[0], group, topic, registry))

	records := append(s.Records, s.Again()...)
	producer := kafkatest.Producer(t, kc, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	stream := kafkatest.ProduceStream(producer, records, len(records)/60, 250*time.Millisecond)

	again := 0 // kills while the stream is sent again
	for _, at := range killWhileStoring(t, cfgPath, now, pool, group, topic, kills, 1500*time.Millisecond) {
		if at > int64(len(s.Records)) && at < int64(len(records)) {
			again++
		}
	}
	end, err := stream.Wait()
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	t.Logf("%d kills while the stream was sent again", again)
	final := startRun(t, cfgPath, now)
	ingesttest.WaitStored(t, pool, group, topic, end, 5*time.Minute)
	if err := final.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-final.exited

	debeziumtest.AssertMirror(t, pool, "dw.customers", s)
	debeziumtest.AssertChanges(t, pool, "customers", s)
	ingesttest.AssertStoredEqual(t, pool, group, topic, end)
	ingesttest.AssertLedger(t, pool, "customers")
}
