// Package backfill rebuilds an explicit range of an aggregate's
// partitions, and checks published partitions against their raw rows.
//
// A backfill (after a fix of an aggregate's logic, for a new aggregate,
// after an outage) plans the range as chunks of whole partitions, skips
// the chunks its reprocess behaviour leaves alone, and rebuilds the others
// at a bounded concurrency, each partition in a transaction of its own
// through aggregate.Rebuild: the reconciler's own rebuild, so a backfilled
// partition is exactly what an incremental run would have produced. A
// chunk that fails is recorded with its error and the run goes on; the
// failed chunks can be run again on their own. Runs and chunks are
// recorded in tidemark.backfill_runs and tidemark.backfill_chunks. A
// backfill never moves the load watermark, and the reconciler keeps
// running beside it: the per-partition lock in aggregate.Rebuild keeps the
// two from rebuilding one partition at once. A full refresh is a backfill
// of every partition the raw table holds, whatever was built before.
//
// A shadow run builds the range into a table beside the aggregate's
// (aggregate.BuildShadow) and compares each partition with the published
// one, publishing nothing. Verify recomputes partitions with the
// aggregate's query, without writing, and compares the result with the
// published rows.
package backfill
