-- Events recorded for an archived partition, whose raw rows retention
-- dropped, may be a producer's retry of an event that was among them and
-- is counted in the published rows already: such records say so.
ALTER TABLE tidemark.corrections ADD COLUMN possible_duplicate boolean NOT NULL DEFAULT false;
