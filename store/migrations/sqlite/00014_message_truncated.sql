-- +goose Up
-- Why a reply is not the whole of what the model would have written
-- (chat.Message.Truncated): 'size_limit' when it was cut at the size
-- limit; '' for every other message and for replies published before
-- this column.
ALTER TABLE messages ADD COLUMN truncated TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE messages DROP COLUMN truncated;
