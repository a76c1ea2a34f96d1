package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/honestcancel/gateway/chat"
)

// PublishStep records what one generate step produced, in one transaction,
// while the run still runs under lease (a recorded cancel wins) and the
// thread still waits on the step out completes (out.Step): the message, if
// any, and the tool call, if any, as an operation. The new head checkpoint
// has no pending step when the step ends the run, or the tool step naming
// the operation. A consequential call is recorded prepared and the run
// waits for confirmation (no lease); a runner call is recorded running.
func (s *Store) PublishStep(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	return s.write(ctx, func(t *txn) error {
		_, err := t.publishStep(lease, out)
		return err
	})
}

// CompleteWith publishes a run's last step (out, which has no tool call)
// and completes the run, in one transaction: PublishStep and Complete in
// one commit, so a run's end costs the writer one transaction, not two.
func (s *Store) CompleteWith(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	if out.Call != nil {
		return errors.New("a step with a tool call does not end its run")
	}
	return s.write(ctx, func(t *txn) error {
		row, err := t.publishStep(lease, out)
		if err != nil {
			return err
		}
		return t.finish(row, chat.RunCompleted, "")
	})
}

// publishStep is PublishStep inside t; it returns the run as it was loaded
// (running, under lease).
func (t *txn) publishStep(lease chat.Lease, out chat.StepOutput) (runRow, error) {
	row, err := t.ownRunning(lease)
	if err != nil {
		return row, err
	}
	runID := row.RunID
	if out.Content == "" && out.Call == nil {
		return row, errors.New("a step with neither a message nor a tool call")
	}
	c, err := t.engineThread(row.ThreadID)
	if err != nil {
		return row, err
	}
	t.release(c)
	head, err := t.checkpoint(row.ThreadID, c.row.HeadCheckpointID)
	if err != nil {
		return row, err
	}
	if err := waitsOn(head, out.Step); err != nil {
		return row, err
	}
	if out.Content != "" {
		if err := t.streamedWhole(out.MessageID, out.Content); err != nil {
			return row, err
		}
	}
	cpID := chat.NewID(chat.PrefixCheckpoint)
	ids := append([]string{}, head.MessageIDs...)
	if out.Content != "" {
		kind := out.Kind
		if kind == "" {
			kind = chat.KindText
		}
		if _, err := t.publishMessage(c, chat.Message{
			MessageID: out.MessageID,
			Role:      chat.RoleAssistant,
			Kind:      kind,
			Content:   out.Content,
			Model:     out.Model,
			Truncated: out.Truncated,
		}, cpID, runID); err != nil {
			return row, err
		}
		ids = append(ids, out.MessageID)
	}
	var pending *chat.Pending
	if call := out.Call; call != nil {
		phase := chat.PhaseRunning
		if call.Contract == "consequential" {
			phase = chat.PhasePrepared
		}
		op := chat.Operation{
			OperationID: call.OperationID,
			RunID:       runID,
			ThreadID:    row.ThreadID,
			Tool:        call.Tool,
			Contract:    call.Contract,
			Phase:       phase,
			Args:        call.Args,
			Preview:     call.Preview,
			CreatedAt:   t.now.UTC(),
			UpdatedAt:   t.now.UTC(),
		}
		if call.IdempotencyKey != "" {
			op.IdempotencyKey = &call.IdempotencyKey
		}
		if err := t.insertOperation(op); err != nil {
			return row, err
		}
		typ := chat.EventToolUpdated
		if phase == chat.PhasePrepared {
			typ = chat.EventToolPrepared
		}
		if err := t.operationEvent(c, typ, op.OperationID); err != nil {
			return row, err
		}
		pending = &chat.Pending{Step: chat.StepTool, InputHash: call.OperationID}
	}
	if _, err := t.addCheckpoint(c, chat.Checkpoint{
		CheckpointID: cpID, ParentCheckpointID: &head.CheckpointID, MessageIDs: ids,
		CompletedSteps: append(append([]string{}, head.CompletedSteps...), chat.StepGenerate),
		ToolResults:    head.ToolResults, Pending: pending,
	}, runID); err != nil {
		return row, err
	}
	if out.Call != nil && out.Call.Contract == "consequential" {
		if err := transition(row, chat.RunWaitingConfirmation); err != nil {
			return row, err
		}
		t.runChanged(runID)
		if _, err := t.exec(`UPDATE runs SET status = 'waiting_confirmation', lease_owner = NULL,
			lease_expires_at = NULL,
			updated_at = ? WHERE run_id = ?`, ms(t.now), runID); err != nil {
			return row, fmt.Errorf("wait for confirmation: %w", err)
		}
		ev := t.event(c, chat.EventRunWaitingConfirmation, runID)
		ev.Body = chat.RunWaitingConfirmationBody{OperationID: out.Call.OperationID}
		return row, t.append(ev)
	}
	return row, nil
}

// waitsOn refuses a step the head checkpoint is not waiting on: a step
// already published (by this execution or another of the same run), or
// one overtaken by a change of the conversation. Reaching it means the
// caller is stale; it is reported as chat.ErrStepNotPending.
func waitsOn(head chat.Checkpoint, step chat.Pending) error {
	if head.Pending == nil || *head.Pending != step {
		return fmt.Errorf(
			"%w: checkpoint %s waits on %v, not on %v",
			chat.ErrStepNotPending, head.CheckpointID, head.Pending, step,
		)
	}
	return nil
}

func (t *txn) insertOperation(op chat.Operation) error {
	var preview any
	if len(op.Preview) > 0 {
		preview = string(op.Preview)
	}
	_, err := t.exec(`INSERT INTO operations (operation_id, run_id, thread_id, tool, contract, phase, args, preview,
		idempotency_key, outcome, result_ref, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)`,
		op.OperationID, op.RunID, op.ThreadID, op.Tool, op.Contract, op.Phase, string(op.Args), preview,
		nullStrPtr(op.IdempotencyKey), ms(t.now), ms(t.now))
	if err != nil {
		return fmt.Errorf("record operation: %w", err)
	}
	return nil
}

func (t *txn) operation(opID string) (operationRow, error) {
	var op operationRow
	err := t.get(&op, `SELECT `+operationCols+` FROM operations WHERE operation_id = ?`, opID)
	if errors.Is(err, sql.ErrNoRows) {
		return op, chat.NotFound("operation", opID)
	}
	if err != nil {
		return op, fmt.Errorf("load operation: %w", err)
	}
	return op, nil
}

// operationEvent appends tool.prepared or tool.updated carrying the
// operation as it now is.
func (t *txn) operationEvent(c *threadCursor, typ, opID string) error {
	op, err := t.operation(opID)
	if err != nil {
		return err
	}
	ev := t.event(c, typ, op.RunID)
	ev.Body = chat.ToolBody{Operation: op.operation()}
	return t.append(ev)
}

// setPhase moves an operation and reports it with tool.updated.
func (t *txn) setPhase(c *threadCursor, opID, phase, outcome string) error {
	if err := t.updateOperation(opID, phase, outcome, "", false); err != nil {
		return err
	}
	return t.operationEvent(c, chat.EventToolUpdated, opID)
}

// updateOperation writes an operation's phase, outcome ("" keeps it) and
// result (resultRef "" keeps it), with what the phase implies: entering
// committing records when the call was first handed to its system;
// entering unknown schedules reconciliation by key (reconcile.go) unless
// it is scheduled already, or, when its system cannot be asked
// (noLookup), is recorded as given up at once (no next lookup, a horizon on
// record: how reconcile.go leaves one past its horizon); a settled phase
// ends it.
func (t *txn) updateOperation(opID, phase, outcome, resultRef string, noLookup bool) error {
	now := ms(t.now)
	var started, next, until any // nil: keep
	switch {
	case phase == chat.PhaseCommitting:
		started = now
	case phase == chat.PhaseUnknown && noLookup:
		until = now
	case phase == chat.PhaseUnknown:
		next, until = now+reconcileDelay(0).Milliseconds(), now+t.horizon.Milliseconds()
	}
	settled := phase != chat.PhaseUnknown || noLookup // no next lookup
	if _, err := t.exec(`UPDATE operations SET phase = ?, outcome = COALESCE(?, outcome), result_ref = COALESCE(?,
		result_ref),
		commit_started_at = COALESCE(commit_started_at, ?),
		reconcile_next_at = CASE WHEN ? THEN NULL ELSE COALESCE(reconcile_next_at, ?) END,
		reconcile_until = COALESCE(reconcile_until, ?), updated_at = ? WHERE operation_id = ?`,
		phase, nullStr(outcome), nullStr(resultRef), started, settled, next, until, now, opID); err != nil {
		return fmt.Errorf("update operation: %w", err)
	}
	return nil
}

// ownWorking loads a run that lease still holds and that is running or,
// with its cancel accepted, still finishing the operation in flight.
func (t *txn) ownWorking(lease chat.Lease) (runRow, error) {
	row, err := t.run(lease.RunID)
	if err != nil {
		return row, err
	}
	st := row.status()
	if !row.holds(lease) {
		return row, &chat.ErrNotRunning{Status: st, Fenced: true}
	}
	if st != chat.RunRunning && st != chat.RunCancelRequested && st != chat.RunCancelling {
		return row, &chat.ErrNotRunning{Status: st}
	}
	return row, nil
}

// SetOperationPhase moves an operation of a run lease holds (committing,
// unknown, aborted, voided …) and reports it. With needRunning, a recorded
// cancel refuses the move (*chat.ErrNotRunning): the safe point before an
// irreversible commit.
func (s *Store) SetOperationPhase(
	ctx context.Context,
	lease chat.Lease,
	opID, phase, outcome string,
	needRunning bool,
) error {
	return s.write(ctx, func(t *txn) error {
		row, err := t.ownWorking(lease)
		if err != nil {
			return err
		}
		if needRunning && row.status() != chat.RunRunning {
			return &chat.ErrNotRunning{Status: row.status()}
		}
		c, err := t.engineThread(row.ThreadID)
		if err != nil {
			return err
		}
		return t.setPhase(c, opID, phase, outcome)
	})
}

// RecordToolProgress reports a working tool's progress with tool.updated
// (the operation as stored, with Progress). Only while the run is
// running under lease and the operation is still at work (running or
// committing): a cancel recorded, or a step settled, refuses it
// (chat.ErrNotRunning), so no progress follows a run's end.
func (s *Store) RecordToolProgress(ctx context.Context, lease chat.Lease, opID string, p chat.ToolProgress) error {
	return s.write(ctx, func(t *txn) error {
		row, err := t.ownWorking(lease)
		if err != nil {
			return err
		}
		if row.status() != chat.RunRunning {
			return &chat.ErrNotRunning{Status: row.status()}
		}
		op, err := t.operation(opID)
		if err != nil {
			return err
		}
		if op.RunID != row.RunID || (op.Phase != chat.PhaseRunning && op.Phase != chat.PhaseCommitting) {
			return &chat.ErrNotRunning{Status: row.status()}
		}
		c, err := t.engineThread(row.ThreadID)
		if err != nil {
			return err
		}
		reported := op.operation()
		reported.Progress = &p
		ev := t.event(c, chat.EventToolUpdated, op.RunID)
		ev.Body = chat.ToolBody{Operation: reported}
		return t.append(ev)
	})
}

// RecordToolResult ends an operation with its outcome and, when there is a
// result, publishes it as a tool message under a new head checkpoint whose
// pending step is generate, so the run (or the next one, after a cancel)
// continues from it instead of calling the tool again. It is allowed after
// a cancel was recorded, until the run is cancelled: a result that arrived
// first is a fact.
//
// The thread must still wait on that operation's tool step: a result is
// recorded once (chat.ErrStepNotPending otherwise).
func (s *Store) RecordToolResult(ctx context.Context, lease chat.Lease, opID string, out chat.ToolOutcome) error {
	return s.write(ctx, func(t *txn) error {
		row, err := t.ownWorking(lease)
		if err != nil {
			return err
		}
		return t.recordToolResult(row, opID, out)
	})
}

func (t *txn) recordToolResult(row runRow, opID string, out chat.ToolOutcome) error {
	c, err := t.engineThread(row.ThreadID)
	if err != nil {
		return err
	}
	op, err := t.operation(opID)
	if err != nil {
		return err
	}
	if out.Result == nil {
		if err := t.updateOperation(opID, out.Phase, out.Outcome, "", out.NoLookup); err != nil {
			return err
		}
		return t.operationEvent(c, chat.EventToolUpdated, opID)
	}
	head, err := t.checkpoint(row.ThreadID, c.row.HeadCheckpointID)
	if err != nil {
		return err
	}
	if err := waitsOn(head, chat.Pending{Step: chat.StepTool, InputHash: opID}); err != nil {
		return err
	}
	msgID := chat.NewID(chat.PrefixMessage)
	cpID := chat.NewID(chat.PrefixCheckpoint)
	if err := t.updateOperation(opID, out.Phase, out.Outcome, msgID, out.NoLookup); err != nil {
		return fmt.Errorf("record tool result: %w", err)
	}
	if err := t.operationEvent(c, chat.EventToolUpdated, opID); err != nil {
		return err
	}
	content, err := json.Marshal(struct {
		Tool        string          `json:"tool"`
		OperationID string          `json:"operation_id"`
		Arguments   json.RawMessage `json:"arguments"`
		Result      json.RawMessage `json:"result"`
	}{op.Tool, opID, json.RawMessage(op.Args), out.Result})
	if err != nil {
		return err
	}
	if _, err := t.publishMessage(c, chat.Message{
		MessageID: msgID,
		Role:      chat.RoleTool,
		Kind:      chat.KindText,
		Content:   string(content),
	}, cpID, row.RunID); err != nil {
		return err
	}
	_, err = t.addCheckpoint(c, chat.Checkpoint{
		CheckpointID: cpID, ParentCheckpointID: &head.CheckpointID,
		MessageIDs:     append(append([]string{}, head.MessageIDs...), msgID),
		CompletedSteps: append(append([]string{}, head.CompletedSteps...), chat.StepTool),
		ToolResults: append(
			append([]chat.ToolResult{}, head.ToolResults...),
			chat.ToolResult{OperationID: opID, Tool: op.Tool, ResultRef: msgID},
		),
		Pending: &chat.Pending{
			Step:      chat.StepGenerate,
			InputHash: inputHash(append(append([]string{}, head.MessageIDs...), msgID)),
		},
	}, row.RunID)
	return err
}

// MarkCancelling records that a cancel is accepted but an operation in
// flight (a commit handed to an external system, a tool that cannot be
// stopped) is not yet settled: run.cancelling names it.
func (s *Store) MarkCancelling(ctx context.Context, lease chat.Lease, active chat.ActiveOperation) error {
	return s.write(ctx, func(t *txn) error {
		row, err := t.ownWorking(lease)
		runID := lease.RunID
		if err != nil {
			return err
		}
		if row.status() != chat.RunCancelRequested {
			return nil
		}
		if err := transition(row, chat.RunCancelling); err != nil {
			return err
		}
		c, err := t.engineThread(row.ThreadID)
		if err != nil {
			return err
		}
		t.runChanged(runID)
		if _, err := t.exec(`UPDATE runs SET status = 'cancelling', updated_at = ? WHERE run_id = ?`,
			ms(t.now), runID); err != nil {
			return fmt.Errorf("mark cancelling: %w", err)
		}
		ev := t.event(c, chat.EventRunCancelling, runID)
		ev.Body = chat.RunCancellingBody{ActiveOperation: active}
		return t.append(ev)
	})
}

// DecideOperation performs tool.confirm (confirm true) or tool.reject on a
// prepared operation of a run waiting for confirmation. Confirm hands the
// run to a worker (running, no lease) to commit; reject records the refusal
// as the tool's result, and the run continues from it.
func (s *Store) DecideOperation(ctx context.Context, p chat.Decide) (chat.ConfirmAck, error) {
	if err := p.Validate(); err != nil {
		return chat.ConfirmAck{}, err
	}
	userID, opID, expected, confirm := p.UserID, p.OperationID, p.ExpectedStateVersion, p.Confirm
	var ack chat.ConfirmAck
	err := s.write(ctx, func(t *txn) error {
		op, err := t.operation(opID)
		if err != nil {
			return err
		}
		c, err := t.thread(userID, op.ThreadID)
		if chat.ErrorCode(err) == chat.CodeNotFound {
			return chat.NotFound("operation", opID) // another user's: as unknown as a random id
		}
		if err != nil {
			return err
		}
		if err := t.checkVersion(c, expected, ""); err != nil {
			return err
		}
		row, err := t.run(op.RunID)
		if err != nil {
			return err
		}
		if op.Phase != chat.PhasePrepared || row.status() != chat.RunWaitingConfirmation {
			return chat.Errorf(chat.CodeOperationNotPending, "operation %s is %s, not waiting for a decision: "+
				"reload to see what happened to it", opID, op.Phase).
				With("operation_id", opID).
				With("phase", op.Phase)
		}
		if err := transition(row, chat.RunRunning); err != nil {
			return err
		}
		t.runChanged(row.RunID)
		if _, err := t.exec(`UPDATE runs SET status = 'running', lease_owner = NULL, lease_expires_at = NULL,
			updated_at = ?
			WHERE run_id = ?`, ms(t.now), row.RunID); err != nil {
			return fmt.Errorf("resume run: %w", err)
		}
		phase := chat.PhaseConfirmed
		if confirm {
			err = t.setPhase(c, opID, phase, "")
		} else {
			phase = chat.PhaseRejected
			err = t.recordToolResult(row, opID, chat.ToolOutcome{
				Phase:   phase,
				Outcome: chat.OutcomeNotStarted,
				Result:  json.RawMessage(`{"status":"rejected"}`),
			})
		}
		if err != nil {
			return err
		}
		ack = chat.ConfirmAck{OperationID: opID, Phase: phase, StateVersion: c.row.StateVersion}
		return nil
	})
	return ack, err
}

// Operation returns one operation of the user.
func (s *Store) Operation(ctx context.Context, userID, opID string) (chat.Operation, error) {
	var op operationRow
	err := s.reader.GetContext(
		ctx, &op,
		s.reader.Rebind(`SELECT `+operationCols+` FROM operations WHERE operation_id = ?`),
		opID,
	)
	if errors.Is(err, sql.ErrNoRows) {
		return chat.Operation{}, chat.NotFound("operation", opID)
	}
	if err != nil {
		return chat.Operation{}, fmt.Errorf("load operation: %w", err)
	}
	if _, err := s.Thread(ctx, userID, op.ThreadID); err != nil {
		return chat.Operation{}, chat.NotFound("operation", opID)
	}
	return op.operation(), nil
}
