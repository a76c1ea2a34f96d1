package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
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
// queued, all in one transaction. On SQLite that transaction is a group
// commit (group.go): runs started at once share commits with each other
// and with stream writes, instead of one commit each ahead of their claims
// and first deltas (the cancel benchmark's run.started → first delta p99
// went from 570-800 ms to 280-290 ms). Every refusal comes before its
// first write; a start that another on the thread beat in the same batch
// fails the unique index after writing, and the batch runs again without
// it. On PostgreSQL a start stays a transaction of its own: a batch locks
// every thread in it, and a start may be of a thread another instance's
// batch holds, a wait in a cycle the grouped stream writes (each
// instance's own threads) do not risk.
func (s *Store) StartRun(ctx context.Context, p chat.StartRun) (chat.RunStartAck, error) {
	ack, _, err := s.startRun(ctx, p, nil)
	return ack, err
}

// startClaim asks startRun to claim the run it starts (StartRunClaimed).
type startClaim struct {
	owner string
	ttl   time.Duration
	spare int
}

// StartRunClaimed is StartRun that also claims the new run for owner,
// with a lease of ttl, in the same commit, when the caller holds a worker
// slot for it and a claim would take no run before it: no more other runs
// wait for a slot than the caller has spare slots besides this one (so
// none of them waits longer for it), and the run's user is below their
// share (Options.MaxRunsPerUser). The claim is then what ClaimBatch would
// have made a moment later, without a write of its own: one commit less
// per exchange, and a first delta that waits for no claim (issue 31;
// BENCHMARKS.md). Otherwise, and on PostgreSQL (where a start is a
// transaction of its own and a claim takes one run, see ClaimBatch), the
// run waits queued as StartRun leaves it, and the claim is nil.
func (s *Store) StartRunClaimed(ctx context.Context, p chat.StartRun, owner string, ttl time.Duration, spare int) (
	chat.RunStartAck, *chat.Claim, error,
) {
	return s.startRun(ctx, p, &startClaim{owner: owner, ttl: ttl, spare: spare})
}

func (s *Store) startRun(ctx context.Context, p chat.StartRun, want *startClaim) (chat.RunStartAck, *chat.Claim, error) {
	var out chat.RunStartAck
	var claim *chat.Claim
	write := s.writeGrouped
	if s.pg {
		write = s.write
	}
	err := write(ctx, func(t *txn) error {
		out, claim = chat.RunStartAck{}, nil
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
			err := t.get(
				&row,
				`SELECT `+runCols+` FROM runs WHERE thread_id = ? AND client_request_id = ?`,
				p.ThreadID, p.ClientRequestID,
			)
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
		runID, base, ev, err := t.startOn(c, from, p.UserMessage, p.ClientRequestID, "")
		if err != nil {
			return err
		}
		if p.Response != nil {
			if err := t.recordResponse(runID, *p.Response); err != nil {
				return err
			}
		}
		if want != nil && !s.pg && t.buf != nil {
			if claim, err = t.claimStarted(c, runID, want, s.perUser); err != nil {
				return err
			}
		}
		status := chat.RunQueued
		if claim != nil {
			status = claim.Run.Status
		}
		ev.Body = chat.RunStartedBody{BaseCheckpointID: base.CheckpointID, Status: status, Attempt: 1}
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
	if err != nil {
		return out, nil, err
	}
	return out, claim, nil
}

// claimStarted claims the run this transaction just inserted, queued, for
// want.owner when StartRunClaimed's conditions hold (nil when they do not):
// what one pass of ClaimBatch does for a run on SQLite, on the row and the
// stream buffer.
func (t *txn) claimStarted(c *threadCursor, runID string, want *startClaim, perUser int) (*chat.Claim, error) {
	var others int
	if err := t.get(&others, `SELECT count(*) FROM (SELECT 1 FROM runs WHERE `+claimable+` AND run_id <> ?
		LIMIT ?)`, runID, want.spare+1); err != nil {
		return nil, fmt.Errorf("count the runs waiting for a slot: %w", err)
	}
	if others > want.spare {
		return nil, nil // they come first: the dispatcher claims in order
	}
	if perUser > 0 {
		var held int
		if err := t.get(&held, `SELECT `+userExecuting(`?`), c.row.ThreadID); err != nil {
			return nil, fmt.Errorf("count the user's executing runs: %w", err)
		}
		if held >= perUser {
			return nil, nil
		}
	}
	now, err := t.leaseClock()
	if err != nil {
		return nil, err
	}
	var row runRow
	if err := t.get(&row, `UPDATE runs SET `+claimSet+`
		WHERE run_id = ? AND status = 'queued' AND lease_owner IS NULL RETURNING `+runCols,
		want.owner, now+want.ttl.Milliseconds(), ms(t.now), runID); err != nil {
		return nil, fmt.Errorf("claim the started run: %w", err)
	}
	lease := chat.Lease{RunID: runID, Owner: want.owner, Epoch: row.LeaseEpoch}
	if err := t.claimStream(lease, c.row.ThreadID); err != nil {
		return nil, err
	}
	return &chat.Claim{Run: row.run(), Lease: lease}, nil
}

// noActiveRun answers run_already_active while a run of the thread has not
// ended.
func (t *txn) noActiveRun(threadID string) error {
	var active string
	err := t.get(&active, `SELECT run_id FROM runs WHERE thread_id = ? AND status IN `+activeStatuses, threadID)
	if err == nil {
		return chat.Errorf(chat.CodeRunAlreadyActive, "run %s is still active on this thread: "+
			"wait for it or cancel it first", active).
			With("run_id", active)
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("look up active run: %w", err)
	}
	return nil
}

// retitle names an untitled thread after its first request. The title is a
// label, not conversation state: no version bump, no event.
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
	err := t.get(
		&status,
		`SELECT status FROM runs WHERE thread_id = ? AND (resume_checkpoint_id = ? OR base_checkpoint_id = ?)
		ORDER BY created_at DESC LIMIT 1`,
		threadID, checkpointID, checkpointID,
	)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look up previous run: %w", err)
	}
	switch chat.RunStatus(status) {
	case chat.RunCancelled:
		return "The previous output for this step was stopped by the user before it was published. Answer afresh " +
			"from the confirmed conversation.", nil
	case chat.RunFailed:
		return "The previous attempt at this step was interrupted before it was published. Answer afresh from the " +
			"confirmed conversation.", nil
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
	t.runsRead = append(t.runsRead, runID)
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
	if err := s.settled(ctx); err != nil {
		return chat.Run{}, err
	}
	err := s.reader.GetContext(
		ctx, &row,
		s.reader.Rebind(`SELECT r.`+strings.ReplaceAll(runCols, ", ", ", r.")+`, t.user_id
		FROM runs r JOIN threads t ON t.thread_id = r.thread_id WHERE r.run_id = ?`),
		runID,
	)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && row.UserID != userID) {
		return chat.Run{}, chat.NotFound("run", runID)
	}
	if err != nil {
		return chat.Run{}, fmt.Errorf("load run: %w", err)
	}
	return row.run(), nil
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
	next, err := t.planAfterEnd(c, chat.RunCancelled, row.CancelReason.String)
	if err != nil {
		return err
	}
	ev := t.event(c, chat.EventRunCancelled, row.RunID)
	executed := row.LeaseEpoch > 0 // as Run.Executed: every claim, and only a claim, takes a new lease epoch
	ev.Body = chat.RunCancelledBody{
		ResumeCheckpointID:   c.row.HeadCheckpointID,
		PublishedMessageID:   fromNullString(row.CancelPublishedMessageID),
		DiscardedStreamChars: discarded,
		ResumePolicy:         chat.ResumePolicyRegenerate,
		Operations:           ops,
		Executed:             &executed,
		QueuedMessages:       next.waiting,
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
	if err := t.append(ev); err != nil {
		return err
	}
	return next.do(t, c)
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
	if err := q.SelectContext(ctx, &rows, q.Rebind(`SELECT `+operationCols+` FROM operations WHERE run_id = ?
		ORDER BY created_at, operation_id`), runID); err != nil {
		return nil, fmt.Errorf("list operations: %w", err)
	}
	out := make([]chat.OperationOutcome, 0, len(rows))
	for _, r := range rows {
		outcome := r.Outcome.String
		if outcome == "" {
			outcome = "not_started"
		}
		out = append(
			out,
			chat.OperationOutcome{OperationID: r.OperationID, Tool: r.Tool, Phase: r.Phase, Outcome: outcome},
		)
	}
	return out, nil
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
		_, err := t.exec(
			`UPDATE runs SET prompt_tokens = prompt_tokens + ?, completion_tokens = completion_tokens + ?
				WHERE run_id = ?`,
			u.PromptTokens, u.CompletionTokens, runID,
		)
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
		string(status), nullStr(message), c.row.HeadCheckpointID, discarded, ms(t.now), ms(t.now),
		row.RunID); err != nil {
		return fmt.Errorf("finish run: %w", err)
	}
	next, err := t.planAfterEnd(c, status, "")
	if err != nil {
		return err
	}
	if err := t.append(ev); err != nil {
		return err
	}
	return next.do(t, c)
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

// RunInput loads what a worker needs for a run's next step, from the
// thread's head checkpoint and published messages only: the history, the
// pending step and the operation it waits on.
func (s *Store) RunInput(ctx context.Context, runID string) (chat.RunInput, error) {
	var in chat.RunInput
	err := s.read(ctx, func(q *sqlx.Tx) error {
		var row runRow
		if err := q.GetContext(ctx, &row, q.Rebind(`SELECT `+runCols+` FROM runs WHERE run_id = ?`),
			runID); err != nil {
			return fmt.Errorf("load run: %w", err)
		}
		var head string
		if err := q.GetContext(ctx, &head, q.Rebind(`SELECT head_checkpoint_id FROM threads WHERE thread_id = ?`),
			row.ThreadID); err != nil {
			return fmt.Errorf("load head: %w", err)
		}
		cp, err := loadCheckpoint(ctx, q, s.cps, row.ThreadID, head)
		if err != nil {
			return err
		}
		msgs, err := loadMessages(ctx, q, cp.MessageIDs)
		if err != nil {
			return err
		}
		note := row.ResumeNote
		if row.Attempt > 1 && note == "" {
			note = "The previous attempt at this step was interrupted before it was published. Answer afresh from " +
				"the confirmed conversation."
		}
		instructions, err := readInstructions(ctx, q, runID)
		if err != nil {
			return err
		}
		in = chat.RunInput{Run: row.run(), Messages: msgs, ResumeNote: note, Instructions: instructions, Pending: cp.Pending}
		if cp.Pending != nil && cp.Pending.Step == chat.StepTool {
			var op operationRow
			// By id alone: a fork's first checkpoint may wait on a call of
			// the thread it was forked from (the engine then prepares that
			// call again in the fork, under the same key).
			err := q.GetContext(
				ctx, &op,
				q.Rebind(`SELECT `+operationCols+` FROM operations WHERE operation_id = ?`),
				cp.Pending.InputHash,
			)
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

// startOn starts a run on c's thread from checkpoint from, as run.start
// does once its checks passed: the user message (when there is one)
// published under a new checkpoint whose pending step is generate, or
// from's unfinished step continued; then the run row, queued. It answers
// the run's id, its base checkpoint and its run.started event, reserved
// but not appended: the caller sets its body and appends it.
// queueItemID names the queue item the run starts from ("" for a
// run.start).
func (t *txn) startOn(c *threadCursor, from chat.Checkpoint, userMessage *string, clientRequestID, queueItemID string) (
	runID string, base chat.Checkpoint, ev *chat.Event, err error,
) {
	runID = chat.NewID(chat.PrefixRun)
	base = from
	note := ""
	switch {
	case userMessage != nil:
		if c.row.Title == chat.DefaultTitle && len(from.MessageIDs) == 0 {
			if err := t.retitle(c, chat.TitleFrom(*userMessage)); err != nil {
				return "", base, nil, err
			}
		}
		msgID := chat.NewID(chat.PrefixMessage)
		cpID := chat.NewID(chat.PrefixCheckpoint)
		if _, err := t.publishMessage(c, chat.Message{
			MessageID: msgID,
			Role:      chat.RoleUser,
			Kind:      chat.KindText,
			Content:   *userMessage,
		}, cpID, ""); err != nil {
			return "", base, nil, err
		}
		ids := append(append([]string{}, from.MessageIDs...), msgID)
		base, err = t.addCheckpoint(c, chat.Checkpoint{
			CheckpointID: cpID, ParentCheckpointID: &from.CheckpointID, MessageIDs: ids,
			CompletedSteps: from.CompletedSteps, ToolResults: from.ToolResults,
			Pending: &chat.Pending{Step: chat.StepGenerate, InputHash: inputHash(ids)},
		}, "")
		if err != nil {
			return "", base, nil, err
		}
	case from.Pending == nil:
		return "", base, nil, chat.Invalid(
			"checkpoint %s has no unfinished step to continue: send user_message to ask something new",
			from.CheckpointID,
		)
	default:
		if note, err = t.resumeNote(c.row.ThreadID, from.CheckpointID); err != nil {
			return "", base, nil, err
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
				return "", base, nil, err
			}
		}
	}
	ev = t.event(c, chat.EventRunStarted, runID)
	now := ms(t.now)
	if _, err := t.exec(`INSERT INTO runs (run_id, thread_id, status, base_checkpoint_id, resume_note, attempt,
		client_request_id, start_state_version, created_at, updated_at, queue_item_id)
		VALUES (?, ?, 'queued', ?, ?, 1, ?, ?, ?, ?, ?)`,
		runID, c.row.ThreadID, base.CheckpointID, note, nullStr(clientRequestID), c.row.StateVersion,
		now, now, nullStr(queueItemID)); err != nil {
		if isUniqueViolation(err) {
			return "", base, nil, chat.Errorf(
				chat.CodeRunAlreadyActive,
				"another run started on this thread at the same moment: reload it",
			)
		}
		return "", base, nil, fmt.Errorf("insert run: %w", err)
	}
	return runID, base, ev, nil
}
