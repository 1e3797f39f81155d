-- The partitions that can still change (open or closed) are few among all
-- an aggregate has built; the reconciler moves them through their states
-- on every run and the metrics count them at every scrape. A partial index
-- keeps both off the final partitions, which grow by one a day (or hour).
CREATE INDEX partitions_moving ON tidemark.partitions (aggregate, state) WHERE state IN ('open', 'closed');
