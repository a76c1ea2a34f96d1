-- +goose Up
-- thread.delete: when the conversation was deleted (NULL while it is not).
-- A deleted thread answers not_found to its owner too; its last event is
-- thread.deleted. Its text stays until -draft-ttl has passed, then
-- retention empties it (redacted_at: when it did; see RedactDeletedThreads).
ALTER TABLE threads ADD COLUMN deleted_at BIGINT;
ALTER TABLE threads ADD COLUMN redacted_at BIGINT;
CREATE INDEX threads_deleted ON threads (deleted_at) WHERE deleted_at IS NOT NULL AND redacted_at IS NULL;

-- +goose Down
DROP INDEX threads_deleted;
ALTER TABLE threads DROP COLUMN redacted_at;
ALTER TABLE threads DROP COLUMN deleted_at;
