-- The CDC tables a reader has taken on, and the gaps of lost slots.

-- tables: the tables of cdc.tables the reader streamed at its last start
-- (NULL until a reader stored them): a table named since is added to the
-- publication and resynced while the stream goes on.
ALTER TABLE tidemark.cdc_positions ADD COLUMN tables text[];

-- snapshot 'resync': tidemark resync --new-slot asked for a new slot; the
-- reader creates it, streams from its consistent point and resyncs every
-- table.
ALTER TABLE tidemark.cdc_positions DROP CONSTRAINT cdc_positions_snapshot_check;
ALTER TABLE tidemark.cdc_positions ADD CONSTRAINT cdc_positions_snapshot_check
    CHECK (snapshot IN ('pending', 'done', 'skipped', 'resync'));

-- rows_planned: the source's estimate of the table's rows when the copy
-- began (pg_class.reltuples), for the progress shown; NULL when unknown.
ALTER TABLE tidemark.cdc_resyncs ADD COLUMN rows_planned bigint;

-- The gaps of CDC sources: a slot replaced by tidemark resync --new-slot
-- after it was lost. The source's changes after applied_lsn (on the server
-- system_id) and before resumed_lsn (on resumed_system_id) are missing from
-- the raw change table; the mirrors are made whole by the resync of every
-- table that follows. One row per replaced slot, kept until an operator
-- deletes it.
CREATE TABLE tidemark.cdc_gaps (
    source            text        NOT NULL,
    recorded_at       timestamptz NOT NULL,
    recorded_by       text        NOT NULL,
    slot              text        NOT NULL,
    system_id         text        NOT NULL,
    applied_lsn       pg_lsn      NOT NULL,
    last_commit_time  timestamptz,
    resumed_system_id text,
    resumed_lsn       pg_lsn,
    resumed_at        timestamptz,
    PRIMARY KEY (source, recorded_at)
);
