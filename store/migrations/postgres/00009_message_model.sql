-- +goose Up
-- The model a reply was asked of (engine.Config.ModelName: "demo", or the
-- model name sent to an OpenAI-compatible server); '' for every other
-- message and for replies published before this column.
ALTER TABLE messages ADD COLUMN model TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE messages DROP COLUMN model;
