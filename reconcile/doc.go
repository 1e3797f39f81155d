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
// # One claimer, several rebuilders
//
// A run holds a session advisory lock on its aggregate while it claims,
// rebuilds and updates partition states, so claims, beyond-horizon
// records, arrival histories and states have one writer. An instance that
// finds the lock held rebuilds due queued partitions beside the holder,
// at most reconcile.max_partitions_per_run, without claiming: `tidemark
// run` then waits for its next tick, `tidemark reconcile --once` waits
// for the lock and runs. A catch-up of many partitions is thus shared by
// every instance.
//
// Each rebuild picks its queue row FOR UPDATE SKIP LOCKED, in a fixed
// order (partitions that have not failed first, newest first), and holds
// it until its transaction commits, deleting the row or recording a
// failure: other instances skip the row, so a partition is rebuilt by one
// of them at a time, and aggregate.Rebuild's partition lock keeps
// backfills out too. A claim queues with INSERT ... ON CONFLICT DO UPDATE,
// which takes the row's lock: when it queues a partition that an instance
// is rebuilding, it waits for that rebuild to commit, finds the row
// deleted and inserts it again, so a rebuild that starts after the claim
// commits reads the claimed data; when the row is not being rebuilt, the
// claim locks it until it commits, so no rebuild picks it before the
// claimed data is visible. For a ledger source the window is narrow: a
// rebuild holds a transaction id from the moment it picks its row, which
// keeps the claim's bound below it, so only loads already running when
// the rebuild began can be claimed meanwhile. A retry after a deadlock or
// serialization failure picks the same row SKIP LOCKED and moves on when
// another instance took it. Counts of queued and failing partitions are
// read from the queue, rows being rebuilt included. A partition first
// built by a helper after the holder updated states gets its state at the
// holder's next run. Tests: TestInstancesShareQueuedPartitions,
// TestClaimWhilePartitionIsRebuilt, TestTwoReconcilers.
//
// # Watermarks and completeness
//
// Each run also stores the source's event-time watermark (how far event
// time has progressed; it never decides what is rebuilt), moves partitions
// from open to closed (the watermark passed their end) to final (the
// horizon passed), and estimates the completeness of partitions that are
// not final from the arrival history of recent final ones.
package reconcile
