-- The sources an operator paused (tidemark pause), one row per paused
-- source, deleted by tidemark resume. Every instance reads the table every
-- few seconds: a paused source's Kafka topics are not fetched, its CDC
-- reader leaves its slot unread, its poll runs are skipped.
CREATE TABLE tidemark.source_pauses (
    source    text        PRIMARY KEY,
    paused_at timestamptz NOT NULL,
    paused_by text        NOT NULL,
    reason    text        NOT NULL DEFAULT ''
);
