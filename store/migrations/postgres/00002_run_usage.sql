-- +goose Up
-- Token usage per run, when the model endpoint reports it.
ALTER TABLE runs ADD COLUMN prompt_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN completion_tokens BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE runs DROP COLUMN completion_tokens;
ALTER TABLE runs DROP COLUMN prompt_tokens;
