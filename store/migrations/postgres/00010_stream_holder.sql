-- +goose Up
-- Which process holds a thread's reserved seqs (seq_reserved above
-- last_seq): the run lease owner that reserved them ('' when none). On
-- PostgreSQL several instances write one thread: another instance that
-- must write the thread asks the holder to write its pending deltas and
-- give the reservation back first, or, when the holder does not answer,
-- records the reservation as a gap and writes past it (store/streambuf.go).
ALTER TABLE threads ADD COLUMN seq_holder TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE threads DROP COLUMN seq_holder;
