-- +goose Up
-- Retention per artifact class (see store/retention.go).
--
-- The event log is purged per thread as a prefix of seqs. The watermark
-- says what went, so `check` tells "purged" from "missing" and a replay
-- from before it answers with a snapshot:
--   events_purged_through  the seq of the last durable event deleted (0: none);
--                          no event at or below it remains
--   events_purged_version  that event's state_version
--   events_purged_ts       the latest ts of any deleted event
ALTER TABLE threads ADD COLUMN events_purged_through BIGINT NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN events_purged_version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN events_purged_ts BIGINT NOT NULL DEFAULT 0;

-- Which threads may hold copies of a message's id: its own and the forks
-- descending from it.
CREATE INDEX threads_by_fork_source ON threads (forked_from_thread_id);

-- A deleted draft keeps its row (audit) until the draft TTL, then loses its
-- text: deleted_at is when it left history, redacted_at when its text went.
ALTER TABLE messages ADD COLUMN deleted_at BIGINT;
ALTER TABLE messages ADD COLUMN redacted_at BIGINT;

-- Drafts deleted before this migration: their message.deleted event says when.
UPDATE messages SET deleted_at = (SELECT MAX(e.ts) FROM events e
    WHERE e.message_id = messages.message_id AND e.type = 'message.deleted')
WHERE kind = 'fragment';

CREATE INDEX messages_deleted ON messages (deleted_at) WHERE deleted_at IS NOT NULL AND redacted_at IS NULL;

CREATE INDEX cancel_audit_by_time ON cancel_audit (requested_at);

-- +goose Down
DROP INDEX cancel_audit_by_time;
DROP INDEX messages_deleted;
ALTER TABLE messages DROP COLUMN redacted_at;
ALTER TABLE messages DROP COLUMN deleted_at;
DROP INDEX threads_by_fork_source;
ALTER TABLE threads DROP COLUMN events_purged_ts;
ALTER TABLE threads DROP COLUMN events_purged_version;
ALTER TABLE threads DROP COLUMN events_purged_through;
