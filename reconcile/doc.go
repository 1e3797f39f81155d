// Package reconcile keeps event-date aggregates up to date while data
// arrives late, out of order and twice: each run finds the partitions that
// newly loaded data touched and rebuilds just those, through
// aggregate.Rebuild.
//
// # Exact load watermark
//
// For sources that tidemark loads (Kafka), every load transaction records
// its transaction id (xid8) in the ingest ledger, one row per UTC hour of
// event time it wrote. A run takes pg_snapshot_xmin(pg_current_snapshot())
// as its upper bound: every transaction with a smaller id has finished, so
// the ledger rows below it can never grow. The window [stored bound, new
// bound) is therefore exact: a load transaction that stays open across a
// run (rows stamped earlier than rows already reconciled) holds the bound
// back and is read by the first run after it commits. No lookback is
// needed.
//
// For raw tables that other tools write (table sources), a run reads the
// window (watermark - lookback, now() - safety_lag] of the configured
// ingestion-time column and advances the watermark to the newest
// ingestion time it read, never to now().
//
// # Claim, then rebuild
//
// In one transaction a run reads the window, maps it onto the aggregate's
// partitions, queues the partitions to rebuild in
// tidemark.pending_partitions, records events beyond the lateness horizon
// in tidemark.corrections, and advances the watermark. Each queued
// partition is then rebuilt in its own transaction, which also removes it
// from the queue, newest first and at most reconcile.max_partitions_per_run
// per run. A crash anywhere leaves either the old watermark (the window is
// read again) or queued partitions (rebuilt by the next run); rebuilding is
// idempotent, so nothing is missed and repeating work is harmless.
//
// # Lateness horizon
//
// An event is late by its ingestion time minus the end of its partition.
// Within the aggregate's lateness_horizon it rebuilds its partition.
// Beyond it, the policy decides: correction (the partition stays final;
// the event is recorded and counted), arrival (the event is counted in the
// partition of its ingestion time) or rebuild (the horizon is ignored).
//
// # One instance at a time
//
// A run holds a session advisory lock on its aggregate. `tidemark run`
// tries it on every tick and stands by when another instance holds it;
// `tidemark reconcile --once` waits for it.
//
// # Watermarks and completeness
//
// Each run also stores the source's event-time watermark (how far event
// time has progressed; it never decides what is rebuilt), moves partitions
// from open to closed (the watermark passed their end) to final (the
// horizon passed), and estimates the completeness of partitions that are
// not final from the arrival history of recent final ones.
//
// # Key reconciliation
//
// A KeyReconciler finds the rows of a poll source's mirror that were hard
// deleted at the source, which no updated_at watermark can see. It compares
// key ranges of the two tables by count and hash sum, descends only into
// ranges that differ, looks up the keys of small differing ranges at the
// source, and flags or removes the rows whose key is gone.
package reconcile
