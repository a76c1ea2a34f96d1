-- +goose Up
-- A claim looks for the oldest run without a lease that is not over
-- (store/runs.go, claimable). Through runs_by_status it read every running
-- run, leased or not, on every claim: O(runs streaming) per claim, half a
-- millisecond of the single writer's time per claim with 500 streaming.
-- This index holds only runs without a lease that are not over: a handful.
CREATE INDEX runs_unleased ON runs (updated_at, run_id)
    WHERE lease_owner IS NULL AND status NOT IN ('completed', 'failed', 'cancelled');

-- +goose Down
DROP INDEX runs_unleased;
