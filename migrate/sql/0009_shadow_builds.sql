-- Publishing a shadow build exactly once. A shadow run records, per
-- partition, the build it wrote into the shadow table, in the transaction
-- that wrote it; publishing marks the build published in the transaction
-- that swaps it in. A partition with no build, or whose build is already
-- published, is refused, so a publish run again (or resumed after an
-- interruption) never copies in a shadow that no longer holds what was
-- compared.
--
-- One row per aggregate partition a shadow run has built, replaced by the
-- next build of it; rows of builds older than retention.runs are pruned
-- (publishing them is refused anyway: the ledger may no longer show the
-- loads since).
CREATE TABLE tidemark.shadow_builds (
    aggregate       text        NOT NULL,
    partition_start timestamptz NOT NULL,
    partition_end   timestamptz NOT NULL,
    -- The shadow run that built it, and the snapshot it was built in:
    -- every load of a transaction below snapshot_xmin is in it.
    run_id          bigint      NOT NULL,
    snapshot_xmin   xid8        NOT NULL,
    -- Rows written into the shadow table: publishing checks that the
    -- shadow still holds as many.
    rows            bigint      NOT NULL,
    -- The partition was archived when it was built (backfill --force).
    archived        boolean     NOT NULL,
    built_at        timestamptz NOT NULL,
    published_at    timestamptz,
    published_run   bigint,
    PRIMARY KEY (aggregate, partition_start)
);
CREATE INDEX shadow_builds_built_at ON tidemark.shadow_builds (built_at);

-- The snapshot of a chunk's start is no longer what publishing reads:
-- each build records its own.
ALTER TABLE tidemark.backfill_chunks DROP COLUMN snapshot_xmin;
