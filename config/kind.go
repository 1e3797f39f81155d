package config

// Kind is what feeds a source, as its configuration says: one of the Kind
// constants, named as in the configuration.
type Kind string

// The kinds of source.
const (
	// KindKafka is a source of events from Kafka topics (kafka:).
	KindKafka Kind = "kafka"
	// KindDebezium is a source of row changes from Kafka topics of
	// Debezium change events (kafka: with format: debezium).
	KindDebezium Kind = "debezium"
	// KindTable is a raw table another tool writes (table:).
	KindTable Kind = "table"
	// KindPoll is a source table loaded by updated_at watermark (poll:).
	KindPoll Kind = "poll"
	// KindCDC is a source database read through logical replication
	// (cdc:).
	KindCDC Kind = "cdc"
)

// Kind returns what feeds s; "" for a nil source or one that names no
// kind, which a loaded configuration never holds.
func (s *Source) Kind() Kind {
	switch {
	case s == nil:
		return ""
	case s.Kafka != nil && s.Format == FormatDebezium:
		return KindDebezium
	case s.Kafka != nil:
		return KindKafka
	case s.Table != nil:
		return KindTable
	case s.Poll != nil:
		return KindPoll
	case s.CDC != nil:
		return KindCDC
	}
	return ""
}

// Kafka reports whether a source of kind k reads Kafka topics: its
// Kafka block is set.
func (k Kind) Kafka() bool { return k == KindKafka || k == KindDebezium }

// RowChanges reports whether the raw table of a source of kind k holds
// row changes (poll, CDC and Debezium sources) rather than events.
func (k Kind) RowChanges() bool { return k == KindPoll || k == KindCDC || k == KindDebezium }
