-- Backfills and full refreshes: rebuilds of an explicit range of an
-- aggregate's partitions, in chunks, through the reconciler's rebuild
-- code. They never move the load watermark.

-- One row per backfill, refresh or shadow run. A shadow run writes the
-- aggregate's shadow table only; its chunks do not count as built.
CREATE TABLE tidemark.backfill_runs (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate       text        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('backfill', 'refresh', 'shadow')),
    range_start     timestamptz NOT NULL,
    range_end       timestamptz NOT NULL,
    chunk           text        NOT NULL,
    reprocess       text        NOT NULL CHECK (reprocess IN ('missing', 'failed', 'completed')),
    concurrency     integer     NOT NULL,
    status          text        NOT NULL CHECK (status IN ('running', 'done', 'failed', 'interrupted')),
    chunks          integer     NOT NULL,
    chunks_done     integer     NOT NULL DEFAULT 0,
    chunks_failed   integer     NOT NULL DEFAULT 0,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz
);
CREATE INDEX backfill_runs_aggregate ON tidemark.backfill_runs (aggregate, id);

-- One row per chunk a run planned to rebuild: [chunk_start, chunk_end)
-- holds whole partitions, each rebuilt in its own transaction. A chunk the run
-- skipped (see reprocess) has no row.
CREATE TABLE tidemark.backfill_chunks (
    run_id          bigint      NOT NULL REFERENCES tidemark.backfill_runs (id) ON DELETE CASCADE,
    chunk_start     timestamptz NOT NULL,
    chunk_end       timestamptz NOT NULL,
    partitions      integer     NOT NULL,
    status          text        NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    rows            bigint,
    error           text,
    started_at      timestamptz,
    finished_at     timestamptz,
    PRIMARY KEY (run_id, chunk_start)
);
