// Package decode turns a Kafka record's value into an event bound for
// raw.<source>: its id and event time, taken by JSON pointer in one pass
// over the document, and the value as the payload; or into a Rejection,
// one of the stable dead-letter reasons with a detail, when it cannot be
// loaded. Decoding never fails a batch: a bad record is a dead letter.
package decode
