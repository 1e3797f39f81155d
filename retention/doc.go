// Package retention keeps tidemark's state bounded over months of running.
//
// A Pruner removes what the configured retention no longer keeps, and never
// what is still needed:
//
//   - Raw partitions of Kafka, poll and CDC sources are dropped whole,
//     oldest first, once their end is older than the source's raw
//     retention, every aggregate partition they feed is final (its lateness
//     horizon has passed) and none is queued, and every aggregate of the
//     source has read every load into them. Each drop is one short
//     transaction under a lock timeout; a busy table is tried again at the
//     next run. The same transaction archives the aggregate partitions the
//     dropped rows fed and raises the source's retention bound
//     (tidemark.raw_retention), below which aggregate.Rebuild refuses to
//     rebuild: an archived partition's published rows are the only copy.
//   - Ledger rows go once every aggregate of their source has read them and
//     the ledger retention has passed; dead letters, corrections, arrival
//     histories and run records once their retention has passed, except
//     corrections an arrival partition that can still be rebuilt counts,
//     the arrival histories the completeness estimate learns from, and the
//     latest run of each kind.
//
// Rows are deleted in batches of their own transactions. Run with dryRun
// computes the same report and changes nothing; `tidemark prune` prints it,
// and `tidemark run` prunes every retention.every, one instance at a time.
package retention
