-- State of poll sources (timestamp-watermark table loads) and of key
-- reconciliation (hard-delete detection) for mirror tables.

-- The high watermark of each poll source: the newest updated_at loaded.
-- A run locks its row, so two overlapping runs cannot both advance it; it
-- moves only forward, in the transaction that merged the rows it covers.
CREATE TABLE tidemark.poll_watermarks (
    source          text        PRIMARY KEY,
    high_watermark  timestamptz NOT NULL DEFAULT '-infinity',
    -- The upper bound of the last run's window, and when it ran (service
    -- time); advanced_at is when the watermark last moved.
    last_upper      timestamptz,
    last_run_at     timestamptz,
    advanced_at     timestamptz,
    runs            bigint      NOT NULL DEFAULT 0,
    rows_read       bigint      NOT NULL DEFAULT 0,
    rows_merged     bigint      NOT NULL DEFAULT 0
);

-- One row per key reconciliation of a mirror: what was compared, what was
-- transferred and what was found.
CREATE TABLE tidemark.key_reconciliations (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source            text        NOT NULL,
    mirror            text        NOT NULL,
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz NOT NULL,
    dry_run           boolean     NOT NULL,
    mode              text        NOT NULL,
    source_keys       bigint      NOT NULL,
    mirror_keys       bigint      NOT NULL,
    ranges_compared   bigint      NOT NULL,
    keys_transferred  bigint      NOT NULL,
    missing_at_source bigint      NOT NULL,
    missing_in_mirror bigint      NOT NULL,
    applied           bigint      NOT NULL
);
CREATE INDEX key_reconciliations_source ON tidemark.key_reconciliations (source, id);
