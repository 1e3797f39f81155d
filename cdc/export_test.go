package cdc

import "time"

// SetSnapshotProgressEvery makes snapshots log their progress every d
// until the returned function restores the interval.
func SetSnapshotProgressEvery(d time.Duration) (restore func()) {
	old := snapshotProgressEvery.Swap(int64(d))
	return func() { snapshotProgressEvery.Store(old) }
}

// SetOnSourceConnected makes each run of the reader call f once it has
// connected to the source, before it checks it.
func SetOnSourceConnected(o *Options, f func()) { o.sourceConnected = f }

// SetOnSlotLockBusy makes the reader call f each time it finds the slot's
// lock held by another session.
func SetOnSlotLockBusy(o *Options, f func()) { o.slotLockBusy = f }

// SetOnSlotCreationActive makes the reader call f each time its watch
// finds the walsender creating the slot active, with how long the
// creation has run.
func SetOnSlotCreationActive(o *Options, f func(ran time.Duration)) { o.slotCreationActive = f }
