package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/tools"
)

// Bounds on tool calls, which run outside any cancel's reach once handed
// off.
const (
	toolTimeout     = 2 * time.Minute
	reconcileTries  = 4
	reconcileBackof = 200 * time.Millisecond
)

// prepareCall turns the model's call into an operation to record: a known
// tool, valid arguments, and for a consequential tool its draft and
// business idempotency key.
func (e *Engine) prepareCall(in chat.RunInput, call *model.ToolCall) (*chat.ToolCall, error) {
	if e.tools == nil {
		return nil, chat.Errorf(chat.CodeInternal, "the model asked for tool %q, but no tools are configured", call.Name)
	}
	t, ok := e.tools.Get(call.Name)
	if !ok {
		return nil, chat.Errorf(chat.CodeInternal, "the model asked for an unknown tool %q; nothing was called", call.Name)
	}
	args, err := t.Validate(call.Arguments)
	if err != nil {
		return nil, chat.Errorf(chat.CodeInternal, "the model called %s with arguments that do not fit its schema (%v); nothing was called", call.Name, err)
	}
	spec := t.Spec()
	tc := &chat.ToolCall{OperationID: chat.NewID(chat.PrefixOperation), Tool: spec.Name, Contract: spec.Contract, Args: args}
	if c, ok := t.(tools.Committer); ok && spec.Contract == tools.Consequential {
		preview, key, err := c.Prepare(in.Run.ThreadID, args)
		if err != nil {
			return nil, chat.Errorf(chat.CodeInternal, "could not prepare %s: %v; nothing was sent", call.Name, err)
		}
		tc.Preview, tc.IdempotencyKey = preview, key
	} else {
		tc.IdempotencyKey = tc.OperationID
	}
	return tc, nil
}

// toolStep performs the operation the head checkpoint waits on and records
// its outcome: a runner tool runs (an idempotent one is waited for even
// after a cancel, and its result kept for the next run); a confirmed
// consequential call passes the safe point before commit, is handed to the
// external system with its key, and is reconciled by that key when its
// outcome is unknown.
func (e *Engine) toolStep(ctx context.Context, in chat.RunInput) error {
	op := in.Operation
	t, ok := e.tools.Get(op.Tool)
	if !ok {
		return fmt.Errorf("operation %s names tool %q, which is not configured any more", op.OperationID, op.Tool)
	}
	runID, owner := in.Run.RunID, e.cfg.InstanceID
	key := op.OperationID
	if op.IdempotencyKey != nil {
		key = *op.IdempotencyKey
	}
	write := context.WithoutCancel(ctx)
	switch tool := t.(type) {
	case tools.Committer:
		if op.Phase == chat.PhaseConfirmed {
			// The safe point before an irreversible action: a recorded
			// cancel voids the intent here, and nothing is sent.
			if err := e.store.SetOperationPhase(write, runID, owner, op.OperationID, chat.PhaseCommitting, "", true); err != nil {
				return err
			}
		}
		return e.commit(ctx, in, tool, key)
	case tools.Runner:
		return e.runTool(ctx, in, tool, key)
	}
	return fmt.Errorf("tool %s can neither run nor commit", op.Tool)
}

// runTool runs a cancellable or idempotent tool.
func (e *Engine) runTool(ctx context.Context, in chat.RunInput, t tools.Runner, key string) error {
	op := in.Operation
	runID, owner := in.Run.RunID, e.cfg.InstanceID
	write := context.WithoutCancel(ctx)
	callCtx := ctx
	if op.Contract == tools.Idempotent {
		// Not stopped by a cancel: its result will be recorded and reused.
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), toolTimeout)
		defer cancel()
	}
	result, err := e.await(ctx, in, callCtx, "tool", func(c context.Context) (json.RawMessage, error) {
		return t.Run(c, key, op.Args)
	})
	switch {
	case err != nil && callCtx.Err() != nil && ctx.Err() != nil:
		if errors.Is(context.Cause(ctx), errShutdown) && op.Contract == tools.Idempotent {
			return ctx.Err() // runs again under the same key after the restart
		}
		if err := e.store.SetOperationPhase(write, runID, owner, op.OperationID, chat.PhaseAborted, chat.OutcomeAborted, false); err != nil {
			return err
		}
		return ctx.Err()
	case err != nil:
		result, _ = json.Marshal(map[string]string{"status": "failed", "error": err.Error()})
		if err := e.store.RecordToolResult(write, runID, owner, op.OperationID, chat.ToolOutcome{Phase: chat.PhaseFailed, Outcome: chat.OutcomeFailed, Result: result}); err != nil {
			return err
		}
	default:
		if err := e.store.RecordToolResult(write, runID, owner, op.OperationID, chat.ToolOutcome{Phase: chat.PhaseCompleted, Outcome: chat.OutcomeCompleted, Result: result}); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err() // the cancel (or shutdown) waited for the result
	}
	return nil
}

// commit hands a confirmed call to the external system with its key, and
// settles an outcome nobody saw by looking the key up. A cancel that
// arrives meanwhile cannot recall the call: the run reports cancelling and
// waits for the truth.
func (e *Engine) commit(ctx context.Context, in chat.RunInput, t tools.Committer, key string) error {
	op := in.Operation
	runID, owner := in.Run.RunID, e.cfg.InstanceID
	write := context.WithoutCancel(ctx)
	callCtx, cancel := context.WithTimeout(write, toolTimeout)
	defer cancel()
	record := func(phase, outcome string, result json.RawMessage) error {
		return e.store.RecordToolResult(write, runID, owner, op.OperationID, chat.ToolOutcome{Phase: phase, Outcome: outcome, Result: result})
	}
	// An outcome left open (a crash, a lost answer) is looked up first: the
	// key may already have acted.
	var lastErr, lookupErr error
	if op.Phase == chat.PhaseCommitting || op.Phase == chat.PhaseUnknown {
		st, err := t.Status(callCtx, key)
		if err == nil && st.Known {
			return e.afterTool(ctx, record(chat.PhaseReconciled, chat.OutcomeCommitted, st.Result))
		}
		lookupErr = err
	}
	unknown := op.Phase == chat.PhaseUnknown
	retry := op.Phase == chat.PhaseCommitting || op.Phase == chat.PhaseUnknown
	for try := 0; try < reconcileTries; try++ {
		if retry && (in.Run.Status.CancelAccepted() || errors.Is(context.Cause(ctx), errCancelRequested)) {
			if lookupErr != nil {
				// The system could not be asked whether it acted: the
				// cancel must not claim it never did.
				res, _ := json.Marshal(map[string]string{"status": "unknown", "error": fmt.Sprintf("cancelled before the outcome was known; looking the key up failed: %v", lookupErr)})
				return e.afterTool(ctx, record(chat.PhaseUnknown, chat.OutcomeUnknown, res))
			}
			// The external system never got it (it said so), and the user
			// has cancelled since: the intent is voided rather than sent
			// after the cancel.
			return e.afterTool(ctx, e.store.SetOperationPhase(write, runID, owner, op.OperationID, chat.PhaseVoided, chat.OutcomeNotStarted, false))
		}
		retry = true
		result, err := e.await(ctx, in, callCtx, "tool_commit", func(c context.Context) (json.RawMessage, error) {
			return t.Commit(c, key, op.Args)
		})
		switch {
		case err == nil:
			return e.afterTool(ctx, record(chat.PhaseCommitted, chat.OutcomeCommitted, result))
		case errors.Is(err, tools.ErrRejected):
			res, _ := json.Marshal(map[string]string{"status": "failed", "error": err.Error()})
			return e.afterTool(ctx, record(chat.PhaseFailed, chat.OutcomeFailed, res))
		}
		lastErr = err
		// Nobody knows whether it acted: say so, then ask by key.
		if !unknown {
			if err := e.store.SetOperationPhase(write, runID, owner, op.OperationID, chat.PhaseUnknown, chat.OutcomeUnknown, false); err != nil {
				return err
			}
			unknown = true
		}
		select {
		case <-time.After(reconcileBackof << try):
		case <-callCtx.Done():
		}
		st, err := t.Status(callCtx, key)
		lookupErr = err
		if err == nil && st.Known {
			return e.afterTool(ctx, record(chat.PhaseReconciled, chat.OutcomeCommitted, st.Result))
		}
		// Not known there: it never acted, and committing again under the
		// same key is safe. (When the lookup itself failed, the retry rests
		// on the system honouring the key.)
	}
	if lookupErr != nil {
		// The system could not be asked: the outcome stays unknown, and the
		// result says so instead of guessing.
		res, _ := json.Marshal(map[string]string{"status": "unknown", "error": fmt.Sprintf("%v; looking the key up failed: %v", lastErr, lookupErr)})
		return e.afterTool(ctx, record(chat.PhaseUnknown, chat.OutcomeUnknown, res))
	}
	res, _ := json.Marshal(map[string]string{"status": "failed", "error": fmt.Sprint(lastErr)})
	return e.afterTool(ctx, record(chat.PhaseFailed, chat.OutcomeFailed, res))
}

// afterTool returns the recording's error, or the run context's when a
// cancel or shutdown came while the tool worked (its outcome is recorded).
func (e *Engine) afterTool(ctx context.Context, err error) error {
	if err != nil {
		return err
	}
	return ctx.Err()
}

// await runs call on callCtx. If the run's context ends first because of a
// cancel, the run is marked cancelling (the operation in flight named) and
// the call is still awaited; on shutdown the call is awaited as well, since
// its outcome must be recorded either way (callCtx bounds it).
func (e *Engine) await(ctx context.Context, in chat.RunInput, callCtx context.Context, kind string, call func(context.Context) (json.RawMessage, error)) (json.RawMessage, error) {
	type answer struct {
		res json.RawMessage
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := call(callCtx)
		done <- answer{res, err}
	}()
	select {
	case a := <-done:
		return a.res, a.err
	case <-ctx.Done():
	}
	if callCtx.Err() == nil && errors.Is(context.Cause(ctx), errCancelRequested) {
		err := e.store.MarkCancelling(context.WithoutCancel(ctx), in.Run.RunID, e.cfg.InstanceID,
			chat.ActiveOperation{Kind: kind, OperationID: in.Operation.OperationID})
		if err != nil {
			e.log.Error("mark cancelling", "run_id", in.Run.RunID, "err", err)
		}
	}
	a := <-done
	return a.res, a.err
}
