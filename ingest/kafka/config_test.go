package kafka_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/kafka"
	"github.com/tidemark-dev/tidemark/internal/pgconnect"
	"github.com/tidemark-dev/tidemark/internal/testkit/ingesttest"
	"github.com/tidemark-dev/tidemark/internal/testkit/kafkatest"
)

// literalConfig is the Config of b.config, written without a
// configuration file: the configuration's defaults, spelt out. Its one
// source's decoder reads a block of the configuration's type, written as
// a literal too.
func (b *bundle) literalConfig() kafka.Config {
	decoding := &config.Source{
		Name:            "app_events",
		Kafka:           &config.KafkaSource{Topics: []string{b.topic}},
		EventID:         "/event_id",
		EventTime:       "/event_time",
		EventTimeFormat: config.TimeAuto,
		MaxAge:          config.Duration(30 * 24 * time.Hour),
		MaxFutureSkew:   config.Duration(time.Hour),
		Decode:          config.DecodeLimits{MaxBytes: int64(config.DefaultDecodeMaxBytes), Expansion: config.DefaultDecodeMaxExpansion},
	}
	broker := b.brokers
	if broker == "" {
		broker = b.kafka.ListenAddrs()[0]
	}
	return kafka.Config{
		Connection:             config.Kafka{Brokers: []string{broker}, ClientID: "tidemark"},
		Group:                  group,
		StartOffset:            "earliest",
		SessionTimeout:         time.Second,
		RebalanceTimeout:       5 * time.Second,
		FetchMaxBytes:          6 << 20,
		FetchMaxPartitionBytes: 1 << 20,
		DecompressMaxBytes:     64 << 20,
		BatchMaxRows:           5000,
		BatchMaxBytes:          6 << 20,
		BatchMaxAge:            50 * time.Millisecond,
		Warehouse:              pgconnect.Settings{DSN: b.dsn, MaxConns: 8, IdleInTransaction: 5 * time.Minute},
		WriteTimeout:           2 * time.Minute,
		RegistryTimeout:        5 * time.Second / 4,
		Sources: []kafka.Source{{
			Name:         "app_events",
			Topics:       []string{b.topic},
			Decoding:     decoding,
			RawPartition: config.PartitionDay,
			Distribute:   true,
		}},
	}
}

// TestConfigFrom: the Config built from the configuration file is the one
// its keys and defaults say, and its source's decoder reads the source's
// block of the file.
func TestConfigFrom(t *testing.T) {
	b := &bundle{dsn: "postgres://wh", topic: "events", kafka: kafkatest.NewCluster(t, 1, "events")}
	cfg := b.config(t)
	got := kafka.ConfigFrom(cfg)
	if len(got.Sources) != 1 || got.Sources[0].Decoding != cfg.Sources["app_events"] {
		t.Fatalf("ConfigFrom: sources %+v, want app_events decoded by its block of the file", got.Sources)
	}
	got.Sources[0].Decoding = nil
	want := b.literalConfig()
	want.Sources[0].Decoding = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ConfigFrom:\n got %+v\nwant %+v", got, want)
	}
}

// TestConfigValidate: New refuses a Config it cannot work with, naming
// the field.
func TestConfigValidate(t *testing.T) {
	b := &bundle{dsn: "postgres://wh", topic: "events", brokers: "localhost:9092"}
	for _, tc := range []struct {
		field  string
		change func(*kafka.Config)
	}{
		{"no Kafka sources", func(c *kafka.Config) { c.Sources = nil }},
		{"Connection.Brokers", func(c *kafka.Config) { c.Connection.Brokers = nil }},
		{"Group", func(c *kafka.Config) { c.Group = "" }},
		{"StartOffset", func(c *kafka.Config) { c.StartOffset = "newest" }},
		{"SessionTimeout", func(c *kafka.Config) { c.SessionTimeout = 0 }},
		{"RebalanceTimeout", func(c *kafka.Config) { c.RebalanceTimeout = 0 }},
		{"FetchMaxBytes", func(c *kafka.Config) { c.FetchMaxBytes = 0 }},
		{"FetchMaxPartitionBytes", func(c *kafka.Config) { c.FetchMaxPartitionBytes = 0 }},
		{"DecompressMaxBytes", func(c *kafka.Config) { c.DecompressMaxBytes = 0 }},
		{"BatchMaxRows", func(c *kafka.Config) { c.BatchMaxRows = 0 }},
		{"BatchMaxBytes", func(c *kafka.Config) { c.BatchMaxBytes = 0 }},
		{"BatchMaxAge", func(c *kafka.Config) { c.BatchMaxAge = 0 }},
		{"Warehouse.DSN", func(c *kafka.Config) { c.Warehouse.DSN = "" }},
		{"WriteTimeout", func(c *kafka.Config) { c.WriteTimeout = 0 }},
		{"SchemaRegistry", func(c *kafka.Config) { c.Sources[0].Registry = true }},
		{"RegistryTimeout", func(c *kafka.Config) {
			c.Sources[0].Registry, c.SchemaRegistry, c.RegistryTimeout = true, &config.SchemaRegistry{URL: "http://registry"}, 0
		}},
		{"Name", func(c *kafka.Config) { c.Sources[0].Name = "" }},
		{"Topics", func(c *kafka.Config) { c.Sources[0].Topics = nil }},
		{"Topics", func(c *kafka.Config) {
			other := c.Sources[0]
			other.Name = "other"
			c.Sources = append(c.Sources, other)
		}},
		{"Decoding", func(c *kafka.Config) { c.Sources[0].Decoding = nil }},
		{"RawPartition", func(c *kafka.Config) { c.Sources[0].RawPartition = "" }},
		{"DedupeWindow", func(c *kafka.Config) { c.Sources[0].DedupeWindow = -time.Second }},
	} {
		c := b.literalConfig()
		tc.change(&c)
		if _, err := kafka.New(c, kafka.Options{}); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: New: %v, want an error naming %s", tc.field, err, tc.field)
		}
	}
}

// TestIngestFromLiteral: an ingester built from a Config literal, without
// a configuration file, loads exactly the good events and stores the
// offsets.
func TestIngestFromLiteral(t *testing.T) {
	b := setup(t, 2)
	w := ingesttest.Make(b.topic, 2000, 2, 7, 0.01, 0.01, testNow)
	p := &produced{end: map[int32]int64{}}
	b.produce(t, p, w.Records)
	c := b.literalConfig()
	c.Sources[0].Distribute = false // on a Citus warehouse too: the raw table stays on the coordinator
	r := b.startConfig(t, c, kafka.Options{})
	b.waitStored(t, p.end, 2*time.Minute)
	r.stop(t)
	ingesttest.AssertRaw(t, b.pool, "app_events", w.Good)
	ingesttest.AssertDeadLetters(t, b.pool, w)
	ingesttest.AssertStoredEqual(t, b.pool, group, b.topic, p.end)
}
