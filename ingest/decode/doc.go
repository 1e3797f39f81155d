// Package decode turns a Kafka record's value into an event bound for
// raw.<source>: its id and event time, taken by JSON pointer in one pass
// over the document, and the value as the payload; or into a Rejection,
// one of the stable dead-letter reasons with a detail, when it cannot be
// loaded. Decoding never fails a batch: a bad record is a dead letter.
//
// A Debezium source's records are change events (debezium.go): the
// envelope or ExtractNewRecordState's row, as the JSON converter writes
// them with or without schemas.enable. Each becomes an Event with a
// Change: the op, the row with its Connect logical types decoded (by the
// schema, when sent), the values Debezium did not have left out, the key,
// and a source position (position.go) that orders the changes of a
// PostgreSQL or MySQL database; the event id derives from the position and
// the event time is the commit time. DecodeChange takes the key and value
// as JSON documents, so a format that decodes records to JSON first can
// hand them on. Tombstones are skipped (Event.Skip).
package decode
