-- The source position of the last truncate each Debezium source applied to
-- its mirror, written in the batch transaction that applies it. A change at
-- or below it is not applied to the mirror: it was truncated, even when it
-- is read after the truncate (from another partition, or sent again).
CREATE TABLE tidemark.debezium_truncates (
    source       text        PRIMARY KEY,
    position     bigint[]    NOT NULL,
    truncated_at timestamptz NOT NULL
);
