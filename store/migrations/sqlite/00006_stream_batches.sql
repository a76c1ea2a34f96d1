-- +goose Up
-- The stream buffer holds one row per batch of a streamed message's deltas
-- (the deltas one AppendDeltas call wrote, consecutive seqs first_seq ..
-- last_seq, parts first_part .. first_part + count - 1), their texts a JSON
-- array of strings in seq order: one row and two index entries per batch
-- instead of per delta. ts is the first delta's; ts_offsets, when the
-- deltas' times differ, a JSON array of each one's offset from it in ms.
-- Existing deltas become batches of one.
CREATE TABLE stream_batches (
    thread_id  TEXT NOT NULL,
    first_seq  BIGINT NOT NULL,
    last_seq   BIGINT NOT NULL,
    run_id     TEXT NOT NULL,
    message_id TEXT NOT NULL,
    first_part INTEGER NOT NULL,
    texts      TEXT NOT NULL,
    ts         BIGINT NOT NULL,
    ts_offsets TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, first_seq)
);

CREATE INDEX stream_batches_by_message ON stream_batches (message_id, first_seq);
CREATE INDEX stream_batches_by_ts ON stream_batches (ts);

INSERT INTO stream_batches (thread_id, first_seq, last_seq, run_id, message_id, first_part, texts, ts)
SELECT thread_id, seq, seq, run_id, message_id, part, json_array(text), ts FROM stream_deltas;

DROP TABLE stream_deltas;

-- +goose Down
CREATE TABLE stream_deltas (
    thread_id  TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    run_id     TEXT NOT NULL,
    message_id TEXT NOT NULL,
    part       INTEGER NOT NULL,
    text       TEXT NOT NULL,
    ts         BIGINT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);
CREATE INDEX stream_deltas_by_message ON stream_deltas (message_id, seq);
CREATE INDEX stream_deltas_by_ts ON stream_deltas (ts);
INSERT INTO stream_deltas (thread_id, seq, run_id, message_id, part, text, ts)
SELECT b.thread_id, b.first_seq + j.key, b.run_id, b.message_id, b.first_part + j.key, j.value, b.ts
FROM stream_batches b, json_each(b.texts) j;
DROP TABLE stream_batches;
