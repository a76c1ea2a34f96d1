-- +goose Up
-- A run's end counts the streamed text it did not publish, and a snapshot
-- finds the message in flight, by the run's published messages: without
-- an index each scanned the whole messages table (13 % of the server's CPU
-- in the storage benchmark).
CREATE INDEX messages_by_run ON messages (run_id);

-- +goose Down
DROP INDEX messages_by_run;
