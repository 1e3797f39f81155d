// Package decode turns a Kafka record's value into an event bound for
// raw.<source>: its id and event time, taken by JSON pointer in one pass
// over the document, and the value as the payload; or into a Rejection,
// one of the stable dead-letter reasons with a detail, when it cannot be
// loaded. Decoding never fails a batch: a bad record is a dead letter.
//
// A source's values are JSON, or of a registry format (Avro; Protobuf and
// JSON Schema through the same codec interface): the Confluent wire
// format, whose schema id names a schema of the registry (Registry, which
// caches the compiled codecs by id). Such values are decoded to JSON
// first, by the mapping of docs/formats.md, and the pointers apply to
// that. Getting a schema is the one step that can wait on the network:
// Resolve does it before decoding, and a registry that cannot answer is
// ErrRegistryUnavailable, for the caller to retry, never a dead letter.
//
// A Debezium source's records are change events (debezium.go): the
// envelope or ExtractNewRecordState's row, as the JSON converter writes
// them with or without schemas.enable, or as the AvroConverter does: a
// key or value in the wire format is resolved and decoded as an Avro
// value is, and read with the Connect schema that its Avro schema's
// connect.* annotations describe (connect_avro.go). Each becomes an
// Event with a Change: the op, the row with its Connect logical types
// decoded (by the schema, when sent), the values Debezium did not have
// left out, the key, and a source position (position.go) that orders
// the changes of a PostgreSQL or MySQL database; the event id derives
// from the position and the event time is the commit time. DecodeChange takes the key and value
// as JSON documents. Tombstones are skipped (Event.Skip).
package decode
