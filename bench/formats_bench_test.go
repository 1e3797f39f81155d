package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/tidemark-dev/tidemark/internal/testkit/srtest"
)

// formatCase is one way the same events reach the topic: a source format
// and how a JSON event of the workload is encoded in it. The registry
// formats register their schema with the in-test registry g.
type formatCase struct {
	format string
	encode func(b *testing.B, g *srtest.Registry) func(jsonValue []byte) []byte
}

// workloadAvro is the Avro schema of the workload's events: the JSON
// workload's fields, with the time and the amount as Avro's logical types
// (they decode to the same jsonb).
const workloadAvro = `{"type":"record","name":"Event","namespace":"bench","fields":[
	{"name":"event_id","type":"string"},
	{"name":"event_time","type":{"type":"long","logicalType":"timestamp-micros"}},
	{"name":"user","type":"string"},
	{"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
	{"name":"pad","type":"string"}]}`

// workloadProto is the Protobuf schema of the workload's events: the
// time a google.protobuf.Timestamp, the amount a double (Protobuf has no
// decimal: 12.30 is stored as 12.3, the same number in jsonb).
const workloadProto = `syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";
message Event {
  string event_id = 1;
  google.protobuf.Timestamp event_time = 2;
  string user = 3;
  double amount = 4;
  string pad = 5;
}`

// workloadJSONSchema is the JSON Schema of the workload's events; the
// values are the JSON workload's, as they are.
const workloadJSONSchema = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",
	"properties":{"event_id":{"type":"string","minLength":1},"event_time":{"type":"string","format":"date-time"},
		"user":{"type":"string"},"amount":{"type":"number","minimum":0},"pad":{"type":"string"}},
	"required":["event_id","event_time","user","amount","pad"],"additionalProperties":false}`

// workloadEvent is a JSON event of the workload, read back.
type workloadEvent struct {
	EventID   string      `json:"event_id"`
	EventTime time.Time   `json:"event_time"`
	User      string      `json:"user"`
	Amount    json.Number `json:"amount"`
	Pad       string      `json:"pad"`
}

func parseEvent(b *testing.B, v []byte) workloadEvent {
	var e workloadEvent
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	if err := d.Decode(&e); err != nil {
		b.Fatal(err)
	}
	return e
}

// formatCases are the formats BenchmarkIngestFormats compares; JSON is
// the baseline and comes first.
var formatCases = []formatCase{
	{format: "json", encode: func(*testing.B, *srtest.Registry) func([]byte) []byte {
		return func(v []byte) []byte { return v }
	}},
	{format: "avro", encode: func(b *testing.B, g *srtest.Registry) func([]byte) []byte {
		enc := srtest.AvroEncoder(b, g.Register(topic+"-value", sr.Schema{Schema: workloadAvro}), workloadAvro)
		return func(v []byte) []byte {
			e := parseEvent(b, v)
			amount, ok := new(big.Rat).SetString(e.Amount.String())
			if !ok {
				b.Fatalf("amount %s", e.Amount)
			}
			return enc(map[string]any{"event_id": e.EventID, "event_time": e.EventTime, "user": e.User, "amount": amount, "pad": e.Pad})
		}
	}},
	{format: "protobuf", encode: func(b *testing.B, g *srtest.Registry) func([]byte) []byte {
		f := srtest.CompileProto(b, workloadProto, nil)
		md := f.Message(b, "bench.Event")
		enc := srtest.ProtobufEncoder(b, g.Register(topic+"-proto-value", sr.Schema{Schema: workloadProto, Type: sr.TypeProtobuf}), 0)
		fields := md.Fields()
		id, ts, user, amount, pad := fields.ByName("event_id"), fields.ByName("event_time"), fields.ByName("user"), fields.ByName("amount"), fields.ByName("pad")
		return func(v []byte) []byte {
			e := parseEvent(b, v)
			a, err := e.Amount.Float64()
			if err != nil {
				b.Fatalf("amount %s: %v", e.Amount, err)
			}
			m := dynamicpb.NewMessage(md)
			m.Set(id, protoreflect.ValueOfString(e.EventID))
			t := m.Mutable(ts).Message()
			t.Set(t.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(e.EventTime.Unix()))
			t.Set(t.Descriptor().Fields().ByName("nanos"), protoreflect.ValueOfInt32(int32(e.EventTime.Nanosecond())))
			m.Set(user, protoreflect.ValueOfString(e.User))
			m.Set(amount, protoreflect.ValueOfFloat64(a))
			m.Set(pad, protoreflect.ValueOfString(e.Pad))
			return enc(m)
		}
	}},
	{format: "json_schema", encode: func(b *testing.B, g *srtest.Registry) func([]byte) []byte {
		return srtest.JSONSchemaEncoder(b, g.Register(topic+"-json-value", sr.Schema{Schema: workloadJSONSchema, Type: sr.TypeJSON}))
	}},
}

// BenchmarkIngestFormats measures tidemark's Kafka ingest of the same
// events (BenchmarkIngest's, 4 partitions) sent as JSON and in each
// registry format through an in-process schema registry, in
// TIDEMARK_BENCH_ROUNDS rounds that rotate which goes first, each on a
// fresh database, and reports for each format the median of the rounds'
// ratios to JSON.
func BenchmarkIngestFormats(b *testing.B) {
	n := size("TIDEMARK_BENCH_EVENTS", 1_000_000, 100_000)
	rounds := envInt("TIDEMARK_BENCH_ROUNDS", 3)
	e := &env{srv: durableServer(b)}
	g := srtest.New(b)
	for range b.N {
		recs, avg := workloadOn(n, parts)
		// One cluster per format, each holding the same events encoded so.
		type loaded struct {
			kc    *kfake.Cluster
			end   map[int32]int64
			bytes float64
		}
		topics := make([]loaded, len(formatCases))
		for i, c := range formatCases {
			enc := c.encode(b, g)
			encoded := make([]*kgo.Record, len(recs))
			total := 0
			for j, r := range recs {
				v := enc(r.Value)
				total += len(v)
				encoded[j] = &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Headers: r.Headers, Value: v}
			}
			e.kc = newCluster(b, parts)
			topics[i] = loaded{kc: e.kc, end: e.produce(b, encoded), bytes: float64(total) / float64(n)}
		}
		fmt.Fprintf(os.Stderr, "\ningest by format, %d events (JSON ~%.0f bytes) on %d partitions, batches of %d\n", n, avg, parts, batchRows(b))
		rates := make([][]float64, len(formatCases))
		ratios := make([][]float64, len(formatCases))
		for r := range rounds {
			round := make([]float64, len(formatCases))
			for k := range formatCases {
				i := (k + r) % len(formatCases) // rotate which goes first
				e.kc = topics[i].kc
				e.sourceKeys = formatKeys(formatCases[i].format, g.URL())
				round[i], _ = e.measureGroup(b, topics[i].end, n, 1, "bench-formats")
			}
			line := fmt.Sprintf("  round %d:", r+1)
			for i, c := range formatCases {
				rates[i] = append(rates[i], round[i])
				ratios[i] = append(ratios[i], round[i]/round[0])
				line += fmt.Sprintf(" %s %9.0f rows/s (%.2f)", c.format, round[i], round[i]/round[0])
			}
			fmt.Fprintln(os.Stderr, line)
		}
		e.sourceKeys = ""
		for i, c := range formatCases {
			b.ReportMetric(medianOf(rates[i]), c.format+"_rows/s")
			if i > 0 {
				b.ReportMetric(medianOf(ratios[i]), c.format+"/json")
				fmt.Fprintf(os.Stderr, "  %s: values of ~%.0f bytes, median %s/json = %.2f over %d rounds\n",
					c.format, topics[i].bytes, c.format, medianOf(ratios[i]), rounds)
			}
		}
		for _, t := range topics {
			t.kc.Close()
		}
	}
}

// formatKeys are the source keys (and the registry block) of a format.
func formatKeys(format, registryURL string) string {
	if format == "json" {
		return ""
	}
	return fmt.Sprintf("    format: %s\nschema_registry: {url: %q}", format, registryURL)
}
