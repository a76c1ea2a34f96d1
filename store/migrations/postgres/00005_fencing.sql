-- +goose Up
-- Fencing, reconciliation after a run ends, and the stream buffer's purge
-- mark (see store/runs.go, store/reconcile.go, store/stream.go).

-- Every claim of a run takes the next epoch; an execution names the epoch it
-- claimed in every write, and a write naming an older one is refused, so an
-- execution that lost its lease (a pause, a partition, a skewed clock) can
-- never publish, even in the process that claimed the run again.
ALTER TABLE runs ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;

-- When an operation was first handed to its external system (entered
-- committing). From then on nothing may report it not_started.
ALTER TABLE operations ADD COLUMN commit_started_at BIGINT;
-- An outcome left unknown is looked up by its key until the provider
-- answers or reconcile_until passes: reconcile_next_at is the next lookup
-- (NULL: none scheduled), reconcile_tries how many were made.
ALTER TABLE operations ADD COLUMN reconcile_next_at BIGINT;
ALTER TABLE operations ADD COLUMN reconcile_until BIGINT;
ALTER TABLE operations ADD COLUMN reconcile_tries INTEGER NOT NULL DEFAULT 0;

-- Outcomes left unknown before this migration are looked up from now on,
-- for the default horizon (24 h).
UPDATE operations SET reconcile_next_at = CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT), reconcile_until = CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) + 86400000
WHERE phase = 'unknown';

CREATE INDEX operations_reconcile ON operations (reconcile_next_at) WHERE reconcile_next_at IS NOT NULL;

-- Operations that reached their system before this migration.
UPDATE operations SET commit_started_at = updated_at
WHERE contract = 'consequential' AND phase IN ('committing', 'committed', 'unknown', 'reconciled');

-- The stream buffer is purged per thread as a prefix of seqs: no delta with
-- a seq at or below deltas_purged_through remains. A seq missing from the
-- log at or below it is a purged delta (a missing durable event shows as a
-- gap in state_version). Threads purged before this migration: everything
-- below their oldest remaining delta went; without one, every delta may have.
ALTER TABLE threads ADD COLUMN deltas_purged_through BIGINT NOT NULL DEFAULT 0;
UPDATE threads SET deltas_purged_through = COALESCE(
    (SELECT MIN(d.seq) - 1 FROM stream_deltas d WHERE d.thread_id = threads.thread_id), last_seq);

-- +goose Down
ALTER TABLE threads DROP COLUMN deltas_purged_through;
DROP INDEX operations_reconcile;
ALTER TABLE operations DROP COLUMN reconcile_tries;
ALTER TABLE operations DROP COLUMN reconcile_until;
ALTER TABLE operations DROP COLUMN reconcile_next_at;
ALTER TABLE operations DROP COLUMN commit_started_at;
ALTER TABLE runs DROP COLUMN lease_epoch;
