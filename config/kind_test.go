package config

import "testing"

// TestKind: each source's kind, and what a kind reads and writes.
func TestKind(t *testing.T) {
	for _, tt := range []struct {
		src               *Source
		kind              Kind
		kafka, rowChanges bool
	}{
		{&Source{Kafka: &KafkaSource{}}, KindKafka, true, false},
		{&Source{Kafka: &KafkaSource{}, Format: FormatDebezium}, KindDebezium, true, true},
		{&Source{Table: &TableSource{}}, KindTable, false, false},
		{&Source{Poll: &PollSource{}}, KindPoll, false, true},
		{&Source{CDC: &CDCSource{}}, KindCDC, false, true},
		{nil, "", false, false},
	} {
		k := tt.src.Kind()
		if k != tt.kind || k.Kafka() != tt.kafka || k.RowChanges() != tt.rowChanges {
			t.Errorf("%+v: kind %q (Kafka %v, RowChanges %v), want %q (%v, %v)", tt.src, k, k.Kafka(), k.RowChanges(), tt.kind, tt.kafka, tt.rowChanges)
		}
	}
}
