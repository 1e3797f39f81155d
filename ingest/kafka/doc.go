// Package kafka loads Kafka topics into the warehouse, exactly once.
//
// An Ingester is one member of a Kafka consumer group (cooperative-sticky
// balancing) reading the topics of every Kafka source in the configuration.
// Each record's value is decoded (package decode); its event id and event
// time are taken by JSON pointer. Good records become rows of
// raw.<source>, a table range-partitioned by event time whose partitions
// are created on demand (package raw); bad records become rows of
// tidemark.dead_letters with their original key, value and header bytes
// and the reason (decode's Reason constants). Nothing is skipped and no
// bad record blocks its partition.
//
// # Registry formats
//
// A source of format avro (protobuf, json_schema) decodes each value with
// the schema its Confluent header names, from the schema registry
// (decode.Registry). The schemas of a fetch are resolved before its
// records are decoded. When the registry cannot answer, the partition is
// moved back (SetOffsets) to the first record without a schema and paused
// until a backoff ends: the records before it are loaded, nothing after it
// enters a batch. No request for one fetch's schemas starts after one
// request timeout, so the poll loop returns within two, and a rebalance it
// holds (BlockRebalanceOnPoll) is not held longer.
// RegistryError reports the outage for readiness and the status page.
//
// # One transaction per batch
//
// Records are gathered into batches flushed by size, bytes or age. A batch
// is written in ONE warehouse transaction that holds its raw rows (events
// already stored and repeats within the batch are dropped and counted as
// duplicates by (event_id, event_time); the rest is written with a binary
// COPY that the writer encodes itself (rawCopy);
// repeats are looked for, and stored events probed for in the raw
// partitions the batch touches, only once a COPY has failed on one; for a
// source with dedupe.by: event_id, the ids of tidemark.event_ids loaded
// within the window too, see dedupeIDs), one
// ingest-ledger row per source and UTC hour of event time that the new rows
// touch, the dead letters, and for each Kafka partition the next offset,
// its leader epoch, the largest event time seen and running totals. Every row carries the transaction id (xid8) that wrote it, so the
// reconciler can read exact windows of what was loaded.
//
// # Debezium sources
//
// A source with format: debezium writes change rows into a raw table of
// row changes and, in the same batch transaction, its changes to a mirror
// (debezium.go): folded per key between truncates, the latest by source
// position winning, through a stage converted to the mirror's row type by
// PostgreSQL. Each mirror row keeps the position of the change that wrote
// it and a change at or below it is not applied, so a connector that sends
// changes again never moves a row backwards; the position of the last
// truncate, in tidemark.debezium_truncates, does the same for rows a
// truncate removed. When rows are checked one by one, each change row and
// its mirror change share a savepoint. The mirror is read from the
// warehouse catalog before the transaction, or created from the events'
// Connect schema.
//
// # Offsets live in the warehouse
//
// On assignment the ingester resumes each partition from the offset stored
// in tidemark.kafka_offsets (kgo.AdjustFetchOffsetsFn), ignoring Kafka's own
// commits, which it still makes after each warehouse commit so that
// ordinary lag tools work. Before writing, the batch transaction locks the
// partitions' offset rows and compares them with the positions this
// ingester last stored: a partition that another member has advanced in the
// meantime (after a missed rebalance, or a commit whose acknowledgement was
// lost) is dropped from the batch and re-read from the stored position. A
// crash at any moment therefore loses nothing and writes nothing twice.
//
// On revocation the batch in flight is written before the partitions are
// released; on shutdown the ingester writes its batch, commits, and leaves
// the group. While a batch is written, the next one is polled and decoded
// ahead, up to ingest.batch_max_rows records or ingest.batch_max_bytes.
// While the warehouse is slow or down the ingester stops polling once that
// batch is decoded, so the client's fetch buffers (one of at most
// kafka.fetch_max_bytes per broker) and two batches bound its memory, and
// it retries with backoff.
//
// # Replaying dead letters
//
// Replay decodes a source's stored dead letters again with the current
// configuration and loads those that now decode through the writer's own
// steps (probe, COPY, ledger), marking them replayed in the same
// transaction, one chunk of dead letters (locked FOR UPDATE SKIP LOCKED)
// per transaction: a crash loses nothing and loads nothing twice.
package kafka
