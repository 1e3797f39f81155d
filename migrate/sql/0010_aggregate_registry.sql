-- The aggregates the warehouse has reconciled, as the configuration that
-- last prepared each one defined it. Retention keeps what every one of
-- them needs, whether or not the configuration of the instance pruning
-- names it: an aggregate removed from a configuration (and maybe added
-- back), or configured only on an instance with another configuration,
-- still has its partitions' raw rows kept until they are final for it,
-- not queued and read, and its unread ledger rows kept, until it returns
-- or `tidemark forget` removes its state.
ALTER TABLE tidemark.load_watermarks
    ADD COLUMN partition_by     text,
    ADD COLUMN time_zone        text,
    ADD COLUMN lateness_horizon interval,
    ADD COLUMN beyond_horizon   text,
    -- Service time at which a configuration last changed the above.
    ADD COLUMN defined_at       timestamptz;
