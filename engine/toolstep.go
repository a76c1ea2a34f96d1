package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
//
// The key is the action's, not the attempt's: it is derived from the step
// of the conversation that asks for the call — its lineage, the pending
// step's input hash, which a resumed attempt, a fork and a continuation
// from an older checkpoint all share — and the arguments. So re-running a
// step whose action already happened (after a cancel, in a fork) names the
// same key, and the provider answers that it was done; a new request in
// the conversation is a new action. prior is the key of the same call
// prepared before (its re-run after a cancel voided it), reused as is.
func (e *Engine) prepareCall(in chat.RunInput, call *model.ToolCall, prior string) (*chat.ToolCall, error) {
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
		preview, key, err := c.Prepare(stepScope(in.Pending), args)
		if err != nil {
			return nil, chat.Errorf(chat.CodeInternal, "could not prepare %s: %v; nothing was sent", call.Name, err)
		}
		if prior != "" {
			key = prior
		}
		tc.Preview, tc.IdempotencyKey = preview, key
	} else {
		tc.IdempotencyKey = tc.OperationID
	}
	return tc, nil
}

// stepScope names the step a call belongs to in its keys: "step-" and 24
// hex digits of the pending step's input hash (its lineage, see
// prepareCall).
func stepScope(p *chat.Pending) string {
	h := ""
	if p != nil {
		h = strings.TrimPrefix(p.InputHash, "sha256:")
	}
	if len(h) > 24 {
		h = h[:24]
	}
	return "step-" + h
}

// toolStep performs the operation the head checkpoint waits on and records
// its outcome: a runner tool runs (an idempotent one is waited for even
// after a cancel, and its result kept for the next run); a confirmed
// consequential call passes the safe point before commit, is handed to the
// external system with its key, and is reconciled by that key when its
// outcome is unknown.
func (e *Engine) toolStep(ctx context.Context, in chat.RunInput, lease chat.Lease) error {
	op := in.Operation
	t, ok := e.tools.Get(op.Tool)
	if !ok {
		return fmt.Errorf("operation %s names tool %q, which is not configured any more", op.OperationID, op.Tool)
	}
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
			if err := e.store.SetOperationPhase(write, lease, op.OperationID, chat.PhaseCommitting, "", true); err != nil {
				return err
			}
		}
		return e.commit(ctx, in, lease, tool, key)
	case tools.Runner:
		return e.runTool(ctx, in, lease, tool, key)
	}
	return fmt.Errorf("tool %s can neither run nor commit", op.Tool)
}

// runTool runs a cancellable or idempotent tool.
func (e *Engine) runTool(ctx context.Context, in chat.RunInput, lease chat.Lease, t tools.Runner, key string) error {
	op := in.Operation
	write := context.WithoutCancel(ctx)
	callCtx := ctx
	if op.Contract == tools.Idempotent {
		// Not stopped by a cancel: its result will be recorded and reused.
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), toolTimeout)
		defer cancel()
	}
	callCtx, stopProgress := e.progressOf(callCtx, write, lease, op.OperationID)
	result, err := e.await(ctx, in, lease, callCtx, "tool", func(c context.Context) (json.RawMessage, error) {
		return t.Run(c, key, op.Args)
	})
	stopProgress()
	switch {
	case err != nil && callCtx.Err() != nil && ctx.Err() != nil:
		if errors.Is(context.Cause(ctx), errShutdown) && op.Contract == tools.Idempotent {
			return ctx.Err() // runs again under the same key after the restart
		}
		if err := e.store.SetOperationPhase(write, lease, op.OperationID, chat.PhaseAborted, chat.OutcomeAborted, false); err != nil {
			return err
		}
		return ctx.Err()
	case err != nil:
		result, _ = json.Marshal(map[string]string{"status": "failed", "error": err.Error()})
		if err := e.store.RecordToolResult(write, lease, op.OperationID, chat.ToolOutcome{Phase: chat.PhaseFailed, Outcome: chat.OutcomeFailed, Result: result}); err != nil {
			return err
		}
	default:
		if err := e.store.RecordToolResult(write, lease, op.OperationID, chat.ToolOutcome{Phase: chat.PhaseCompleted, Outcome: chat.OutcomeCompleted, Result: result}); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err() // the cancel (or shutdown) waited for the result
	}
	return nil
}

// commit hands a confirmed call to the external system with its key, and
// settles an outcome nobody saw by looking the key up.
//
// Only the system's own word settles an outcome: an answer to the call
// (done, or refused: nothing happened), or a lookup that finds the key.
// A lost answer, a timeout or a lookup that does not find the key (yet: a
// system may record a key only once it finished acting) leaves it
// unknown. While the run goes on, the call is tried again under the same
// key a few times when the system acts once per key (tools.Resender), and
// never otherwise: a system that does not deduplicate gets each key at
// most once, also across a restart. A cancel never tries again:
// once the call may have reached the system, a cancel cannot recall it,
// so it is reported unknown and never not_started. An outcome still
// unknown is recorded as such (the model and the receipt say so), and the
// engine's reconciler keeps looking the key up after the run moved on or
// ended, until the system answers or the horizon passes.
func (e *Engine) commit(ctx context.Context, in chat.RunInput, lease chat.Lease, t tools.Committer, key string) error {
	op := in.Operation
	write := context.WithoutCancel(ctx)
	callCtx, cancel := context.WithTimeout(write, toolTimeout)
	defer cancel()
	record := func(phase, outcome string, result json.RawMessage) error {
		return e.store.RecordToolResult(write, lease, op.OperationID, chat.ToolOutcome{Phase: phase, Outcome: outcome, Result: result})
	}
	// recordUnknown records an outcome nobody saw, after a lookup by key
	// that did not find it: the reconciler asks again later, unless the
	// system cannot be asked at all.
	recordUnknown := func(what string, callErr, lookupErr error) error {
		return e.store.RecordToolResult(write, lease, op.OperationID, chat.ToolOutcome{
			Phase: chat.PhaseUnknown, Outcome: chat.OutcomeUnknown, Result: unknownResult(key, what, callErr, lookupErr),
			NoLookup: errors.Is(lookupErr, tools.ErrNoLookup)})
	}
	cancelled := func() bool {
		return in.Run.Status.CancelAccepted() || errors.Is(context.Cause(ctx), errCancelRequested)
	}
	// An outcome left open (a crash, a lost answer) is looked up first: the
	// key may already have acted.
	var lastErr, lookupErr error
	sent := op.Phase == chat.PhaseCommitting || op.Phase == chat.PhaseUnknown // may have reached the system
	if sent {
		st, err := t.Status(callCtx, key)
		if err == nil && st.Known {
			return e.afterTool(ctx, record(chat.PhaseReconciled, chat.OutcomeCommitted, st.Result))
		}
		lookupErr = err
	}
	resend := tools.ResendSafe(t)
	if sent && !resend {
		// It may have reached a system that does not deduplicate by key:
		// a second send could act twice (invariant 2).
		return e.afterTool(ctx, recordUnknown(notResent, nil, lookupErr))
	}
	unknown := op.Phase == chat.PhaseUnknown
	for try := 0; try < reconcileTries; try++ {
		if sent && cancelled() {
			return e.afterTool(ctx, recordUnknown("cancelled before the provider said whether it acted", lastErr, lookupErr))
		}
		sent = true
		withProgress, stopProgress := e.progressOf(callCtx, write, lease, op.OperationID)
		result, err := e.await(ctx, in, lease, withProgress, "tool_commit", func(c context.Context) (json.RawMessage, error) {
			return t.Commit(c, key, op.Args)
		})
		stopProgress()
		switch {
		case err == nil:
			return e.afterTool(ctx, record(chat.PhaseCommitted, chat.OutcomeCommitted, result))
		case errors.Is(err, tools.ErrRejected):
			// The system answered that it did nothing.
			res, _ := json.Marshal(map[string]string{"status": "failed", "error": err.Error()})
			return e.afterTool(ctx, record(chat.PhaseFailed, chat.OutcomeFailed, res))
		}
		lastErr = err
		if !resend {
			st, err := t.Status(callCtx, key)
			if err == nil && st.Known {
				return e.afterTool(ctx, record(chat.PhaseReconciled, chat.OutcomeCommitted, st.Result))
			}
			return e.afterTool(ctx, recordUnknown(notResent, lastErr, err))
		}
		// Nobody knows whether it acted: say so, then ask by key.
		if !unknown {
			if err := e.store.SetOperationPhase(write, lease, op.OperationID, chat.PhaseUnknown, chat.OutcomeUnknown, false); err != nil {
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
	}
	return e.afterTool(ctx, recordUnknown("the provider did not confirm the call", lastErr, lookupErr))
}

// notResent says why a call that may have reached its system is not sent
// again (see tools.Resender).
const notResent = "the call may have reached the provider, which does not deduplicate by key, so it is not sent again"

// progressInterval is the least time between two recorded progress
// reports of one tool call (each is a durable tool.updated event).
const progressInterval = time.Second

// progressOf returns callCtx carrying a progress sink for the tool call of
// operation opID (tools.WithProgress), and stop, which ends recording and
// waits for it. The sink never blocks: it keeps the latest report, and
// one goroutine records it with store.RecordToolProgress, at most one per
// progressInterval (the first at once). The store refuses a report once
// the run is no longer running or the step settled; recording then ends.
func (e *Engine) progressOf(callCtx, write context.Context, lease chat.Lease, opID string) (context.Context, func()) {
	latest := make(chan chat.ToolProgress, 1)
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		var last time.Time
		for {
			var p chat.ToolProgress
			select {
			case <-done:
				return
			case p = <-latest:
			}
			if wait := progressInterval - time.Since(last); wait > 0 {
				select {
				case <-done:
					return
				case <-time.After(wait):
				}
				select {
				case p = <-latest: // a newer report came meanwhile
				default:
				}
			}
			last = time.Now()
			if err := e.store.RecordToolProgress(write, lease, opID, p); err != nil {
				e.log.Debug("tool progress not recorded; no more of this call's will be", "operation_id", opID, "err", err)
				<-done
				return
			}
		}
	}()
	report := func(p chat.ToolProgress) {
		for {
			select {
			case latest <- p:
				return
			default:
			}
			select {
			case <-latest: // drop the older report
			default:
			}
		}
	}
	return tools.WithProgress(callCtx, report), func() {
		close(done)
		<-finished
	}
}

// unknownResult is the recorded result of a call whose outcome nobody
// knows yet: what happened, and whether the key is still being looked up
// ("lookup": "scheduled"), or cannot be ("none": the system cannot be
// asked), in words for a model and as a field for code.
func unknownResult(key, what string, callErr, lookupErr error) json.RawMessage {
	res := map[string]string{
		"status": "unknown",
		"key":    key,
		"lookup": "scheduled",
		"note":   what + "; it may have acted. The gateway keeps looking the key up and reports what it finds.",
	}
	if errors.Is(lookupErr, tools.ErrNoLookup) {
		res["lookup"] = "none"
		res["note"] = what + "; it may have acted. The provider cannot be asked whether it did: only its own records, by the key, can tell."
	} else if lookupErr != nil {
		res["lookup_error"] = lookupErr.Error()
	}
	if callErr != nil {
		res["error"] = callErr.Error()
	}
	b, _ := json.Marshal(res)
	return b
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
func (e *Engine) await(ctx context.Context, in chat.RunInput, lease chat.Lease, callCtx context.Context, kind string, call func(context.Context) (json.RawMessage, error)) (json.RawMessage, error) {
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
		err := e.store.MarkCancelling(context.WithoutCancel(ctx), lease,
			chat.ActiveOperation{Kind: kind, OperationID: in.Operation.OperationID})
		var lost *chat.ErrNotRunning
		switch {
		case errors.As(err, &lost):
			// The run moved on (another claim holds it): its holder reports.
			e.log.Warn("mark cancelling: the run moved on", "run_id", in.Run.RunID, "err", err)
		case err != nil:
			e.log.Error("mark cancelling", "run_id", in.Run.RunID, "err", err)
		}
	}
	a := <-done
	return a.res, a.err
}
