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
-- any checkpoint is stored appended; a database this version never wrote
-- to goes down.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM checkpoints WHERE appended = 1) THEN
        RAISE EXCEPTION 'checkpoints are stored appended to their parents (migration 16): a version before it cannot read them';
    END IF;
END $$;
-- +goose StatementEnd
ALTER TABLE checkpoints DROP COLUMN appended;
