// Package reconcile will own the periodic reconciler: it reads the ingest
// ledger between two exact load watermarks (transaction ids), finds the
// event-date partitions that new data touched, applies the lateness
// horizon, and rebuilds just those partitions through aggregate.Rebuild.
//
// Status: not implemented in this version; the package holds no code yet.
package reconcile
