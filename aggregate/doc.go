// Package aggregate will own aggregate definitions (a user SQL SELECT over
// one event-date partition of raw events) and Rebuild, the one code path
// that atomically replaces a partition of an aggregate table; the
// reconciler, backfill, full refresh and verify all call it.
//
// Status: not implemented in this version; the package holds no code yet.
package aggregate
