-- Months of running: retention of raw partitions and state rows, archived
-- aggregate partitions, backoff of failing rebuilds, scheduled verification
-- and publishing what a shadow run built.

-- An aggregate partition is archived once raw rows it was built from have
-- been dropped by retention: its published rows are then the only copy,
-- and nothing rebuilds it from what is left.
ALTER TABLE tidemark.partitions DROP CONSTRAINT partitions_state_check;
ALTER TABLE tidemark.partitions ADD CONSTRAINT partitions_state_check
    CHECK (state IN ('open', 'closed', 'final', 'archived'));
ALTER TABLE tidemark.partitions ADD COLUMN archived_at timestamptz;

-- Per source: raw rows with an event time before retained_from have been
-- dropped (whole partitions, oldest first). It only moves forward, in the
-- transaction that drops a partition and archives the aggregate partitions
-- the partition fed.
CREATE TABLE tidemark.raw_retention (
    source             text        PRIMARY KEY,
    retained_from      timestamptz NOT NULL,
    partitions_dropped bigint      NOT NULL DEFAULT 0,
    bytes_dropped      bigint      NOT NULL DEFAULT 0,
    updated_at         timestamptz NOT NULL
);

-- A partition whose rebuild keeps failing is retried with a growing delay:
-- failing_since is the service time of the first failure in a row, and the
-- reconciler leaves the partition alone until next_attempt_at.
ALTER TABLE tidemark.pending_partitions
    ADD COLUMN failing_since   timestamptz,
    ADD COLUMN next_attempt_at timestamptz;

-- Every reconcile run adds to the arrival counts of recent partitions and
-- moves partitions' states: room on each page keeps those updates on the
-- page (no new index entries), so the tables do not bloat between vacuums.
ALTER TABLE tidemark.partition_arrivals SET (fillfactor = 80);
ALTER TABLE tidemark.partitions SET (fillfactor = 80);

-- Retention deletes state rows by age, in batches, through these indexes.
-- The ledger needs none of its own: its rows go below the aggregates' load
-- watermarks, through the load_xid index. Nothing reads the ledger by
-- bucket without a bound on load_xid either (the loads above a watermark
-- or a snapshot are few), so the bucket index, which every load paid for
-- and whose pages late events kept half empty, goes.
DROP INDEX tidemark.ingest_ledger_source_bucket;
CREATE INDEX dead_letters_source_ingested_at ON tidemark.dead_letters (source, ingested_at);
CREATE INDEX corrections_recorded_at ON tidemark.corrections (aggregate, recorded_at);

-- The snapshot a chunk was built in: pg_snapshot_xmin when its first
-- partition was built. Publishing a shadow partition queues it again when
-- loads at or above it touched the partition.
ALTER TABLE tidemark.backfill_chunks ADD COLUMN snapshot_xmin xid8;
ALTER TABLE tidemark.backfill_runs DROP CONSTRAINT backfill_runs_kind_check;
ALTER TABLE tidemark.backfill_runs ADD CONSTRAINT backfill_runs_kind_check
    CHECK (kind IN ('backfill', 'refresh', 'shadow', 'publish'));

-- One row per verification of an aggregate (`tidemark verify`, or the
-- schedule inside `tidemark run`): what was compared and what differed.
CREATE TABLE tidemark.verify_runs (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate        text        NOT NULL,
    scheduled        boolean     NOT NULL,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    partitions       integer     NOT NULL DEFAULT 0,
    drifted          integer     NOT NULL DEFAULT 0,
    skipped_queued   integer     NOT NULL DEFAULT 0,
    skipped_archived integer     NOT NULL DEFAULT 0,
    error            text
);
CREATE INDEX verify_runs_aggregate ON tidemark.verify_runs (aggregate, id);
