package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

const activeStatuses = `('queued', 'running', 'waiting_confirmation', 'cancel_requested', 'cancelling')`

// StartRun checks the expected version, appends the user message (if any)
// under a new checkpoint whose pending step is generate, and creates the run
// queued, all in one transaction.
func (s *Store) StartRun(ctx context.Context, p chat.StartRun) (chat.RunStartAck, error) {
	var out chat.RunStartAck
	err := s.write(ctx, func(t *txn) error {
		c, err := t.thread(p.UserID, p.ThreadID)
		if err != nil {
			return err
		}
		var from chat.Checkpoint
		if p.ResumeFromCheckpointID != "" {
			if from, err = t.checkpoint(p.ThreadID, p.ResumeFromCheckpointID); err != nil {
				return err
			}
		}
		if p.ClientRequestID != "" {
			var row runRow
			err := t.get(&row, `SELECT `+runCols+` FROM runs WHERE thread_id = ? AND client_request_id = ?`, p.ThreadID, p.ClientRequestID)
			if err == nil {
				out = chat.RunStartAck{RunID: row.RunID, Status: row.status(), StateVersion: row.StartStateVersion}
				return nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("look up client_request_id: %w", err)
			}
		}
		if err := t.checkVersion(c, p.ExpectedStateVersion, p.ResumeFromCheckpointID); err != nil {
			return err
		}
		if err := t.noActiveRun(p.ThreadID); err != nil {
			return err
		}
		if p.ResumeFromCheckpointID == "" {
			if from, err = t.checkpoint(p.ThreadID, c.row.HeadCheckpointID); err != nil {
				return err
			}
		}
		runID := chat.NewID(chat.PrefixRun)
		base := from
		note := ""
		switch {
		case p.UserMessage != nil:
			if c.row.Title == chat.DefaultTitle && len(from.MessageIDs) == 0 {
				if err := t.retitle(c, chat.TitleFrom(*p.UserMessage)); err != nil {
					return err
				}
			}
			msgID := chat.NewID(chat.PrefixMessage)
			cpID := chat.NewID(chat.PrefixCheckpoint)
			if _, err := t.publishMessage(c, chat.Message{MessageID: msgID, Role: chat.RoleUser, Kind: chat.KindText, Content: *p.UserMessage}, cpID, ""); err != nil {
				return err
			}
			ids := append(append([]string{}, from.MessageIDs...), msgID)
			base, err = t.addCheckpoint(c, chat.Checkpoint{
				CheckpointID: cpID, ParentCheckpointID: &from.CheckpointID, MessageIDs: ids,
				CompletedSteps: from.CompletedSteps, ToolResults: from.ToolResults,
				Pending: &chat.Pending{Step: chat.StepGenerate, InputHash: inputHash(ids)},
			}, "")
			if err != nil {
				return err
			}
		case from.Pending == nil:
			return chat.Invalid("checkpoint %s has no unfinished step to continue: send user_message to ask something new", from.CheckpointID)
		default:
			if note, err = t.resumeNote(p.ThreadID, from.CheckpointID); err != nil {
				return err
			}
			if from.CheckpointID != c.row.HeadCheckpointID {
				// Continuing an older point: it becomes the head again
				// through a new checkpoint, so history never jumps silently.
				base, err = t.addCheckpoint(c, chat.Checkpoint{
					CheckpointID: chat.NewID(chat.PrefixCheckpoint), ParentCheckpointID: &from.CheckpointID,
					MessageIDs: from.MessageIDs, CompletedSteps: from.CompletedSteps, ToolResults: from.ToolResults,
					Pending: from.Pending,
				}, "")
				if err != nil {
					return err
				}
			}
		}
		ev := t.event(c, chat.EventRunStarted, runID)
		ev.Body = chat.RunStartedBody{BaseCheckpointID: base.CheckpointID, Status: chat.RunQueued, Attempt: 1}
		now := ms(t.now)
		if _, err := t.exec(`INSERT INTO runs (run_id, thread_id, status, base_checkpoint_id, resume_note, attempt,
			client_request_id, start_state_version, created_at, updated_at) VALUES (?, ?, 'queued', ?, ?, 1, ?, ?, ?, ?)`,
			runID, p.ThreadID, base.CheckpointID, note, nullStr(p.ClientRequestID), c.row.StateVersion, now, now); err != nil {
			if isUniqueViolation(err) {
				return chat.Errorf(chat.CodeRunAlreadyActive, "another run started on this thread at the same moment: reload it")
			}
			return fmt.Errorf("insert run: %w", err)
		}
		if err := t.append(ev); err != nil {
			return err
		}
		row, err := t.run(runID)
		if err != nil {
			return err
		}
		out = chat.RunStartAck{RunID: row.RunID, Status: row.status(), StateVersion: c.row.StateVersion}
		return nil
	})
	return out, err
}

// retitle names an untitled thread after its first request. The title is a
// label, not conversation state: no version bump, no event.
// noActiveRun answers run_already_active while a run of the thread has not
// ended.
func (t *txn) noActiveRun(threadID string) error {
	var active string
	err := t.get(&active, `SELECT run_id FROM runs WHERE thread_id = ? AND status IN `+activeStatuses, threadID)
	if err == nil {
		return chat.Errorf(chat.CodeRunAlreadyActive, "run %s is still active on this thread: wait for it or cancel it first", active).
			With("run_id", active)
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("look up active run: %w", err)
	}
	return nil
}

func (t *txn) retitle(c *threadCursor, title string) error {
	if title == "" {
		return nil
	}
	if _, err := t.exec(`UPDATE threads SET title = ? WHERE thread_id = ?`, title, c.row.ThreadID); err != nil {
		return fmt.Errorf("title thread: %w", err)
	}
	c.row.Title = title
	return nil
}

// resumeNote says why a pending step runs again, from the last run that
// left the checkpoint unfinished.
func (t *txn) resumeNote(threadID, checkpointID string) (string, error) {
	var status string
	err := t.get(&status, `SELECT status FROM runs WHERE thread_id = ? AND (resume_checkpoint_id = ? OR base_checkpoint_id = ?)
		ORDER BY created_at DESC LIMIT 1`, threadID, checkpointID, checkpointID)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look up previous run: %w", err)
	}
	switch chat.RunStatus(status) {
	case chat.RunCancelled:
		return "The previous output for this step was stopped by the user before it was published. Answer afresh from the confirmed conversation.", nil
	case chat.RunFailed:
		return "The previous attempt at this step was interrupted before it was published. Answer afresh from the confirmed conversation.", nil
	}
	return "", nil
}

func inputHash(messageIDs []string) string {
	sum := sha256.Sum256([]byte(strings.Join(messageIDs, ",")))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// transition refuses a move the run state machine does not allow; reaching
// it is a bug, reported as internal.
func transition(row runRow, to chat.RunStatus) error {
	if !chat.CanTransition(row.status(), to) {
		return fmt.Errorf("run %s: illegal transition %s -> %s", row.RunID, row.Status, to)
	}
	return nil
}

func (t *txn) run(runID string) (runRow, error) {
	var row runRow
	if err := t.lockRunThread(runID); err != nil {
		return row, err
	}
	err := t.get(&row, `SELECT `+runCols+` FROM runs WHERE run_id = ?`+t.forUpdate(), runID)
	if errors.Is(err, sql.ErrNoRows) {
		return row, chat.NotFound("run", runID)
	}
	if err != nil {
		return row, fmt.Errorf("load run: %w", err)
	}
	return row, nil
}

// Run returns one run of the user.
func (s *Store) Run(ctx context.Context, userID, runID string) (chat.Run, error) {
	var row struct {
		runRow
		UserID string `db:"user_id"`
	}
	err := s.reader.GetContext(ctx, &row, s.reader.Rebind(`SELECT r.`+strings.ReplaceAll(runCols, ", ", ", r.")+`, t.user_id
		FROM runs r JOIN threads t ON t.thread_id = r.thread_id WHERE r.run_id = ?`), runID)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && row.UserID != userID) {
		return chat.Run{}, chat.NotFound("run", runID)
	}
	if err != nil {
		return chat.Run{}, fmt.Errorf("load run: %w", err)
	}
	return row.run(), nil
}

// RequestCancel records cancel_requested (reason, who, when, audit row) and
// bumps state_version in one transaction, ahead of queued stream writes
// (writeUrgent). A second cancel changes nothing
// but the audit journal and answers already_requested.
func (s *Store) RequestCancel(ctx context.Context, p chat.CancelRun) (chat.CancelAck, chat.RunStatus, error) {
	var ack chat.CancelAck
	var prev chat.RunStatus
	err := s.writeUrgent(ctx, func(t *txn) error {
		ack, prev = chat.CancelAck{}, ""
		row, err := t.run(p.RunID)
		if err != nil {
			return err
		}
		c, err := t.thread(p.UserID, row.ThreadID)
		if chat.ErrorCode(err) == chat.CodeNotFound {
			return chat.NotFound("run", p.RunID) // another user's: as unknown as a random id
		}
		if err != nil {
			return err
		}
		st := row.status()
		prev = st
		if st == chat.RunCompleted || st == chat.RunFailed {
			return chat.Errorf(chat.CodeRunNotActive, "run %s already ended %s: there is nothing to cancel", p.RunID, st).
				With("run_id", p.RunID).With("status", st)
		}
		ack = chat.CancelAck{RunID: row.RunID}
		if st.CancelAccepted() {
			ack.Status = st
			ack.AlreadyRequested = !(p.Resent && row.RequestedBy.String == p.RequestedBy)
			ack.AcceptedStateVersion = row.CancelStateVersion.Int64
			ack.PublishedMessageID = fromNullString(row.CancelPublishedMessageID)
			ack.ResumeCheckpointID = row.ResumeCheckpointID.String
		} else {
			head, err := t.checkpoint(row.ThreadID, c.row.HeadCheckpointID)
			if err != nil {
				return err
			}
			var published *string
			if n := len(head.MessageIDs); n > 0 {
				published = &head.MessageIDs[n-1]
			}
			ev := t.event(c, chat.EventRunCancelRequested, row.RunID)
			ev.Body = chat.RunCancelRequestedBody{Reason: p.Reason, RequestedBy: p.RequestedBy}
			if err := transition(row, chat.RunCancelRequested); err != nil {
				return err
			}
			t.runChanged(row.RunID)
			if _, err := t.exec(`UPDATE runs SET status = 'cancel_requested', cancel_requested_at = ?, cancel_reason = ?,
				requested_by = ?, cancel_state_version = ?, cancel_published_message_id = ?, resume_checkpoint_id = ?,
				updated_at = ? WHERE run_id = ?`,
				ms(t.now), p.Reason, p.RequestedBy, ev.StateVersion, nullStrPtr(published), head.CheckpointID, ms(t.now), row.RunID); err != nil {
				return fmt.Errorf("record cancel: %w", err)
			}
			if err := t.append(ev); err != nil {
				return err
			}
			ack.Status = chat.RunCancelRequested
			ack.AcceptedStateVersion = ev.StateVersion
			ack.PublishedMessageID = published
			ack.ResumeCheckpointID = head.CheckpointID
		}
		_, err = t.exec(`INSERT INTO cancel_audit (audit_id, run_id, thread_id, user_id, requested_by, reason, requested_at,
			accepted_state_version, already_requested) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			chat.NewID("aud_"), row.RunID, row.ThreadID, p.UserID, p.RequestedBy, p.Reason, ms(t.now),
			ack.AcceptedStateVersion, ack.AlreadyRequested)
		if err != nil {
			return fmt.Errorf("write cancel audit: %w", err)
		}
		return nil
	})
	return ack, prev, err
}

// FinishCancel ends a run whose cancel was accepted (ahead of queued
// stream writes, like RequestCancel): status cancelled, the
// characters streamed for messages that were never published, the head as
// resume point, and run.cancelled. It does nothing (and reports false) when
// the run is not waiting for that.
//
// unbuffered counts characters the worker received from the model but never
// wrote to the stream buffer (the batch in hand when it saw the cancel).
//
// lease is the execution finishing it, which must still hold the run
// (*chat.ErrNotRunning with Fenced otherwise); nil finishes it only while
// no worker holds the run: a worker that does finishes it at its next safe
// point.
func (s *Store) FinishCancel(ctx context.Context, runID string, lease *chat.Lease, unbuffered int64) (bool, error) {
	done := false
	err := s.writeUrgent(ctx, func(t *txn) error {
		done = false
		row, err := t.run(runID)
		if err != nil {
			return err
		}
		if lease != nil && !row.holds(*lease) {
			return &chat.ErrNotRunning{Status: row.status(), Fenced: true}
		}
		if st := row.status(); st != chat.RunCancelRequested && st != chat.RunCancelling {
			return nil
		}
		if lease == nil && row.LeaseOwner.Valid {
			return nil
		}
		done = true
		return t.finishCancel(row, unbuffered)
	})
	return done, err
}

// holds reports whether l is the run's current lease.
func (r runRow) holds(l chat.Lease) bool {
	return r.LeaseOwner.Valid && r.LeaseOwner.String == l.Owner && r.LeaseEpoch == l.Epoch && r.RunID == l.RunID
}

func (t *txn) finishCancel(row runRow, unbuffered int64) error {
	c, err := t.engineThread(row.ThreadID)
	if err != nil {
		return err
	}
	t.release(c)
	// What the run leaves open is settled as at any end: an intent never
	// sent is voided, a tool call nobody runs any more aborted, and a
	// commit whose outcome nobody saw is unknown — never not_started — and
	// reconciled by its key from here on. (Recovery and the claim hand such
	// a commit to a worker first, which looks the key up at once; this is
	// for a cancel that lands before that.)
	if err := t.settleOpenOperations(c, row.RunID); err != nil {
		return err
	}
	discarded, err := t.discarded(row.RunID)
	if err != nil {
		return err
	}
	discarded += unbuffered
	ops, err := t.operationOutcomes(row.RunID)
	if err != nil {
		return err
	}
	ev := t.event(c, chat.EventRunCancelled, row.RunID)
	executed := row.LeaseEpoch > 0 // as Run.Executed: every claim, and only a claim, takes a new lease epoch
	ev.Body = chat.RunCancelledBody{
		ResumeCheckpointID: c.row.HeadCheckpointID, PublishedMessageID: fromNullString(row.CancelPublishedMessageID),
		DiscardedStreamChars: discarded, ResumePolicy: chat.ResumePolicyRegenerate, Operations: ops, Executed: &executed,
	}
	if err := transition(row, chat.RunCancelled); err != nil {
		return err
	}
	t.runChanged(row.RunID)
	if _, err := t.exec(`UPDATE runs SET status = 'cancelled', discarded_stream_chars = ?, resume_checkpoint_id = ?,
		lease_owner = NULL, lease_expires_at = NULL, finished_at = ?, updated_at = ? WHERE run_id = ?`,
		discarded, c.row.HeadCheckpointID, ms(t.now), ms(t.now), row.RunID); err != nil {
		return fmt.Errorf("finish cancel: %w", err)
	}
	if row.CancelRequestedAt.Valid {
		t.cancelsAccepted = append(t.cancelsAccepted, row.CancelRequestedAt.Int64)
	}
	return t.append(ev)
}

// discarded counts the characters a run streamed for messages that were
// never published (cancelled output, interrupted attempts).
func (t *txn) discarded(runID string) (int64, error) {
	var n int64
	if err := t.get(&n, `SELECT CAST(COALESCE(SUM(chars), 0) AS BIGINT) FROM stream_messages WHERE run_id = ?
		AND message_id NOT IN (SELECT message_id FROM messages WHERE run_id = ?)`, runID, runID); err != nil {
		return 0, fmt.Errorf("count discarded text: %w", err)
	}
	return n, nil
}

// operationOutcomes reports what each tool call of a run did.
func (t *txn) operationOutcomes(runID string) ([]chat.OperationOutcome, error) {
	return operationOutcomes(t.ctx, t.tx, runID)
}

func operationOutcomes(ctx context.Context, q *sqlx.Tx, runID string) ([]chat.OperationOutcome, error) {
	var rows []operationRow
	if err := q.SelectContext(ctx, &rows, q.Rebind(`SELECT `+operationCols+` FROM operations WHERE run_id = ? ORDER BY created_at, operation_id`), runID); err != nil {
		return nil, fmt.Errorf("list operations: %w", err)
	}
	out := make([]chat.OperationOutcome, 0, len(rows))
	for _, r := range rows {
		outcome := r.Outcome.String
		if outcome == "" {
			outcome = "not_started"
		}
		out = append(out, chat.OperationOutcome{OperationID: r.OperationID, Tool: r.Tool, Phase: r.Phase, Outcome: outcome})
	}
	return out, nil
}

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
				share, args = ` AND (status <> 'queued' OR `+userExecuting(`runs.thread_id`)+` < ?)`, append(args, perUser)
			}
			err = t.get(&row, `UPDATE runs SET status = CASE WHEN status = 'queued' THEN 'running' ELSE status END,
				lease_owner = ?, lease_expires_at = ?, lease_epoch = lease_epoch + 1, updated_at = ?
				WHERE run_id = (SELECT run_id FROM runs WHERE `+claimable+share+` ORDER BY updated_at, run_id LIMIT 1`+t.skipLocked()+`)
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
	if err := t.get(&pending, `SELECT pending FROM checkpoints WHERE checkpoint_id = ?`, c.row.HeadCheckpointID); err != nil {
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
			res, err := t.exec(`UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND lease_owner = ? AND lease_epoch = ?
				AND status IN `+activeStatuses, now+ttl.Milliseconds(), l.RunID, l.Owner, l.Epoch)
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

// ownRunning loads a run and checks that lease is still its current one
// and that it is running.
func (t *txn) ownRunning(lease chat.Lease) (runRow, error) {
	row, err := t.run(lease.RunID)
	if err != nil {
		return row, err
	}
	if !row.holds(lease) {
		return row, &chat.ErrNotRunning{Status: row.status(), Fenced: true}
	}
	if row.status() != chat.RunRunning {
		return row, &chat.ErrNotRunning{Status: row.status()}
	}
	return row, nil
}

// AppendDeltas writes one batch of a streamed message's text to the stream
// buffer with consecutive seqs (one stream_batches row, see batches.go),
// in one transaction, if the run still runs
// under lease; otherwise it writes nothing and returns *chat.ErrNotRunning. (The
// lease is renewed by the engine's maintenance loop for all its runs at
// once, not per batch.) Concurrent calls of different runs share
// transactions (group commit, see group.go).
func (s *Store) AppendDeltas(ctx context.Context, lease chat.Lease, messageID string, texts []string) error {
	if len(texts) == 0 {
		return nil
	}
	if s.buf != nil {
		// A message this process lost deltas of streams no further: what
		// comes next would follow a hole (see streambuf.go).
		if err := s.buf.lostDeltas(messageID); err != nil {
			return err
		}
		if handled, err := s.buf.appendFast(ctx, lease, messageID, texts); handled {
			return err
		}
	}
	runID := lease.RunID
	return s.writeGrouped(ctx, func(t *txn) error {
		// The safe point: the run's status and lease, read with its
		// thread's sequencer in one statement (this runs once per batch of
		// every streaming run, so it scans without reflection).
		var status string
		var leaseOwner sql.NullString
		var epoch int64
		var th threadRow
		if err := t.lockRunThread(runID); err != nil {
			return err
		}
		err := t.tx.QueryRowContext(t.ctx, t.tx.Rebind(`SELECT r.status, r.lease_owner, r.lease_epoch, `+threadColsT+`
			FROM runs r JOIN threads t ON t.thread_id = r.thread_id WHERE r.run_id = ?`+t.forUpdate()), runID).
			Scan(append([]any{&status, &leaseOwner, &epoch}, th.scanTargets()...)...)
		if errors.Is(err, sql.ErrNoRows) {
			return chat.NotFound("run", runID)
		}
		if err != nil {
			return fmt.Errorf("load run: %w", err)
		}
		if st := chat.RunStatus(status); leaseOwner.String != lease.Owner || epoch != lease.Epoch {
			return &chat.ErrNotRunning{Status: st, Fenced: true}
		} else if st != chat.RunRunning {
			return &chat.ErrNotRunning{Status: st}
		}
		c, err := t.adoptThread(th)
		if err != nil {
			return err
		}
		if t.buf != nil {
			// (adoptThread may just have dropped deltas of it.)
			if err := t.buf.lostDeltas(messageID); err != nil {
				return err
			}
		}
		// One row for the whole batch, at the thread's next seqs (after
		// the deltas adoptThread wrote from memory, if any).
		first := c.row.LastSeq + 1
		tss := make([]int64, len(texts))
		for i := range tss {
			tss[i] = ms(t.now)
		}
		if err := t.writeBatch(c, runID, messageID, texts, tss); err != nil {
			return err
		}
		for i, text := range texts {
			ev := &chat.Event{Type: chat.EventMessageDelta, ThreadID: th.ThreadID, Seq: first + int64(i), TS: ms(t.now),
				RunID: runID, MessageID: messageID, Body: chat.MessageDeltaBody{MessageID: messageID, Text: text}}
			if err := t.append(ev); err != nil {
				return err
			}
		}
		// From now on this run's batches of this message may skip the
		// database (SQLite), within the seqs reserved here.
		t.reserve(c, lease.Owner, false)
		t.confirmLive(lease, th.ThreadID, messageID)
		return nil
	})
}

// AddUsage adds tokens a model step used to its run's count. It is
// bookkeeping, not state: no version bump, no event, whatever the status.
func (s *Store) AddUsage(ctx context.Context, runID string, u chat.Usage) error {
	return s.write(ctx, func(t *txn) error {
		_, err := t.exec(`UPDATE runs SET prompt_tokens = prompt_tokens + ?, completion_tokens = completion_tokens + ? WHERE run_id = ?`,
			u.PromptTokens, u.CompletionTokens, runID)
		return err
	})
}

// Complete ends a running run completed (run.completed).
func (s *Store) Complete(ctx context.Context, lease chat.Lease) error {
	return s.write(ctx, func(t *txn) error {
		row, err := t.ownRunning(lease)
		if err != nil {
			return err
		}
		return t.finish(row, chat.RunCompleted, "")
	})
}

// Fail ends a running run failed with a message a user understands.
func (s *Store) Fail(ctx context.Context, lease chat.Lease, message string) error {
	return s.write(ctx, func(t *txn) error {
		row, err := t.ownRunning(lease)
		if err != nil {
			return err
		}
		return t.finish(row, chat.RunFailed, message)
	})
}

func (t *txn) finish(row runRow, status chat.RunStatus, message string) error {
	c, err := t.engineThread(row.ThreadID)
	if err != nil {
		return err
	}
	t.release(c)
	typ := chat.EventRunCompleted
	var body any
	if status == chat.RunFailed {
		typ = chat.EventRunFailed
		body = chat.RunFailedBody{Error: message}
	}
	if err := t.settleOpenOperations(c, row.RunID); err != nil {
		return err
	}
	ev := t.event(c, typ, row.RunID)
	ev.Body = body
	if err := transition(row, status); err != nil {
		return err
	}
	discarded, err := t.discarded(row.RunID)
	if err != nil {
		return err
	}
	t.runChanged(row.RunID)
	if _, err := t.exec(`UPDATE runs SET status = ?, error = ?, resume_checkpoint_id = ?, discarded_stream_chars = ?,
		lease_owner = NULL, lease_expires_at = NULL, finished_at = ?, updated_at = ? WHERE run_id = ?`,
		string(status), nullStr(message), c.row.HeadCheckpointID, discarded, ms(t.now), ms(t.now), row.RunID); err != nil {
		return fmt.Errorf("finish run: %w", err)
	}
	return t.append(ev)
}

// RestartStep starts the step lease's execution streams over, after its
// message lost deltas (chat.ErrDeltasLost): the run's attempt goes up by
// one and the execution keeps its lease, to stream the step again under a
// new message id. A run at maxAttempts fails "interrupted" instead; again
// reports whether the step runs again.
func (s *Store) RestartStep(ctx context.Context, lease chat.Lease, maxAttempts int) (again bool, err error) {
	err = s.write(ctx, func(t *txn) error {
		row, err := t.ownRunning(lease)
		if err != nil {
			return err
		}
		if again = row.Attempt < maxAttempts; !again {
			return t.finish(row, chat.RunFailed, chat.ErrorInterrupted)
		}
		_, err = t.exec(`UPDATE runs SET attempt = attempt + 1, updated_at = ? WHERE run_id = ?`, ms(t.now), row.RunID)
		return err
	})
	return again, err
}

// Release hands a running run back to the queue intact (shutdown): nothing
// it streamed is published; the next attempt re-runs the pending step.
func (s *Store) Release(ctx context.Context, lease chat.Lease) error {
	return s.write(ctx, func(t *txn) error {
		row, err := t.ownRunning(lease)
		if err != nil {
			return err
		}
		runID := row.RunID
		if err := transition(row, chat.RunQueued); err != nil {
			return err
		}
		t.runChanged(runID)
		_, err = t.exec(`UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, updated_at = ?
			WHERE run_id = ?`, ms(t.now), runID)
		return err
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
func (s *Store) Recover(ctx context.Context, owner string, foreignExpired bool, maxAttempts int) ([]chat.Recovered, error) {
	now := ms(s.clock())
	if s.pg {
		if err := s.writer.GetContext(ctx, &now, dbClockSQL); err != nil {
			return nil, fmt.Errorf("read the database clock: %w", err)
		}
	}
	var ids []string
	q := `SELECT run_id FROM runs WHERE status IN ('running', 'cancel_requested', 'cancelling') AND lease_owner IS NOT NULL
		AND ((CAST(? AS BOOLEAN) AND lease_owner <> ?) OR lease_expires_at < ?)`
	if err := s.writer.SelectContext(ctx, &ids, s.writer.Rebind(q), foreignExpired, owner, now); err != nil {
		return nil, fmt.Errorf("find interrupted runs: %w", err)
	}
	// Cancels accepted while no worker held the run (queued, or between
	// attempts) are settled here as well.
	var orphans []string
	if err := s.writer.SelectContext(ctx, &orphans, s.writer.Rebind(`SELECT run_id FROM runs
		WHERE status IN ('cancel_requested', 'cancelling') AND lease_owner IS NULL AND NOT EXISTS (SELECT 1 FROM operations o
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
			if err := t.get(&openCommit, `SELECT COUNT(*) FROM operations WHERE run_id = ? AND phase IN ('committing', 'unknown') AND result_ref IS NULL`, row.RunID); err != nil {
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
	c, err := cp.checkpoint()
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// handOver drops a run's lease so that a worker claims it (see claimable).
func (t *txn) handOver(runID string) error {
	t.runChanged(runID)
	_, err := t.exec(`UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL, updated_at = ? WHERE run_id = ?`, ms(t.now), runID)
	return err
}

// RunInput loads what a worker needs for a run's next step, from the
// thread's head checkpoint and published messages only: the history, the
// pending step and the operation it waits on.
func (s *Store) RunInput(ctx context.Context, runID string) (chat.RunInput, error) {
	var in chat.RunInput
	err := s.read(ctx, func(q *sqlx.Tx) error {
		var row runRow
		if err := q.GetContext(ctx, &row, q.Rebind(`SELECT `+runCols+` FROM runs WHERE run_id = ?`), runID); err != nil {
			return fmt.Errorf("load run: %w", err)
		}
		var head string
		if err := q.GetContext(ctx, &head, q.Rebind(`SELECT head_checkpoint_id FROM threads WHERE thread_id = ?`), row.ThreadID); err != nil {
			return fmt.Errorf("load head: %w", err)
		}
		cp, err := loadCheckpoint(ctx, q, row.ThreadID, head)
		if err != nil {
			return err
		}
		msgs, err := loadMessages(ctx, q, cp.MessageIDs)
		if err != nil {
			return err
		}
		note := row.ResumeNote
		if row.Attempt > 1 && note == "" {
			note = "The previous attempt at this step was interrupted before it was published. Answer afresh from the confirmed conversation."
		}
		in = chat.RunInput{Run: row.run(), Messages: msgs, ResumeNote: note, Pending: cp.Pending}
		if cp.Pending != nil && cp.Pending.Step == chat.StepTool {
			var op operationRow
			// By id alone: a fork's first checkpoint may wait on a call of
			// the thread it was forked from (the engine then prepares that
			// call again in the fork, under the same key).
			err := q.GetContext(ctx, &op, q.Rebind(`SELECT `+operationCols+` FROM operations WHERE operation_id = ?`), cp.Pending.InputHash)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("load pending operation: %w", err)
			}
			if err == nil {
				o := op.operation()
				in.Operation = &o
			}
		}
		return nil
	})
	return in, err
}
