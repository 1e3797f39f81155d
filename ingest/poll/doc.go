// Package poll loads a table of another PostgreSQL database into a mirror
// by its updated_at watermark, for sources without logical replication.
//
// A Poller loads a table of another PostgreSQL database by its updated_at
// watermark (the source has no logical replication). Each run reads the
// rows with updated_at in (watermark - lookback, upper], upper being
// now() - safety_lag on the source's clock or an explicit bound, through a
// cursor in one REPEATABLE READ snapshot and in chunks, and in ONE
// warehouse transaction that holds the source's locked watermark row
// merges them into the mirror table (an existing row is updated only when
// the incoming updated_at is newer, so re-reads change nothing), records
// the rows that changed in raw.<source> (a table of row changes) with
// ingest-ledger rows, and moves the watermark to the newest updated_at
// read, never backwards and never to now(). A failure at any point leaves
// everything as it was; the next run reads the same rows.
package poll
