package decode_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/tidemark-dev/tidemark/config"
	"github.com/tidemark-dev/tidemark/ingest/decode"
	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// benchDbzKey and benchDbzValue are an update of BenchmarkDebezium's
// orders table as the JSON converter writes it with schemas.enable.
const (
	benchDbzKey   = `{"schema":{"type":"struct","optional":false,"name":"bench.public.orders.Key","fields":[{"type":"int64","optional":false,"field":"id"}]},"payload":{"id":123456}}`
	benchDbzRow   = `{"type":"struct","optional":true,"name":"bench.public.orders.Value","field":"%s","fields":[{"type":"int64","optional":false,"field":"id"},{"type":"int64","optional":false,"field":"customer_id"},{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"amount"},{"type":"string","optional":false,"field":"status"},{"type":"string","optional":false,"field":"note"},{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","field":"placed_at"}]}`
	benchDbzValue = `{"schema":{"type":"struct","optional":false,"name":"bench.public.orders.Envelope","fields":[` +
		`{"type":"struct","optional":true,"name":"bench.public.orders.Value","field":"before","fields":[{"type":"int64","optional":false,"field":"id"},{"type":"int64","optional":false,"field":"customer_id"},{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"amount"},{"type":"string","optional":false,"field":"status"},{"type":"string","optional":false,"field":"note"},{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","field":"placed_at"}]},` +
		`{"type":"struct","optional":true,"name":"bench.public.orders.Value","field":"after","fields":[{"type":"int64","optional":false,"field":"id"},{"type":"int64","optional":false,"field":"customer_id"},{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"12"},"field":"amount"},{"type":"string","optional":false,"field":"status"},{"type":"string","optional":false,"field":"note"},{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","field":"placed_at"}]},` +
		`{"type":"struct","optional":false,"name":"io.debezium.connector.postgresql.Source","field":"source","fields":[{"type":"string","optional":false,"field":"connector"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"lsn"}]},` +
		`{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"}]},` +
		`"payload":{"after":{"amount":"AJWE","customer_id":4242,"id":123456,"note":"a note of some length for the order","placed_at":"2024-05-01T10:11:12Z","status":"shipped"},` +
		`"before":null,"op":"u","source":{"connector":"postgresql","db":"shop","lsn":987654,"name":"bench","schema":"public","sequence":"[\"987000\",\"987654\"]",` +
		`"snapshot":"false","table":"orders","ts_ms":1714558272000,"txId":987000,"version":"2.5.4.Final"},"ts_ms":1714558272000}}`
)

// BenchmarkDebeziumDecodeJSON decodes a change of BenchmarkDebezium's
// shape: the JSON converter's envelope, each record with its schemas.
func BenchmarkDebeziumDecodeJSON(b *testing.B) {
	d, err := decode.NewDecoder(&config.Source{Name: "orders", Kafka: &config.KafkaSource{Topics: []string{"bench.public.orders"}}, Format: config.FormatDebezium})
	if err != nil {
		b.Fatal(err)
	}
	d.SetMirrorKey([]string{"id"})
	r := &kgo.Record{Topic: "bench.public.orders", Key: []byte(benchDbzKey), Value: []byte(benchDbzValue)}
	b.SetBytes(int64(len(r.Key) + len(r.Value)))
	b.ReportAllocs()
	for b.Loop() {
		if _, rej := d.Decode(r, time.Time{}); rej != nil {
			b.Fatalf("%s: %s", rej.Reason, rej.Detail)
		}
	}
}

// BenchmarkDebeziumDecodeAvro decodes a change of the AvroConverter, its
// schemas in a registry (dbzAvroValue, dbzAvroKey).
func BenchmarkDebeziumDecodeAvro(b *testing.B) {
	g := srtest.New(b)
	kid := g.Register("s.public.t-key", sr.Schema{Schema: dbzAvroKey})
	vid := g.Register("s.public.t-value", sr.Schema{Schema: dbzAvroValue})
	r := &kgo.Record{Topic: "s.public.t",
		Key:   srtest.AvroEncoderOf(b, kid, dbzAvroKey, dbzKey{})(dbzKey{ID: 7}),
		Value: srtest.AvroEncoderOf(b, vid, dbzAvroValue, dbzEnvelope{})(dbzAvroChange())}
	reg, err := decode.NewRegistry(config.SchemaRegistry{URL: g.URL(), Timeout: config.Duration(2 * time.Second)})
	if err != nil {
		b.Fatal(err)
	}
	d, err := decode.NewRegistryDecoder(&config.Source{Name: "t", Kafka: &config.KafkaSource{Topics: []string{"s.public.t"}}, Format: config.FormatDebezium}, reg)
	if err != nil {
		b.Fatal(err)
	}
	s, err := d.Resolve(context.Background(), []*kgo.Record{r})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(r.Key) + len(r.Value)))
	b.ReportAllocs()
	for b.Loop() {
		if _, rej := d.DecodeWith(r, time.Time{}, s); rej != nil {
			b.Fatalf("%s: %s", rej.Reason, rej.Detail)
		}
	}
}
