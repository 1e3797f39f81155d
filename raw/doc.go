// Package raw owns what every load writes beside its rows, and what the
// reconciler and retention read back:
//
//   - Table: the DDL of raw.<source>, range-partitioned by event time, its
//     partitions created on demand (and ahead of time) as event times
//     arrive; a Kafka source's events or a poll or CDC source's row
//     changes, each row with the id of the transaction that wrote it.
//   - The ingest ledger: one row per load transaction, source and UTC hour
//     of event time, gathered by a Ledger as rows are written and
//     inserted in the load's transaction, which the reconciler maps
//     onto aggregate partitions without scanning raw rows, and LoadedSince,
//     which tells whether a load above a transaction id touched a range.
//   - The stored state of Kafka partitions (PartitionStates) and the
//     event-time watermark computed from it (EventTimeWatermark, and the
//     collector that exports it).
package raw
