package cdc

import "time"

// SetSnapshotProgressEvery makes snapshots log their progress every d
// until the returned function restores the interval.
func SetSnapshotProgressEvery(d time.Duration) (restore func()) {
	old := snapshotProgressEvery.Swap(int64(d))
	return func() { snapshotProgressEvery.Store(old) }
}

// SetOnSlotLockBusy makes the reader call f each time it finds the slot's
// lock held by another session.
func SetOnSlotLockBusy(o *Options, f func()) { o.slotLockBusy = f }

// SetOnSlotCreationWatched makes the reader call f each time the watch of
// a slot's creation finds walsender pid still creating it, waited after
// the creation began.
func SetOnSlotCreationWatched(o *Options, f func(pid int64, waited time.Duration)) {
	o.creationWatched = func(pid uint32, waited time.Duration) { f(int64(pid), waited) }
}

// CheckFirstSQL is the first query a source check sends.
const CheckFirstSQL = checkWALLevelSQL
