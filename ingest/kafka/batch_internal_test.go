package kafka

import (
	"bytes"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark-dev/tidemark/ingest/decode"
)

// TestBatchCountsDecodedPayloads: a batch's size, which ends it at
// ingest.batch_max_bytes, counts the JSON a registry format decoded to
// (up to decode_max_expansion times the record), and a JSON record's
// value, which is its payload, once.
func TestBatchCountsDecodedPayloads(t *testing.T) {
	src := &source{name: "s"}
	at := time.Date(2026, 10, 5, 10, 0, 0, 0, time.UTC)
	json := &kgo.Record{Topic: "t", Value: []byte(`{"event_id":"a"}`)}
	avro := &kgo.Record{Topic: "t", Offset: 1, Value: []byte{0, 0, 0, 0, 1, 2, 'a'}}
	decoded := bytes.Repeat([]byte{'x'}, 10_000)
	b := newBatch()
	b.add(src, json, decode.Event{ID: "a", Time: at, Payload: json.Value}, nil, at)
	if want := recordBytes(json); b.bytes != want {
		t.Errorf("a JSON record counts %d bytes, want %d: its payload is its value", b.bytes, want)
	}
	b.add(src, avro, decode.Event{ID: "b", Time: at, Payload: decoded}, nil, at)
	want := recordBytes(json) + recordBytes(avro) + len(decoded)
	if b.bytes != want {
		t.Errorf("with a decoded record the batch counts %d bytes, want %d", b.bytes, want)
	}
	b.drop(map[topicPartition]bool{{"other", 0}: true})
	if b.bytes != want {
		t.Errorf("after a drop the batch counts %d bytes, want %d", b.bytes, want)
	}
}
