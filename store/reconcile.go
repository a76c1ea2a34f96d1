package store

import (
	"context"
	"fmt"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Reconciliation of outcomes nobody saw (invariant 10).
//
// A consequential call whose answer was lost (a timeout, a 5xx, a crash
// between the call and its record) may have acted. Its operation is
// unknown, and stays unknown — a cancel never turns it into not_started —
// until its provider says, by the idempotency key, that the key acted. An
// operation entering unknown is scheduled here: reconcile_next_at is the
// next lookup, reconcile_until the horizon after which the gateway stops
// asking (the receipt then says so, and only the provider's own records
// can tell). While its run's worker still works on the call, the worker
// looks the key up itself; once the worker let go of it (the unknown
// outcome is recorded as the call's result, or the run ended), the
// engine's reconciler takes over: DueReconciliations hands out the
// lookups that are due and SettleReconciliation records each answer.
// Every change is reported with tool.updated, also after the run ended.

// DefaultReconcileHorizon is Options.ReconcileHorizon's default.
const DefaultReconcileHorizon = 24 * time.Hour

// reconcileDelay is the wait before lookup number tries+1: 1 s, doubling,
// at most 5 minutes.
func reconcileDelay(tries int) time.Duration {
	if tries >= 9 {
		return 5 * time.Minute
	}
	return min(time.Second<<tries, 5*time.Minute)
}

// reconcileClaim is how long a lookup handed out by DueReconciliations is
// not handed out again (a reconciler that died meanwhile leaves it to the
// next one after that).
const reconcileClaim = time.Minute

// settleOpenOperations settles what a run leaves open when it ends
// (completed, failed or cancelled), so that no call stays in flight
// without an owner:
// an intent never sent is voided (not_started), a tool call nobody runs
// any more is aborted, and a commit that may have reached its system
// becomes unknown and is reconciled from here on.
func (t *txn) settleOpenOperations(c *threadCursor, runID string) error {
	var open []struct {
		OperationID string `db:"operation_id"`
		Phase       string `db:"phase"`
	}
	if err := t.sel(&open, `SELECT operation_id, phase FROM operations WHERE run_id = ?
		AND phase IN ('prepared', 'confirmed', 'running', 'committing', 'unknown') AND result_ref IS NULL
		ORDER BY created_at, operation_id`, runID); err != nil {
		return fmt.Errorf("list open operations: %w", err)
	}
	for _, op := range open {
		var err error
		switch op.Phase {
		case chat.PhasePrepared, chat.PhaseConfirmed:
			err = t.setPhase(c, op.OperationID, chat.PhaseVoided, chat.OutcomeNotStarted)
		case chat.PhaseRunning:
			err = t.setPhase(c, op.OperationID, chat.PhaseAborted, chat.OutcomeAborted)
		case chat.PhaseCommitting:
			err = t.setPhase(c, op.OperationID, chat.PhaseUnknown, chat.OutcomeUnknown)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// DueReconciliations hands out up to limit operations whose outcome is
// unknown, whose worker let go of them, and whose next lookup is due by
// now; each is not handed out again for a minute (SettleReconciliation
// sets its real next time). On PostgreSQL instances take different ones.
func (s *Store) DueReconciliations(ctx context.Context, limit int) ([]chat.Operation, error) {
	var out []chat.Operation
	err := s.write(ctx, func(t *txn) error {
		out = nil
		var rows []operationRow
		if err := t.sel(&rows, `SELECT `+operationCols+` FROM operations WHERE phase = 'unknown'
			AND reconcile_next_at IS NOT NULL AND reconcile_next_at <= ?
			AND (result_ref IS NOT NULL OR EXISTS (SELECT 1 FROM runs r WHERE r.run_id = operations.run_id
				AND r.status IN `+terminalStatuses+`))
			ORDER BY reconcile_next_at, operation_id LIMIT ?`+t.skipLocked(), ms(t.now), limit); err != nil {
			return fmt.Errorf("list due reconciliations: %w", err)
		}
		for _, r := range rows {
			if _, err := t.exec(`UPDATE operations SET reconcile_next_at = ? WHERE operation_id = ?`,
				ms(t.now.Add(reconcileClaim)), r.OperationID); err != nil {
				return fmt.Errorf("claim reconciliation: %w", err)
			}
			out = append(out, r.operation())
		}
		return nil
	})
	return out, err
}

// SettleReconciliation records one lookup of an unknown operation: the
// provider knows the key (chat.LookupFound) → reconciled, committed
// (tool.updated); it does not know it, or could not be asked this time →
// the next lookup is scheduled with backoff, or, past the horizon, the
// gateway gives up asking (tool.updated: still unknown, no next lookup);
// it can never be asked (chat.LookupImpossible) → the gateway gives up
// now, the same way. An operation settled meanwhile is left alone. It
// reports the operation as it now is.
func (s *Store) SettleReconciliation(ctx context.Context, opID string, found chat.Lookup) (chat.Operation, error) {
	var out chat.Operation
	err := s.write(ctx, func(t *txn) error {
		op, err := t.operation(opID)
		if err != nil {
			return err
		}
		c, err := t.engineThread(op.ThreadID)
		if err != nil {
			return err
		}
		if op, err = t.operation(opID); err != nil { // again, under the thread's lock
			return err
		}
		out = op.operation()
		if op.Phase != chat.PhaseUnknown || !op.ReconcileNextAt.Valid {
			return nil
		}
		now := ms(t.now)
		switch {
		case found == chat.LookupFound:
			if _, err := t.exec(`UPDATE operations SET phase = 'reconciled', outcome = 'committed',
				reconcile_next_at = NULL,
				reconcile_tries = reconcile_tries + 1, updated_at = ? WHERE operation_id = ?`, now, opID); err != nil {
				return fmt.Errorf("record reconciliation: %w", err)
			}
		case found == chat.LookupImpossible,
			op.ReconcileUntil.Valid && now+reconcileDelay(op.ReconcileTries+1).Milliseconds() > op.ReconcileUntil.Int64:
			// Past the horizon, or nothing to ask: stop asking, and say so.
			if _, err := t.exec(`UPDATE operations SET reconcile_next_at = NULL, reconcile_tries = reconcile_tries + 1,
				updated_at = ? WHERE operation_id = ?`, now, opID); err != nil {
				return fmt.Errorf("end reconciliation: %w", err)
			}
		default:
			_, err := t.exec(`UPDATE operations SET reconcile_next_at = ?, reconcile_tries = reconcile_tries + 1
				WHERE operation_id = ?`, now+reconcileDelay(op.ReconcileTries+1).Milliseconds(), opID)
			if err != nil {
				return fmt.Errorf("schedule reconciliation: %w", err)
			}
			row, err := t.operation(opID)
			out = row.operation()
			return err // nothing the user sees changed: no event
		}
		// A deleted conversation has no tab to tell and takes no event
		// after thread.deleted: the operation's row alone keeps what the
		// provider said (for the audit).
		if !c.row.DeletedAt.Valid {
			if err := t.operationEvent(c, chat.EventToolUpdated, opID); err != nil {
				return err
			}
		}
		row, err := t.operation(opID)
		out = row.operation()
		return err
	})
	return out, err
}
