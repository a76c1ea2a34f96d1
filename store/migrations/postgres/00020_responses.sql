-- +goose Up
-- Runs started through the OpenAI Responses API (docs/openai-api.md): what
-- the request said that a run.start does not, written in the transaction
-- that starts the run. instructions is a system message for that run only
-- (the engine reads it with the run's input); the rest is returned as
-- given. A deleted thread's rows are emptied with its messages
-- (retention).
CREATE TABLE responses (
    run_id               TEXT PRIMARY KEY REFERENCES runs (run_id),
    model                TEXT NOT NULL,
    instructions         TEXT NOT NULL DEFAULT '',
    metadata             TEXT NOT NULL DEFAULT '{}',
    previous_response_id TEXT,
    background           BOOLEAN NOT NULL DEFAULT FALSE
);

-- +goose Down
DROP TABLE responses;
