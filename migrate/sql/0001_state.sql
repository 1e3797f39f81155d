-- tidemark's own state. Raw tables live in schema "raw" and are created from
-- the configuration at start; everything here is fixed.
CREATE SCHEMA IF NOT EXISTS tidemark;
CREATE SCHEMA IF NOT EXISTS raw;

-- Next offset to consume per consumer group and topic-partition, written in
-- the same transaction as the rows it covers. A batch transaction inserts a
-- missing row with next_offset = -1 so that it can lock it, and always sets
-- the real offset before committing.
CREATE TABLE tidemark.kafka_offsets (
    consumer_group  text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL,
    source          text        NOT NULL,
    next_offset     bigint      NOT NULL,
    leader_epoch    integer     NOT NULL DEFAULT -1,
    -- Largest event time seen on this partition, and the service time at
    -- which the last good event arrived (idle detection).
    max_event_time  timestamptz,
    last_event_at   timestamptz,
    -- Running totals for this partition.
    records         bigint      NOT NULL DEFAULT 0,
    rows_written    bigint      NOT NULL DEFAULT 0,
    duplicates      bigint      NOT NULL DEFAULT 0,
    dead_letters    bigint      NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, partition)
);

-- One row per (source, UTC hour of event time) per load transaction: what
-- the transaction wrote. The reconciler reads windows of load_xid from here
-- instead of scanning raw rows.
CREATE TABLE tidemark.ingest_ledger (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source          text        NOT NULL,
    load_xid        xid8        NOT NULL,
    bucket          timestamptz NOT NULL,
    rows            bigint      NOT NULL,
    min_event_time  timestamptz NOT NULL,
    max_event_time  timestamptz NOT NULL,
    ingested_at     timestamptz NOT NULL
);
CREATE INDEX ingest_ledger_load_xid ON tidemark.ingest_ledger (load_xid);
CREATE INDEX ingest_ledger_source_bucket ON tidemark.ingest_ledger (source, bucket);

-- Input that could not be loaded, with its original bytes and the reason.
CREATE TABLE tidemark.dead_letters (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source           text        NOT NULL,
    reason           text        NOT NULL,
    detail           text        NOT NULL,
    topic            text,
    partition        integer,
    "offset"         bigint,
    record_key       bytea,
    record_value     bytea,
    header_keys      bytea[],
    header_values    bytea[],
    record_timestamp timestamptz,
    ingested_at      timestamptz NOT NULL,
    load_xid         xid8        NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX dead_letters_source_reason ON tidemark.dead_letters (source, reason);
CREATE INDEX dead_letters_coordinates ON tidemark.dead_letters (topic, partition, "offset");
