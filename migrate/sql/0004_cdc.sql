-- State of CDC sources (logical replication).

-- One row per CDC source: where applying stands, written in the same
-- transaction as the changes it covers. applied_lsn is the end of the
-- last source transaction applied; on restart, transactions that end at or
-- below it are skipped. confirmed_lsn is the last position confirmed to the
-- slot, which also advances while no tracked change is pending.
CREATE TABLE tidemark.cdc_positions (
    source            text        PRIMARY KEY,
    slot              text        NOT NULL,
    system_id         text        NOT NULL,
    slot_created_lsn  pg_lsn,
    snapshot          text        NOT NULL CHECK (snapshot IN ('pending', 'done', 'skipped')),
    applied_lsn       pg_lsn      NOT NULL DEFAULT '0/0',
    confirmed_lsn     pg_lsn      NOT NULL DEFAULT '0/0',
    last_commit_time  timestamptz,
    transactions      bigint      NOT NULL DEFAULT 0,
    changes           bigint      NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL
);
