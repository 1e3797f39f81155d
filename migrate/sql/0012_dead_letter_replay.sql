-- Dead letters loaded again by `tidemark dead-letters replay` are marked,
-- in the transaction that loads them, instead of deleted: NULL means not
-- replayed. Retention still removes them by ingested_at.
ALTER TABLE tidemark.dead_letters ADD COLUMN replayed_at timestamptz;

-- A replay reads a source's dead letters not yet replayed, in id order.
CREATE INDEX dead_letters_not_replayed ON tidemark.dead_letters (source, id) WHERE replayed_at IS NULL;
