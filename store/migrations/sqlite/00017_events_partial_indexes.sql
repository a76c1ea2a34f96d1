-- +goose Up
-- events_by_run and events_by_message are looked up by equality only
-- (retention), so events without a run or a message need no entry. With
-- one, every commit wrote two leaves of each index as the log grew: one
-- at the end of the NULL keys (ordered by rowid there) and one at the end
-- of the ids (issue 31: bytes written per exchange growing with the
-- conversation).
DROP INDEX events_by_run;
CREATE INDEX events_by_run ON events (run_id, seq) WHERE run_id IS NOT NULL;
DROP INDEX events_by_message;
CREATE INDEX events_by_message ON events (message_id) WHERE message_id IS NOT NULL;

-- +goose Down
DROP INDEX events_by_message;
CREATE INDEX events_by_message ON events (message_id);
DROP INDEX events_by_run;
CREATE INDEX events_by_run ON events (run_id, seq);
