package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// claimable runs wait for a worker: queued ones; running ones handed over
// (a confirmed tool call to commit, a tool step to finish after a crash);
// and cancelled ones whose commit must be reconciled before they end.
//
// The first two terms are the partial index runs_unleased's condition,
// word for word (SQLite uses a partial index only for a query that repeats
// its terms), and the rest is a CASE rather than an OR of statuses, which
// SQLite would answer through runs_by_status instead: reading every
// running run, leased or not, on every claim (migration 00011).
const claimable = `lease_owner IS NULL AND status NOT IN ('completed', 'failed', 'cancelled')
	AND CASE WHEN status IN ('queued', 'running') THEN TRUE
		WHEN status IN ('cancel_requested', 'cancelling') THEN EXISTS (SELECT 1 FROM operations o
			WHERE o.run_id = runs.run_id AND o.phase IN ('committing', 'unknown') AND o.result_ref IS NULL)
		ELSE FALSE END`

// claimSet is what a claim writes on the run it takes: running if it was
// queued, a new lease for the owner until the expiry (args: owner,
// lease_expires_at, updated_at), the next fencing epoch. ClaimBatch and a
// start that claims its own run (claimStarted) grant leases by it.
const claimSet = `status = CASE WHEN status = 'queued' THEN 'running' ELSE status END,
	lease_owner = ?, lease_expires_at = ?, lease_epoch = lease_epoch + 1, updated_at = ?`

// Claim hands the oldest claimable run to owner with a lease of ttl
// (granted by the lease clock, see txn.leaseClock) and the run's next
// epoch, and marks a queued run running. It returns nil when nothing is
// claimable. Claiming writes no event: the run's status changes, its
// thread's version does not. On PostgreSQL the candidate is locked with
// SKIP LOCKED: instances claiming at once each take another run instead of
// queueing behind one.
func (s *Store) Claim(ctx context.Context, owner string, ttl time.Duration) (*chat.Claim, error) {
	claims, err := s.ClaimBatch(ctx, owner, ttl, 1)
	if len(claims) == 0 {
		return nil, err
	}
	return claims[0], err
}

// ClaimsPerTransaction is the most runs ClaimBatch claims at once: 16 on
// SQLite, 1 on PostgreSQL (see ClaimBatch).
func (s *Store) ClaimsPerTransaction() int {
	if s.pg {
		return 1
	}
	return 16
}

// ClaimBatch is Claim of up to max runs, oldest first, in one transaction:
// a burst of runs started at once waits for one write instead of one
// each. On PostgreSQL it claims one: a claim holds its runs' rows until it
// commits, and another instance's cancel of one of them waits for that
// (the cluster benchmark's cross-instance cancel ack p99 went from 22 to
// 26–30 ms with batches of 16).
func (s *Store) ClaimBatch(ctx context.Context, owner string, ttl time.Duration, max int) ([]*chat.Claim, error) {
	max = min(max, s.ClaimsPerTransaction())
	perUser := s.perUser
	var out []*chat.Claim
	err := s.write(ctx, func(t *txn) error {
		out = nil
		start := time.Now()
		now, err := t.leaseClock()
		if err != nil {
			return err
		}
		// A cancel waiting for the writer stops the batch: it waits for a
		// claim or two, not sixteen.
		for len(out) < max && (len(out) == 0 || s.queue.waiting.Load() == 0) {
			var row runRow
			args := []any{owner, now + ttl.Milliseconds(), ms(t.now)}
			share := ""
			if perUser > 0 {
				share, args = ` AND (status <> 'queued' OR `+userExecuting(`runs.thread_id`)+` < ?)`,
					append(args, perUser)
			}
			err = t.get(&row, `UPDATE runs SET `+claimSet+`
				WHERE run_id = (SELECT run_id FROM runs WHERE `+claimable+share+` ORDER BY updated_at, run_id
				LIMIT 1`+t.skipLocked()+`)
				AND lease_owner IS NULL RETURNING `+runCols, args...)
			if errors.Is(err, sql.ErrNoRows) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("claim run: %w", err)
			}
			lease := chat.Lease{RunID: row.RunID, Owner: owner, Epoch: row.LeaseEpoch}
			if t.buf != nil {
				// (A claimed run has no lease: whatever took its last one —
				// a release, a hand-over, recovery — made the buffer forget
				// it, see runChanged.)
				if err := t.claimStream(lease, row.ThreadID); err != nil {
					return err
				}
				t.leaseHolds(lease, start, ttl)
			}
			out = append(out, &chat.Claim{Run: row.run(), Lease: lease})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// claimStream makes a claim the run's confirmation under its new lease
// (an older lease's entry is replaced) and reserves its thread's seqs, so
// that its first delta waits for no write — when the step it is claimed
// for is a model step. A tool step streams nothing: a reservation would
// only become a recorded gap at a crash, and send the thread's tabs a
// snapshot for nothing. (A crash between a model step's claim and its
// first delta does that: the price of the first delta not waiting.)
func (t *txn) claimStream(lease chat.Lease, threadID string) error {
	c, err := t.engineThread(threadID)
	if err != nil {
		return err
	}
	var pending sql.NullString
	if err := t.get(&pending, `SELECT pending FROM checkpoints WHERE checkpoint_id = ?`,
		c.row.HeadCheckpointID); err != nil {
		return fmt.Errorf("load the claimed step: %w", err)
	}
	var step chat.Pending
	if !pending.Valid || json.Unmarshal([]byte(pending.String), &step) != nil || step.Step != chat.StepGenerate {
		return nil // nothing to stream (or a step this cannot read: the slow path decides)
	}
	t.reserve(c, lease.Owner, true)
	t.confirmLive(lease, threadID, "")
	return nil
}

// RenewLeases extends, by ttl from the lease clock, each of the given
// leases that is still its run's current one on a live run. A lease not
// named here is not renewed: a run whose execution is gone expires and is
// recovered, also when the process that claimed it is alive.
func (s *Store) RenewLeases(ctx context.Context, leases []chat.Lease, ttl time.Duration) error {
	if len(leases) == 0 {
		return nil
	}
	return s.write(ctx, func(t *txn) error {
		start := time.Now()
		now, err := t.leaseClock()
		if err != nil {
			return err
		}
		for _, l := range leases {
			res, err := t.exec(
				`UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_owner = ? AND lease_epoch = ?
				AND status IN `+activeStatuses,
				now+ttl.Milliseconds(), l.RunID, l.Owner, l.Epoch,
			)
			if err != nil {
				return fmt.Errorf("renew lease of %s: %w", l.RunID, err)
			}
			if n, _ := res.RowsAffected(); n == 1 {
				t.leaseHolds(l, start, ttl)
			}
		}
		return nil
	})
}

// Recover settles runs whose execution is gone: every non-terminal run
// holding a lease that expired by the lease clock (see txn.leaseClock) —
// this process's own included, since it renews only the leases of
// executions it still runs — and, with foreignExpired (one instance: any
// other owner is a previous process), every lease of another owner. What
// happens is decided by the run's own records, never by whatever sits at
// the thread's head: a run whose last step checkpoint has nothing pending
// ends completed; one whose cancel was accepted ends cancelled; one
// waiting on a tool call is handed to a worker for it; otherwise its
// pending step is re-queued (attempt + 1) or, after maxAttempts, the run
// fails "interrupted". A commit that may have reached its system is
// handed to a worker to reconcile first.
func (s *Store) Recover(
	ctx context.Context,
	owner string,
	foreignExpired bool,
	maxAttempts int,
) ([]chat.Recovered, error) {
	now := ms(s.clock())
	if s.pg {
		if err := s.writer.GetContext(ctx, &now, dbClockSQL); err != nil {
			return nil, fmt.Errorf("read the database clock: %w", err)
		}
	}
	var ids []string
	q := `SELECT run_id FROM runs WHERE status IN ('running', 'cancel_requested', 'cancelling')
		AND lease_owner IS NOT NULL
		AND ((CAST(? AS BOOLEAN) AND lease_owner <> ?) OR lease_expires_at < ?)`
	if err := s.writer.SelectContext(ctx, &ids, s.writer.Rebind(q), foreignExpired, owner, now); err != nil {
		return nil, fmt.Errorf("find interrupted runs: %w", err)
	}
	// Cancels accepted while no worker held the run (queued, or between
	// attempts) are settled here as well.
	var orphans []string
	if err := s.writer.SelectContext(ctx, &orphans, s.writer.Rebind(`SELECT run_id FROM runs
		WHERE status IN ('cancel_requested', 'cancelling') AND lease_owner IS NULL
		AND NOT EXISTS (SELECT 1 FROM operations o
		WHERE o.run_id = runs.run_id AND o.phase IN ('committing', 'unknown') AND o.result_ref IS NULL)`)); err != nil {
		return nil, fmt.Errorf("find orphaned cancels: %w", err)
	}
	ids = append(ids, orphans...)
	var out []chat.Recovered
	for _, id := range ids {
		var action string
		err := s.write(ctx, func(t *txn) error {
			action = ""
			row, err := t.run(id)
			if err != nil {
				return err
			}
			if row.status().Terminal() {
				return nil
			}
			if row.LeaseOwner.Valid && !(foreignExpired && row.LeaseOwner.String != owner) {
				// Judged again inside the transaction: a lease renewed
				// since the candidates were listed is alive.
				now, err := t.leaseClock()
				if err != nil {
					return err
				}
				if row.LeaseExpiresAt.Valid && row.LeaseExpiresAt.Int64 >= now {
					return nil
				}
			}
			var openCommit int
			if err := t.get(&openCommit, `SELECT COUNT(*) FROM operations WHERE run_id = ?
				AND phase IN ('committing', 'unknown') AND result_ref IS NULL`, row.RunID); err != nil {
				return err
			}
			if openCommit > 0 && row.LeaseOwner.Valid {
				// A commit may have reached the external system: a worker
				// reconciles it by its key before the run goes on or ends.
				action = "handed over to reconcile"
				return t.handOver(row.RunID)
			}
			if row.status().CancelAccepted() {
				action = "cancelled"
				return t.finishCancel(row, 0)
			}
			if row.status() != chat.RunRunning {
				return nil
			}
			last, err := t.lastStep(row)
			if err != nil {
				return err
			}
			switch {
			case last != nil && last.Pending == nil:
				// Its last step was published; only the status was not.
				action = "completed"
				return t.finish(row, chat.RunCompleted, "")
			case last != nil && last.Pending.Step == chat.StepTool:
				// The tool step resumes with its operation (a runner tool
				// runs again under the same key).
				action = "handed over"
				return t.handOver(row.RunID)
			}
			if row.Attempt >= maxAttempts {
				action = "failed"
				return t.finish(row, chat.RunFailed, chat.ErrorInterrupted)
			}
			action = "requeued"
			if err := transition(row, chat.RunQueued); err != nil {
				return err
			}
			t.runChanged(row.RunID)
			_, err = t.exec(`UPDATE runs SET status = 'queued', attempt = attempt + 1, lease_owner = NULL,
				lease_expires_at = NULL, updated_at = ? WHERE run_id = ?`, ms(t.now), row.RunID)
			return err
		})
		if err != nil {
			return out, fmt.Errorf("recover run %s: %w", id, err)
		}
		if action != "" {
			out = append(out, chat.Recovered{RunID: id, Action: action})
		}
	}
	return out, nil
}

// lastStep is the checkpoint of the run's last published step (nil when
// it published none): the run's own record of how far it got.
func (t *txn) lastStep(row runRow) (*chat.Checkpoint, error) {
	var cp checkpointRow
	err := t.get(&cp, `SELECT `+checkpointCols+` FROM checkpoints WHERE thread_id = ? AND run_id = ?
		ORDER BY state_version DESC LIMIT 1`, row.ThreadID, row.RunID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load the run's last step: %w", err)
	}
	c, err := wholeCheckpoint(t.ctx, t.tx, t.cps, cp)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// handOver drops a run's lease so that a worker claims it (see claimable).
func (t *txn) handOver(runID string) error {
	t.runChanged(runID)
	_, err := t.exec(
		`UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL, updated_at = ? WHERE run_id = ?`,
		ms(t.now), runID,
	)
	return err
}
