-- Event ids loaded by Kafka sources with dedupe.by: event_id, written in
-- the batch transaction that loads the event. An id here whose loaded_at
-- is within the source's dedupe.window drops a later event with that id;
-- retention deletes ids past the window.
CREATE TABLE tidemark.event_ids (
    source    text        NOT NULL,
    event_id  text        COLLATE "C" NOT NULL,
    loaded_at timestamptz NOT NULL,
    PRIMARY KEY (source, event_id)
);
