-- State of the reconciler: load watermarks, claimed partitions, partition
-- status, arrival histories, corrections and source event-time watermarks.

-- The load watermark of each aggregate. Ledger mode: every ledger row with
-- load_xid below load_xid has been processed (its partitions rebuilt or
-- queued in pending_partitions). Timestamp mode: the newest ingestion time
-- read from the source table.
CREATE TABLE tidemark.load_watermarks (
    aggregate        text        PRIMARY KEY,
    source           text        NOT NULL,
    load_xid         xid8        NOT NULL DEFAULT '0',
    ingested_through timestamptz,
    -- Service time at which the watermark last moved, and of the last run.
    advanced_at      timestamptz,
    last_run_at      timestamptz,
    runs             bigint      NOT NULL DEFAULT 0
);

-- Partitions claimed for rebuilding: written in the same transaction that
-- advances the load watermark, deleted in the transaction that rebuilds.
CREATE TABLE tidemark.pending_partitions (
    aggregate       text        NOT NULL,
    partition_start timestamptz NOT NULL,
    partition_end   timestamptz NOT NULL,
    reason          text        NOT NULL,
    queued_at       timestamptz NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    PRIMARY KEY (aggregate, partition_start)
);

-- Status of every aggregate partition that has been built, for consumers:
-- open (event time has not passed its end), closed (it has; numbers may
-- still change), final (its lateness horizon has passed).
CREATE TABLE tidemark.partitions (
    aggregate       text        NOT NULL,
    partition_start timestamptz NOT NULL,
    partition_end   timestamptz NOT NULL,
    partition_key   text        NOT NULL,
    state           text        NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'final')),
    rows            bigint,
    rebuilt_at      timestamptz,
    rebuilds        bigint      NOT NULL DEFAULT 0,
    load_watermark  xid8,
    final_at        timestamptz NOT NULL,
    completeness    double precision,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (aggregate, partition_start)
);

-- How many of a partition's rows arrived by each age (ingestion time minus
-- the partition's end, rounded up to a step): the history behind the
-- completeness estimate.
CREATE TABLE tidemark.partition_arrivals (
    aggregate       text        NOT NULL,
    partition_start timestamptz NOT NULL,
    age_seconds     bigint      NOT NULL,
    rows            bigint      NOT NULL,
    PRIMARY KEY (aggregate, partition_start, age_seconds)
);

-- Events that arrived after their partition's lateness horizon, with the
-- whole raw row, for the correction and arrival policies.
CREATE TABLE tidemark.corrections (
    id                      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate               text        NOT NULL,
    policy                  text        NOT NULL,
    event_key               text        NOT NULL,
    event_partition_start   timestamptz NOT NULL,
    arrival_partition_start timestamptz NOT NULL,
    event_time              timestamptz NOT NULL,
    ingested_at             timestamptz NOT NULL,
    event                   jsonb       NOT NULL,
    recorded_at             timestamptz NOT NULL,
    UNIQUE (aggregate, event_key)
);
CREATE INDEX corrections_arrival ON tidemark.corrections (aggregate, arrival_partition_start);

-- The event-time watermark of each source, as of the last reconcile run.
CREATE TABLE tidemark.source_watermarks (
    source               text        PRIMARY KEY,
    event_time_watermark timestamptz,
    updated_at           timestamptz NOT NULL
);
