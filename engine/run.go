package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/tools"
)

// storeTimeout bounds the writes a worker makes to settle its run after its
// own context ended.
const storeTimeout = 10 * time.Second

// execute owns one run, claimed at claimed, until it is settled: completed,
// failed, cancelled, or handed back to the queue on shutdown.
func (e *Engine) execute(run *chat.Run, claimed time.Time) {
	ctx, cancel := context.WithCancelCause(e.ctx)
	defer cancel(nil)
	e.metrics.RunsExecuting(1)
	defer e.metrics.RunsExecuting(-1)
	// Register before the first read of the run: a cancel recorded after
	// that read finds the registration; one recorded before it is seen by
	// the read.
	//
	// The same run may be claimed again (after a confirmation) while this
	// execution is still unwinding, so only this execution's own entry is
	// removed: deleting by id alone would unregister the new execution and
	// leave its cancel unheard.
	me := &liveRun{cancel: cancel}
	e.mu.Lock()
	e.running[run.RunID] = me
	e.mu.Unlock()
	unregister := func() {
		e.mu.Lock()
		if e.running[run.RunID] == me {
			delete(e.running, run.RunID)
		}
		e.mu.Unlock()
	}
	defer unregister()

	log := e.log.With("run_id", run.RunID, "thread_id", run.ThreadID)
	unbuffered, err := e.work(ctx, run.RunID, &firstToken{claimed: claimed})
	settle, stop := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer stop()
	if err == nil {
		// Unregister before looking at the cause: CancelRun cancels under
		// e.mu, so either its cancel is seen here or it finds no worker
		// and finishes the cancel itself. (Looking first left a window in
		// which a cancel reached this worker after it stopped listening.)
		unregister()
		if errors.Is(context.Cause(ctx), errCancelRequested) {
			// The run was handed over (waiting for a confirmation) just as
			// a cancel found this worker still registered: nobody else
			// finishes it, so do it here rather than at the next recovery.
			if _, err := e.store.FinishCancel(settle, run.RunID, 0, true); err != nil {
				log.Error("finish cancel", "err", err)
			}
		}
		return
	}
	var lost *chat.ErrNotRunning
	cause := context.Cause(ctx)
	switch {
	case errors.As(err, &lost) && !lost.Status.CancelAccepted():
		log.Warn("run taken from this worker", "status", lost.Status)
		return
	case errors.As(err, &lost), errors.Is(cause, errCancelRequested):
		if _, err := e.store.FinishCancel(settle, run.RunID, unbuffered, false); err != nil {
			log.Error("finish cancel", "err", err)
		}
	case errors.Is(cause, errShutdown):
		err := e.store.Release(settle, run.RunID, e.cfg.InstanceID)
		if errors.As(err, &lost) && lost.Status.CancelAccepted() {
			_, err = e.store.FinishCancel(settle, run.RunID, unbuffered, false)
		}
		if err != nil {
			log.Error("hand run back", "err", err)
		}
	default:
		log.Warn("run failed", "err", err)
		ferr := e.store.Fail(settle, run.RunID, e.cfg.InstanceID, userMessage(err))
		if errors.As(ferr, &lost) && lost.Status.CancelAccepted() {
			_, ferr = e.store.FinishCancel(settle, run.RunID, unbuffered, false)
		}
		if ferr != nil {
			log.Error("record failure", "err", ferr)
		}
	}
}

// work advances the run step by step until it ends, waits for a
// confirmation, or stops at a safe point. It returns how many received
// characters it never buffered (for the cancel's discard count).
func (e *Engine) work(ctx context.Context, runID string, first *firstToken) (int64, error) {
	for range maxSteps {
		in, err := e.store.RunInput(ctx, runID)
		if err != nil {
			return 0, err
		}
		op := in.Operation
		// An operation with a recorded result is settled, whatever its phase
		// (an outcome that could not be looked up stays unknown).
		openCommit := op != nil && op.ResultRef == nil && (op.Phase == chat.PhaseCommitting || op.Phase == chat.PhaseUnknown)
		if in.Run.Status.CancelAccepted() && openCommit {
			// A commit may have reached the provider: settle it by its key
			// before the cancel can report what happened.
			first.done = true
			if err := e.toolStep(ctx, in); err != nil {
				return 0, err
			}
			return 0, &chat.ErrNotRunning{Status: in.Run.Status}
		}
		if in.Run.Status != chat.RunRunning {
			return 0, &chat.ErrNotRunning{Status: in.Run.Status}
		}
		if in.Pending != nil && in.Pending.Step == chat.StepTool && op != nil && op.ResultRef == nil && openPhase(op.Phase) {
			first.done = true // the claim's first wait is the tool's
			if err := e.toolStep(ctx, in); err != nil {
				return 0, err
			}
			continue
		}
		if in.Pending != nil && in.Pending.Step == chat.StepTool && op != nil && (op.Phase == chat.PhaseAborted || op.Phase == chat.PhaseVoided) {
			// The pending step is a call a cancel stopped before it had a
			// result (aborted) or before it was sent (voided): the step runs
			// again as a new operation of this run, not as a new model turn.
			tc, err := e.prepareCall(in, &model.ToolCall{ID: op.OperationID, Name: op.Tool, Arguments: op.Args})
			if err != nil {
				return 0, err
			}
			if err := e.store.PublishStep(context.WithoutCancel(ctx), runID, e.cfg.InstanceID, chat.StepOutput{Call: tc}); err != nil {
				return 0, err
			}
			if tc.Contract == tools.Consequential {
				return 0, nil // waits for the user's decision again
			}
			continue
		}
		out, unbuffered, err := e.generate(ctx, in, first)
		if err != nil {
			return unbuffered, err
		}
		write := context.WithoutCancel(ctx)
		if err := e.store.PublishStep(write, runID, e.cfg.InstanceID, out); err != nil {
			return 0, err
		}
		switch {
		case out.Call == nil:
			return 0, e.store.Complete(write, runID, e.cfg.InstanceID)
		case out.Call.Contract == tools.Consequential:
			return 0, nil // waits for the user's decision; no worker holds it
		}
	}
	return 0, fmt.Errorf("the run took more than %d steps; it was stopped to avoid a loop", maxSteps)
}

// usageReporter is a stream that knows the tokens its request used.
type usageReporter interface {
	Usage() (prompt, completion int64)
}

// recordUsage adds a finished stream's token usage to its run, when the
// backend reports it (also for a cancelled step: the tokens were spent).
func (e *Engine) recordUsage(ctx context.Context, runID string, stream model.Stream) {
	r, ok := stream.(usageReporter)
	if !ok {
		return
	}
	p, c := r.Usage()
	if p == 0 && c == 0 {
		return
	}
	e.metrics.TokensUsed(p, c)
	write, stop := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer stop()
	if err := e.store.AddUsage(write, runID, chat.Usage{PromptTokens: p, CompletionTokens: c}); err != nil {
		e.log.Warn("record token usage", "run_id", runID, "err", err)
	}
}

// maxSteps bounds the steps of one run (model calls and tool calls).
const maxSteps = 12

// openPhase reports whether an operation still has work to do.
func openPhase(phase string) bool {
	switch phase {
	case chat.PhaseRunning, chat.PhaseConfirmed, chat.PhaseCommitting, chat.PhaseUnknown:
		return true
	}
	return false
}

// generate runs one generate step: stream the model's reply into the stream
// buffer in batches and return what to publish. The safe points are every
// batch (the write checks the run is still running under this lease) and
// the context (cancelled on a cancel wake-up).
//
// first records the claim's time to the model's first chunk.
func (e *Engine) generate(ctx context.Context, in chat.RunInput, first *firstToken) (chat.StepOutput, int64, error) {
	runID := in.Run.RunID
	stream, err := e.model.Stream(ctx, e.modelRequest(in))
	if err != nil {
		return chat.StepOutput{}, 0, err
	}
	streamCtx, stopStream := context.WithCancel(ctx)
	chunks := make(chan model.Chunk, e.cfg.MaxBatch)
	var received atomic.Int64
	var pumpErr error
	var pump sync.WaitGroup
	pump.Go(func() {
		defer close(chunks)
		for {
			c, err := stream.Next(streamCtx)
			if err != nil {
				pumpErr = err
				return
			}
			if c.Text == "" && c.Call == nil {
				continue
			}
			received.Add(int64(utf8.RuneCountInString(c.Text)))
			select {
			case chunks <- c:
			case <-streamCtx.Done():
				pumpErr = context.Cause(streamCtx)
				return
			}
		}
	})
	// stop ends the model call and waits for the pump; it runs once, at the
	// first safe point that stops the step or when the step returns.
	stop := sync.OnceFunc(func() {
		stopStream()
		stream.Close()
		pump.Wait()
	})
	var buffered int64
	defer func() {
		stop()
		e.recordUsage(ctx, runID, stream)
	}()
	unbuffered := func() int64 {
		stop()
		return received.Load() - buffered
	}

	out := chat.StepOutput{MessageID: chat.NewID(chat.PrefixMessage), Kind: chat.KindText}
	var full strings.Builder
	var call *model.ToolCall
	batch := make([]string, 0, e.cfg.MaxBatch)
	take := func(c model.Chunk) {
		if c.Card {
			out.Kind = chat.KindCard
		}
		if c.Call != nil && call == nil {
			call = c.Call
		}
		if c.Text != "" {
			batch = append(batch, c.Text)
		}
	}
	for {
		c, ok := <-chunks
		if !ok {
			break
		}
		first.chunk(e.metrics)
		batch = batch[:0]
		take(c)
	drain:
		for len(batch) < e.cfg.MaxBatch {
			select {
			case c, ok := <-chunks:
				if !ok {
					break drain
				}
				take(c)
			default:
				break drain
			}
		}
		if ctx.Err() != nil { // safe point: a cancel wake-up or shutdown
			return out, unbuffered(), ctx.Err()
		}
		if len(batch) == 0 {
			continue
		}
		// With the run's context: a cancel (or shutdown) that arrives while
		// the batch waits for the writer takes it back unwritten, and it
		// counts as unbuffered; once in a transaction it is written or
		// refused whole.
		if err := e.store.AppendDeltas(ctx, runID, e.cfg.InstanceID, out.MessageID, batch); err != nil {
			return out, unbuffered(), err
		}
		for _, t := range batch {
			buffered += int64(utf8.RuneCountInString(t))
			full.WriteString(t)
		}
	}
	if !errors.Is(pumpErr, model.EOF) {
		return out, unbuffered(), pumpErr
	}
	if ctx.Err() != nil {
		return out, unbuffered(), ctx.Err()
	}
	out.Content = full.String()
	if out.Kind == chat.KindCard && !json.Valid([]byte(out.Content)) {
		return out, 0, chat.Errorf(chat.CodeInternal, "the model's card is not valid JSON, so nothing of it was published. Continue from the saved point to try again.")
	}
	if call != nil {
		tc, err := e.prepareCall(in, call)
		if err != nil {
			return out, 0, err
		}
		out.Call = tc
	}
	if out.Content == "" && out.Call == nil {
		return out, 0, errors.New("the model returned an empty reply")
	}
	return out, 0, nil
}

// modelRequest builds the model's input from the confirmed context only:
// published messages (tool results included) and the tools on offer.
func (e *Engine) modelRequest(in chat.RunInput) model.Request {
	req := model.Request{ResumeNote: in.ResumeNote, Messages: make([]model.Message, 0, len(in.Messages))}
	for _, m := range in.Messages {
		msg := model.Message{Role: model.RoleUser, Content: m.Content, Fragment: m.Kind == chat.KindFragment, Card: m.Kind == chat.KindCard}
		switch m.Role {
		case chat.RoleAssistant:
			msg.Role = model.RoleAssistant
		case chat.RoleTool:
			msg.Role = model.RoleTool
			var rec struct {
				Tool        string          `json:"tool"`
				OperationID string          `json:"operation_id"`
				Arguments   json.RawMessage `json:"arguments"`
				Result      json.RawMessage `json:"result"`
			}
			if json.Unmarshal([]byte(m.Content), &rec) == nil {
				msg.Content = string(rec.Result)
				msg.Call = &model.ToolCall{ID: rec.OperationID, Name: rec.Tool, Arguments: rec.Arguments}
			}
		}
		req.Messages = append(req.Messages, msg)
	}
	if e.tools != nil {
		for _, s := range e.tools.Specs() {
			req.Tools = append(req.Tools, model.ToolSpec{Name: s.Name, Description: s.Description, Parameters: s.Parameters})
		}
	}
	return req
}

// userMessage turns a model failure into words for the run's error field.
func userMessage(err error) string {
	var ce *chat.Error
	if errors.As(err, &ce) {
		return ce.Message
	}
	return "the model failed: " + err.Error() + ". Continue from the saved point to try again."
}
