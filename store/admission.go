package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// userExecuting is a scalar subquery: how many runs of the user who owns
// the thread named by the SQL expression threadID are executing (leased
// and not ended), on any instance. Options.MaxRunsPerUser compares it.
func userExecuting(threadID string) string {
	return `(SELECT count(*) FROM threads this_thread JOIN threads mine ON mine.user_id = this_thread.user_id
		JOIN runs held ON held.thread_id = mine.thread_id
		WHERE this_thread.thread_id = ` + threadID + ` AND held.lease_owner IS NOT NULL
		AND held.status NOT IN ('completed', 'failed', 'cancelled'))`
}

// QueueState tells where a run waiting for a worker stands (docs/protocol.md
// "Admission"): its place in the claim order (1 = the next claimed; 0
// when the run is not queued or is claimed already), counting only the
// runs a claim would take before it (runs handed over between steps, and
// queued runs of users below their share or of the same user); and
// whether its user has their share of runs executing already
// (Options.MaxRunsPerUser), so that it waits whatever slots are free. It
// is one read: the answer may be stale by the time it is used. The engine
// decides from it and its free slots whether the run waits
// (engine.QueuePosition).
func (s *Store) QueueState(ctx context.Context, runID string) (position int, atShare bool, err error) {
	err = s.read(ctx, func(q *sqlx.Tx) error {
		var row struct {
			Status    string         `db:"status"`
			Owner     sql.NullString `db:"lease_owner"`
			UpdatedAt int64          `db:"updated_at"`
			ThreadID  string         `db:"thread_id"`
		}
		err := q.GetContext(
			ctx, &row,
			q.Rebind(`SELECT status, lease_owner, updated_at, thread_id FROM runs WHERE run_id = ?`),
			runID,
		)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && (row.Status != string(chat.RunQueued) || row.Owner.Valid)) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("load run: %w", err)
		}
		older := ` AND (updated_at < ? OR (updated_at = ? AND run_id < ?))`
		var ahead int
		if err := q.GetContext(ctx, &ahead, q.Rebind(`SELECT count(*) FROM runs WHERE `+claimable+older),
			row.UpdatedAt, row.UpdatedAt, runID); err != nil {
			return fmt.Errorf("count the runs ahead: %w", err)
		}
		if s.perUser > 0 {
			var executing int
			if err := q.GetContext(ctx, &executing, q.Rebind(`SELECT `+userExecuting(`?`)), row.ThreadID); err != nil {
				return fmt.Errorf("count the user's runs: %w", err)
			}
			atShare = executing >= s.perUser
		}
		if s.perUser > 0 && ahead > 0 {
			// The other users at their share, found once from the
			// executing runs (at most the workers of every instance)
			// rather than asked of every run ahead, and only when runs
			// are ahead: their queued runs are passed over, but for this
			// run's own user, whose runs ahead go first anyway.
			var others []string
			if err := q.SelectContext(ctx, &others, q.Rebind(`SELECT t.user_id FROM runs r JOIN threads t
				ON t.thread_id = r.thread_id
				WHERE r.lease_owner IS NOT NULL AND r.status NOT IN ('completed', 'failed', 'cancelled')
				AND t.user_id <> (SELECT user_id FROM threads WHERE thread_id = ?)
				GROUP BY t.user_id HAVING count(*) >= ?`), row.ThreadID, s.perUser); err != nil {
				return fmt.Errorf("find the users at their share: %w", err)
			}
			if len(others) > 0 {
				var passed int
				in := strings.TrimSuffix(strings.Repeat("?, ", len(others)), ", ")
				args := []any{row.UpdatedAt, row.UpdatedAt, runID}
				for _, u := range others {
					args = append(args, u)
				}
				if err := q.GetContext(ctx, &passed, q.Rebind(`SELECT count(*) FROM runs WHERE status = 'queued'
					AND lease_owner IS NULL`+older+`
					AND thread_id IN (SELECT thread_id FROM threads WHERE user_id IN (`+in+`))`), args...); err != nil {
					return fmt.Errorf("count the runs passed over: %w", err)
				}
				ahead -= passed
			}
		}
		position = ahead + 1
		return nil
	})
	return position, atShare, err
}

// QueuedRuns counts the queued runs no instance has claimed yet.
func (s *Store) QueuedRuns(ctx context.Context) (int, error) {
	var n int
	err := s.reader.GetContext(ctx, &n, `SELECT count(*) FROM runs WHERE status = 'queued' AND lease_owner IS NULL`)
	if err != nil {
		return 0, fmt.Errorf("count queued runs: %w", err)
	}
	return n, nil
}
