-- +goose Up
-- Why a stream_gaps row's seqs were never written: 'stopped' (a process,
-- or the database, stopped before writing what it had handed out; recorded
-- at the next start or write) or 'written_past' (another instance wrote
-- past the reservation of a holder that did not answer, PostgreSQL; see
-- store/streambuf.go). A fragment refused over a gap says which. Rows
-- recorded before this migration say 'stopped', as their message did.
ALTER TABLE stream_gaps ADD COLUMN reason TEXT NOT NULL DEFAULT 'stopped';

-- +goose Down
ALTER TABLE stream_gaps DROP COLUMN reason;
