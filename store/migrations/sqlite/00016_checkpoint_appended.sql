-- +goose Up
-- A checkpoint's lists (message_ids, completed_steps, tool_results) are
-- stored either whole (appended = 0; every row written before this
-- migration) or as what the checkpoint appended to its parent's lists
-- (appended = 1; the parent is a checkpoint of the same thread). So a
-- checkpoint written as a conversation grows costs the same bytes at its
-- thousandth exchange as at its tenth. store/checkpoints.go reads them
-- whole again.
ALTER TABLE checkpoints ADD COLUMN appended INTEGER NOT NULL DEFAULT 0;

-- +goose Down
-- A version before this migration would read an appended row's lists as
-- whole ones: silently short histories. So going down is refused while
-- any checkpoint is stored appended (the CHECK below fails, naming
-- itself); a database this version never wrote to goes down.
CREATE TEMP TABLE down_guard (appended_rows INTEGER
    CONSTRAINT checkpoints_stored_appended_cannot_go_down CHECK (appended_rows = 0));
INSERT INTO down_guard SELECT COUNT(*) FROM checkpoints WHERE appended = 1;
DROP TABLE down_guard;
ALTER TABLE checkpoints DROP COLUMN appended;
