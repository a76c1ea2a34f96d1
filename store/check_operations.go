package store

import (
	"fmt"

	"github.com/honestcancel/gateway/chat"
)

// ---- 2: one key, at most one external action ----

// checkOneActionPerKey audits what this database can show: the embedded
// email provider's records (at most one acceptance per key; its table of
// accepted keys and its log of calls agree, both ways), that every key it
// accepted is one an operation carries, and that every consequential
// operation that reached its system named a key. Several operations may
// share a key (a step resumed or forked is the same action): the
// provider's acceptances are what counts. Neither the provider's rows nor
// operations are ever deleted (retention leaves them), so nothing ages
// out of these comparisons.
func checkOneActionPerKey(a *auditor) error {
	ctx, q := a.ctx, a.q
	var keyless []string
	if err := q.SelectContext(ctx, &keyless, `SELECT operation_id FROM operations WHERE contract = 'consequential'
		AND (commit_started_at IS NOT NULL OR phase IN ('committing', 'committed', 'unknown', 'reconciled'))
		AND idempotency_key IS NULL`); err != nil {
		return fmt.Errorf("audit: keyless operations: %w", err)
	}
	for _, id := range keyless {
		a.add(2, "consequential operation %s reached its system without an idempotency key", id)
	}
	has, err := a.hasProvider()
	if err != nil {
		return err
	}
	if !has {
		a.unchecked(
			"2, 10: this database holds no embedded email provider records (outbox, outbox_attempts), " +
				"so no provider's acceptances were compared",
		)
	} else {
		var twice []struct {
			Key string `db:"idempotency_key"`
			N   int    `db:"n"`
		}
		if err := q.SelectContext(ctx, &twice, `SELECT idempotency_key, COUNT(*) AS n FROM outbox_attempts
			WHERE result = 'accepted' GROUP BY idempotency_key HAVING COUNT(*) > 1
			ORDER BY idempotency_key`); err != nil {
			return fmt.Errorf("audit: provider log: %w", err)
		}
		for _, k := range twice {
			a.add(2, "idempotency key %q was accepted by the provider %d times", k.Key, k.N)
		}
		// The provider takes a key by inserting its outbox row and logging
		// the acceptance in one transaction: each without the other is a
		// lost record (without the row it would accept the key again).
		var unlogged, unheld []string
		if err := q.SelectContext(ctx, &unlogged, `SELECT p.idempotency_key FROM outbox p
			WHERE NOT EXISTS (SELECT 1 FROM outbox_attempts l
			WHERE l.idempotency_key = p.idempotency_key AND l.result = 'accepted')
			ORDER BY p.idempotency_key`); err != nil {
			return fmt.Errorf("audit: provider records: %w", err)
		}
		for _, key := range unlogged {
			a.add(2, "the provider holds key %q as accepted (outbox), but its log (outbox_attempts) "+
				"has no acceptance of it", key)
		}
		if err := q.SelectContext(ctx, &unheld, `SELECT DISTINCT l.idempotency_key FROM outbox_attempts l
			WHERE l.result = 'accepted'
			AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.idempotency_key = l.idempotency_key)
			ORDER BY l.idempotency_key`); err != nil {
			return fmt.Errorf("audit: provider records: %w", err)
		}
		for _, key := range unheld {
			a.add(2, "the provider's log accepted key %q, but it holds no record of it (outbox): "+
				"it would accept the key again", key)
		}
		// The outer direction of "every operation's key": every key the
		// provider took is carried by an operation (the send_email tool
		// sends no other), or an action happened that no operation accounts for.
		var orphans []struct {
			Key        string `db:"idempotency_key"`
			ProviderID string `db:"provider_id"`
		}
		if err := q.SelectContext(ctx, &orphans, `SELECT p.idempotency_key, p.provider_id FROM outbox p
			WHERE NOT EXISTS (SELECT 1 FROM operations o WHERE o.idempotency_key = p.idempotency_key)
			ORDER BY p.idempotency_key`); err != nil {
			return fmt.Errorf("audit: keys the provider accepted: %w", err)
		}
		for _, o := range orphans {
			a.add(2, "the provider accepted key %q (%s), which no operation carries: "+
				"an external action no operation accounts for", o.Key, o.ProviderID)
		}
	}
	var outside []struct {
		Tool string `db:"tool"`
		N    int    `db:"n"`
	}
	if err := q.SelectContext(ctx, &outside, `SELECT tool, COUNT(*) AS n FROM operations
		WHERE contract = 'consequential'
		AND tool <> 'send_email' AND commit_started_at IS NOT NULL GROUP BY tool ORDER BY tool`); err != nil {
		return fmt.Errorf("audit: operations of other providers: %w", err)
	}
	for _, o := range outside {
		a.unchecked(
			"2, 10: %d operations of %s reached a provider outside this database; "+
				"whether each key acted at most once, and as reported, only that provider's records can tell",
			o.N, o.Tool,
		)
	}
	return nil
}

// hasProvider reports whether the database holds the embedded email
// provider's tables (migration 00013 creates both).
func (a *auditor) hasProvider() (bool, error) {
	for _, table := range []string{"outbox", "outbox_attempts"} {
		if has, err := a.hasTable(table); err != nil || !has {
			return false, err
		}
	}
	return true, nil
}

// hasTable reports whether the database holds a table of that name (the
// embedded provider's tables exist once it was opened on it).
func (a *auditor) hasTable(name string) (bool, error) {
	q := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`
	if a.pg {
		q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?`
	}
	var n int
	if err := a.q.GetContext(a.ctx, &n, a.q.Rebind(q), name); err != nil {
		return false, fmt.Errorf("audit: look for the provider log: %w", err)
	}
	return n > 0, nil
}

// ---- 10: reported outcomes never contradict the provider ----

// checkOutcomes audits what the gateway itself recorded: an operation that
// reached its system is never reported not_started; an ended run leaves no
// call in flight; an unknown outcome is still being reconciled, or its
// horizon passed and the receipt says so.
func checkOutcomes(a *auditor, th *auditThread) {
	for _, o := range th.ops {
		r, ok := th.runByID[o.RunID]
		if !ok {
			a.add(
				10,
				"operation %s names run %s, which is not one of thread %s",
				o.OperationID, o.RunID, th.row.ThreadID,
			)
			continue
		}
		outcome := o.Outcome.String
		if o.CommitStartedAt.Valid && (outcome == chat.OutcomeNotStarted || o.Phase == chat.PhaseVoided) {
			a.add(10, "operation %s reached its system but reports %s/%s", o.OperationID, o.Phase, outcome)
		}
		if r.status().Terminal() {
			switch o.Phase {
			case chat.PhasePrepared, chat.PhaseConfirmed, chat.PhaseRunning, chat.PhaseCommitting:
				a.add(10, "run %s ended %s with operation %s still %s", r.RunID, r.Status, o.OperationID, o.Phase)
			case chat.PhaseUnknown:
				// Still asked (a next lookup), or given up at the horizon
				// (no next lookup, the horizon on record: the receipt says so).
				if !o.ReconcileNextAt.Valid && !o.ReconcileUntil.Valid {
					a.add(
						10,
						"run %s ended %s with operation %s unknown and no reconciliation going on",
						r.RunID, r.Status, o.OperationID,
					)
				}
			}
		}
		want := map[string]string{
			chat.PhaseVoided: chat.OutcomeNotStarted, chat.PhaseRejected: chat.OutcomeNotStarted,
			chat.PhaseAborted: chat.OutcomeAborted, chat.PhaseCompleted: chat.OutcomeCompleted,
			chat.PhaseCommitted: chat.OutcomeCommitted, chat.PhaseReconciled: chat.OutcomeCommitted,
			chat.PhaseFailed: chat.OutcomeFailed, chat.PhaseUnknown: chat.OutcomeUnknown,
		}[o.Phase]
		if want != "" && outcome != want {
			a.add(10, "operation %s is %s but reports outcome %q", o.OperationID, o.Phase, outcome)
		}
	}
}

// checkOutcomesAtProvider compares the outcomes with the embedded email
// provider's records, both ways. A key it accepted caused an action, so at
// least one operation with that key must report it (committed) or say it
// does not know (unknown); if every one says not_started, aborted or
// failed, the receipts deny an action that happened. And an operation of
// send_email reported committed names a key the provider accepted: a
// commit the provider never saw is a receipt claiming an action that did
// not happen. (A key taken under the record-late fault has its row from
// the start, so it counts as accepted.)
func checkOutcomesAtProvider(a *auditor) error {
	has, err := a.hasProvider()
	if err != nil || !has {
		return err
	}
	var denied []struct {
		Key         string `db:"idempotency_key"`
		OperationID string `db:"operation_id"`
	}
	if err := a.q.SelectContext(a.ctx, &denied, `SELECT o.idempotency_key, MIN(o.operation_id) AS operation_id
		FROM operations o
		JOIN outbox p ON p.idempotency_key = o.idempotency_key
		WHERE o.contract = 'consequential'
		GROUP BY o.idempotency_key
		HAVING SUM(CASE WHEN o.outcome IN ('committed', 'unknown') THEN 1 ELSE 0 END) = 0
			AND SUM(CASE WHEN o.outcome IN ('not_started', 'aborted', 'failed') THEN 1 ELSE 0 END) > 0
		ORDER BY o.idempotency_key`); err != nil {
		return fmt.Errorf("audit: outcomes against the provider: %w", err)
	}
	for _, d := range denied {
		a.add(
			10,
			"the provider accepted key %q, but operation %s (and every other with that key) reports no action",
			d.Key, d.OperationID,
		)
	}
	// Committed for a key the provider never accepted: the app's send_email
	// commits through the embedded provider only.
	var claimed []struct {
		OperationID string `db:"operation_id"`
		ThreadID    string `db:"thread_id"`
		Key         string `db:"idempotency_key"`
		Calls       int    `db:"calls"`
	}
	if err := a.q.SelectContext(a.ctx, &claimed, `SELECT o.operation_id, o.thread_id, o.idempotency_key,
		(SELECT COUNT(*) FROM outbox_attempts l WHERE l.idempotency_key = o.idempotency_key) AS calls FROM operations o
		WHERE o.contract = 'consequential' AND o.tool = 'send_email' AND o.outcome = 'committed'
		AND o.idempotency_key IS NOT NULL
		AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.idempotency_key = o.idempotency_key)
		ORDER BY o.operation_id`); err != nil {
		return fmt.Errorf("audit: commits against the provider: %w", err)
	}
	for _, c := range claimed {
		a.add(
			10,
			"operation %s (thread %s) reports committed, but the provider never accepted its key %q "+
				"(it logged %d calls with it)",
			c.OperationID, c.ThreadID, c.Key, c.Calls,
		)
	}
	return nil
}
