// Package cdc mirrors tables of another PostgreSQL database into the
// warehouse through logical replication (the pgoutput plugin, protocol 2).
//
// A Reader checks the source first (Check: wal_level, the role's
// privileges, each table's replica identity, the slot's state and
// identity) and refuses, with ErrSetup and a message naming the fix, what
// it cannot use; it recreates a slot it has read from only when tidemark
// resync --new-slot asks, and then resyncs every table. It creates the
// publication and the slot when missing; with snapshot: initial the tables
// are copied in the snapshot the new slot exports, and streaming starts at
// the slot's consistent point, so there is no gap and no overlap. One
// reader per slot holds an advisory lock in the warehouse; others wait and
// take over when it ends.
//
// Committed source transactions are applied in groups, each in ONE
// warehouse transaction that writes one raw change row per change
// (raw.<source>, event time = source commit time), the ingest ledger, the
// changes to the mirrors (folded per key in order, so a key changed several
// times is written once; unchanged TOAST values keep the stored value), and
// the end LSN of the group's last transaction. A group commits in the
// background while the next is received and its raw rows written; its
// mirror changes and its COMMIT wait for the group before it, so groups
// commit in source order and a failed group fails those after it. Only
// after a group's commit is the slot confirmed, with every position field
// set. On restart,
// transactions that end at or below the stored position are skipped. Large
// transactions that the server streams while in progress are buffered in
// memory up to a bound, then on disk, and applied at their commit; aborted
// ones and rolled-back subtransactions are dropped, and so is their DDL
// (relation messages inside a stream take effect at its commit). A column
// added at the source is added to the mirror; a column whose type changes
// stops the reader with ErrSetup once everything before the change is
// applied. When nothing tracked is
// pending, the slot is confirmed up to the server's WAL end, and a logical
// message written on an interval keeps WAL moving, so an idle slot does not
// pin WAL.
package cdc
