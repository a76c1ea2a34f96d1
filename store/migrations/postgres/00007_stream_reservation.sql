-- +goose Up
-- Deltas are fanned out before they are written (see store/streambuf.go):
-- a thread's seqs up to seq_reserved may be handed out without another
-- write, so after a crash nothing below it is reused. The seqs a crash
-- lost (handed out, never written) are recorded in stream_gaps at the next
-- start: the log itself then says why they are absent (invariant 8).
ALTER TABLE threads ADD COLUMN seq_reserved BIGINT NOT NULL DEFAULT 0;

CREATE TABLE stream_gaps (
    thread_id   TEXT COLLATE "C" NOT NULL,
    first_seq   BIGINT NOT NULL,
    last_seq    BIGINT NOT NULL,
    recorded_at BIGINT NOT NULL,
    PRIMARY KEY (thread_id, first_seq)
);

-- +goose Down
DROP TABLE stream_gaps;
ALTER TABLE threads DROP COLUMN seq_reserved;
