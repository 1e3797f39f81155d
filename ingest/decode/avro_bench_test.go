package decode

import (
	"math/big"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
)

// BenchmarkAvroToJSON decodes an event of the ingest benchmark's shape.
func BenchmarkAvroToJSON(b *testing.B) {
	const schema = `{"type":"record","name":"Event","fields":[
		{"name":"event_id","type":"string"},
		{"name":"event_time","type":{"type":"long","logicalType":"timestamp-micros"}},
		{"name":"user","type":"string"},
		{"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
		{"name":"pad","type":"string"}]}`
	v, err := avro.Marshal(avro.MustParse(schema), map[string]any{"event_id": "e-42-123456", "event_time": time.Now(),
		"user": "u-1234", "amount": big.NewRat(12345, 100), "pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"})
	if err != nil {
		b.Fatal(err)
	}
	c, err := compileAvro(schema, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(v)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := toJSON(c, v); err != nil {
			b.Fatal(err)
		}
	}
}
