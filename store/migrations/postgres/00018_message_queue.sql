-- +goose Up
-- The message queue (docs/protocol.md "The message queue"): messages a
-- user wrote while a run was active, started one after another. An item
-- waits ('waiting'), started exactly one run ('started', run_id; the run
-- names it in queue_item_id, unique), or was removed ('removed'). Rows
-- stay after they leave the queue, so `gateway check` can verify
-- invariant 11 (an item starts at most one run, never after it was
-- removed). ord orders the waiting items of a thread (1 = next).
CREATE TABLE queue_items (
    item_id           TEXT PRIMARY KEY,
    thread_id         TEXT NOT NULL REFERENCES threads (thread_id),
    ord               INTEGER NOT NULL,
    user_message      TEXT NOT NULL,
    mode              TEXT NOT NULL,
    requested_by      TEXT NOT NULL,
    client_request_id TEXT,
    state             TEXT NOT NULL DEFAULT 'waiting',
    run_id            TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);
CREATE INDEX queue_items_waiting ON queue_items (thread_id, ord) WHERE state = 'waiting';
CREATE UNIQUE INDEX queue_items_request ON queue_items (thread_id, client_request_id)
    WHERE client_request_id IS NOT NULL;

-- Why the thread's queue is paused (NULL: it is not).
ALTER TABLE threads ADD COLUMN queue_paused_reason TEXT;

ALTER TABLE runs ADD COLUMN queue_item_id TEXT;
CREATE UNIQUE INDEX runs_queue_item ON runs (queue_item_id) WHERE queue_item_id IS NOT NULL;

-- +goose Down
DROP INDEX runs_queue_item;
ALTER TABLE runs DROP COLUMN queue_item_id;
ALTER TABLE threads DROP COLUMN queue_paused_reason;
DROP TABLE queue_items;
