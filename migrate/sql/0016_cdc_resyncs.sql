-- The resyncs of CDC source tables: copies of a table made while its
-- changes stream (tidemark resync, a table added to a running source).
-- One row per table, its latest resync; a new request replaces it.
-- last_key is the key of the last row copied, in the source's key order:
-- a resync killed part-way goes on after it.
CREATE TABLE tidemark.cdc_resyncs (
    source       text        NOT NULL,
    source_table text        NOT NULL,
    generation   bigint      NOT NULL,
    state        text        NOT NULL CHECK (state IN ('pending', 'copying', 'done')),
    requested_at timestamptz NOT NULL,
    requested_by text        NOT NULL,
    started_at   timestamptz,
    finished_at  timestamptz,
    last_key     text[],
    chunks       bigint      NOT NULL DEFAULT 0,
    rows_copied  bigint      NOT NULL DEFAULT 0,
    rows_removed bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (source, source_table)
);

-- The keys a resync under way has copied, or seen change in the stream:
-- when it ends, a mirror row whose key is not here is gone at the source.
-- Written in the transactions that apply them, emptied when it ends.
CREATE TABLE tidemark.cdc_resync_keys (
    source       text   NOT NULL,
    source_table text   NOT NULL,
    generation   bigint NOT NULL,
    row_key      text   COLLATE "C" NOT NULL,
    PRIMARY KEY (source, source_table, generation, row_key)
);
