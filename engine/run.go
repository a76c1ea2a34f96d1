package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

// execute owns one claim of a run, made at claimed, until the run is
// settled — completed, failed, cancelled, handed back to the queue on
// shutdown — or the claim is lost (fenced): every write names the claim's
// lease, so an execution whose lease is no longer current stops at its
// next write and publishes nothing.
func (e *Engine) execute(claim *chat.Claim, claimed time.Time) {
	run, lease := claim.Run, claim.Lease
	ctx, cancel := context.WithCancelCause(e.ctx)
	defer cancel(nil)
	e.metrics.RunsExecuting(1)
	defer e.metrics.RunsExecuting(-1)
	// Register before the first read of the run: a cancel recorded after
	// that read finds the registration; one recorded before it is seen by
	// the read.
	//
	// The same run may be claimed again (after a confirmation, or after
	// this execution stalled past its lease) while this execution is still
	// unwinding, so only this execution's own entry is removed: deleting by
	// id alone would unregister the new execution and leave its cancel
	// unheard and its lease unrenewed.
	me := &liveRun{cancel: cancel, lease: lease}
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

	log := e.log.With("run_id", run.RunID, "thread_id", run.ThreadID, "epoch", lease.Epoch)
	unbuffered, err := e.work(ctx, lease, &firstToken{claimed: claimed})
	settle, stop := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.SettleTimeout)
	defer stop()
	finishCancel := func() error {
		_, err := e.store.FinishCancel(settle, run.RunID, &lease, unbuffered)
		return err
	}
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
			e.finalWrite(settle, log, "finish cancel", func() error {
				_, err := e.store.FinishCancel(settle, run.RunID, nil, 0)
				return err
			})
		}
		return
	}
	var lost *chat.ErrNotRunning
	cause := context.Cause(ctx)
	switch {
	case errors.As(err, &lost) && lost.Fenced, errors.Is(err, chat.ErrStepNotPending):
		// Another claim holds the run (this execution stalled past its
		// lease, or recovery took it): whoever holds it now finishes it.
		log.Warn("run taken from this execution; it stops without publishing", "err", err)
	case errors.As(err, &lost) && !lost.Status.CancelAccepted():
		log.Warn("run taken from this worker", "status", lost.Status)
	case errors.As(err, &lost), errors.Is(cause, errCancelRequested):
		e.finalWrite(settle, log, "finish cancel", finishCancel)
	case errors.Is(cause, errShutdown):
		e.finalWrite(settle, log, "hand run back", func() error {
			err := e.store.Release(settle, lease)
			if errors.As(err, &lost) && !lost.Fenced && lost.Status.CancelAccepted() {
				return finishCancel()
			}
			return err
		})
	default:
		log.Warn("run failed", "err", err)
		e.finalWrite(settle, log, "record failure", func() error {
			err := e.store.Fail(settle, lease, userMessage(err))
			if errors.As(err, &lost) && !lost.Fenced && lost.Status.CancelAccepted() {
				return finishCancel()
			}
			return err
		})
	}
}

// finalWrite runs a write that settles a run, again with backoff while it
// fails for a reason other than the run itself (a database that is busy or
// briefly away), until ctx ends. If it never succeeds the execution lets
// go anyway: its lease is no longer renewed, so it expires and recovery
// (in this process or another) settles the run from its records — an
// acknowledged cancel is never stuck until a restart.
func (e *Engine) finalWrite(ctx context.Context, log *slog.Logger, what string, write func() error) {
	for try := 0; ; try++ {
		err := write()
		var lost *chat.ErrNotRunning
		var ce *chat.Error
		switch {
		case err == nil:
			return
		case errors.As(err, &lost), errors.As(err, &ce), errors.Is(err, chat.ErrStepNotPending):
			log.Warn(what+": the run moved on", "err", err)
			return
		}
		wait := min(50*time.Millisecond<<try, 2*time.Second)
		log.Warn(what+" failed; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			log.Error(what+" failed; the run is left to recovery once its lease expires", "err", err)
			return
		case <-e.ctx.Done():
			log.Error(what+" failed while the engine stops; the run is recovered from its records", "err", err)
			return
		case <-time.After(wait):
		}
	}
}

// work advances the run step by step until it ends, waits for a
// confirmation, or stops at a safe point. It returns how many received
// characters it never buffered (for the cancel's discard count).
func (e *Engine) work(ctx context.Context, lease chat.Lease, first *firstToken) (int64, error) {
	for range maxSteps {
		in, err := e.store.RunInput(ctx, lease.RunID)
		if err != nil {
			return 0, err
		}
		op := in.Operation
		// A fork continuing a tool step waits on the call of the thread it
		// was forked from: the step runs again here, as a call of this run.
		inherited := op != nil && op.ThreadID != in.Run.ThreadID
		// An operation with a recorded result is settled, whatever its phase
		// (an outcome that could not be looked up stays unknown).
		openCommit := op != nil && !inherited && op.ResultRef == nil && (op.Phase == chat.PhaseCommitting || op.Phase == chat.PhaseUnknown)
		if in.Run.Status.CancelAccepted() && openCommit {
			// A commit may have reached the provider: settle it by its key
			// before the cancel can report what happened.
			first.done = true
			if err := e.toolStep(ctx, in, lease); err != nil {
				return 0, err
			}
			return 0, &chat.ErrNotRunning{Status: in.Run.Status}
		}
		if in.Run.Status != chat.RunRunning {
			return 0, &chat.ErrNotRunning{Status: in.Run.Status}
		}
		write := context.WithoutCancel(ctx)
		if in.Pending == nil {
			// The run's last step is published (by an execution that then
			// lost its run before finishing it): only the status is left.
			first.done = true
			return 0, e.store.Complete(write, lease)
		}
		if in.Pending.Step == chat.StepTool && op != nil && !inherited && op.ResultRef == nil && openPhase(op.Phase) {
			first.done = true // the claim's first wait is the tool's
			if err := e.toolStep(ctx, in, lease); err != nil {
				return 0, err
			}
			continue
		}
		if in.Pending.Step == chat.StepTool && op != nil && (inherited || op.Phase == chat.PhaseAborted || op.Phase == chat.PhaseVoided) {
			// The pending step is a call a cancel stopped before it had a
			// result (aborted) or before it was sent (voided), or the call of
			// the thread this one was forked from: the step runs again as a
			// new operation of this run, not as a new model turn — under the
			// same business key, so an action the source already performed
			// is not performed again (the provider answers it was done).
			prior := ""
			if op.Contract == tools.Consequential && op.IdempotencyKey != nil {
				prior = *op.IdempotencyKey // the same action: the same key
			}
			tc, err := e.prepareCall(in, &model.ToolCall{ID: op.OperationID, Name: op.Tool, Arguments: op.Args}, prior)
			if err != nil {
				return 0, err
			}
			if err := e.store.PublishStep(write, lease, chat.StepOutput{Step: *in.Pending, Call: tc}); err != nil {
				return 0, err
			}
			if tc.Contract == tools.Consequential {
				return 0, nil // waits for the user's decision again
			}
			continue
		}
		e.nameThread(in)
		out, unbuffered, err := e.generate(ctx, in, lease, first)
		if err == nil {
			out.Step = *in.Pending
			err = e.publish(write, lease, out)
		}
		if errors.Is(err, chat.ErrDeltasLost) {
			// Another instance wrote past this process while it streamed
			// (it did not answer in time): the reply has a hole, so the
			// step starts over under a new message.
			e.log.Warn("the reply lost deltas to another instance; the step starts over", "run_id", lease.RunID, "err", err)
			again, err := e.store.RestartStep(write, lease, e.cfg.MaxAttempts)
			if err != nil || !again {
				return 0, err
			}
			continue
		}
		if err != nil {
			return unbuffered, err
		}
		if out.Call == nil {
			return 0, nil // the run's last step: it completed
		}
		if out.Call.Contract == tools.Consequential {
			return 0, nil // waits for the user's decision; no worker holds it
		}
	}
	return 0, fmt.Errorf("the run took more than %d steps; it was stopped to avoid a loop", maxSteps)
}

// publish records a generate step's output: the run's last step (no tool
// call) published and the run completed in one commit, or the step and its
// tool call.
func (e *Engine) publish(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	if out.Call == nil {
		return e.store.CompleteWith(ctx, lease, out)
	}
	return e.store.PublishStep(ctx, lease, out)
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
func (e *Engine) generate(ctx context.Context, in chat.RunInput, lease chat.Lease, first *firstToken) (chat.StepOutput, int64, error) {
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
			if c.Text == "" && c.Call == nil && !c.Truncated {
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

	out := chat.StepOutput{MessageID: chat.NewID(chat.PrefixMessage), Kind: chat.KindText, Model: e.cfg.ModelName}
	var full strings.Builder
	var call *model.ToolCall
	batch := make([]string, 0, e.cfg.MaxBatch)
	// The reply's size limit: what is taken into batches (and so streamed
	// and published) never passes it; the chunk that would is cut at the
	// limit, on a code point boundary, and the stream is stopped.
	limit := e.cfg.MaxReplyBytes
	var taken int
	cut := false
	take := func(c model.Chunk) {
		if cut {
			return // past the limit: nothing more is streamed or kept
		}
		if c.Card {
			out.Kind = chat.KindCard
		}
		if c.Call != nil && call == nil {
			call = c.Call
		}
		if c.Truncated {
			out.Truncated = chat.TruncatedSizeLimit // the endpoint's own length limit
		}
		text := c.Text
		if taken+len(text) > limit {
			text, cut = cutUTF8(text, limit-taken), true
			out.Truncated = chat.TruncatedSizeLimit
		}
		if text != "" {
			taken += len(text)
			batch = append(batch, text)
		}
	}
	for !cut {
		c, ok := <-chunks
		if !ok {
			break
		}
		first.chunk(e.metrics)
		batch = batch[:0]
		take(c)
	drain:
		for len(batch) < e.cfg.MaxBatch && !cut {
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
		if cut {
			// Stop the model call before the last batch is written: the
			// upstream connection closes as on a cancel, and nothing past
			// the limit is read.
			stop()
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
		if err := e.store.AppendDeltas(ctx, lease, out.MessageID, batch); err != nil {
			return out, unbuffered(), err
		}
		for _, t := range batch {
			buffered += int64(utf8.RuneCountInString(t))
			full.WriteString(t)
		}
	}
	if !cut && !errors.Is(pumpErr, model.EOF) {
		return out, unbuffered(), pumpErr
	}
	if ctx.Err() != nil {
		return out, unbuffered(), ctx.Err()
	}
	out.Content = full.String()
	if cut {
		e.log.Info("reply cut at the size limit; the model call was stopped", "run_id", runID, "message_id", out.MessageID, "bytes", len(out.Content))
	}
	if out.Kind == chat.KindCard && out.Truncated != "" {
		// A cut JSON document is no card: nothing of it can be published.
		at := "the model endpoint's length limit"
		if cut {
			at = fmt.Sprintf("the size limit of %d bytes", limit)
		}
		return out, 0, chat.Errorf(chat.CodeInternal, "the model's card reached %s before it was complete, so nothing of it was published. Continue from the saved point to try again, or ask for a smaller card.", at)
	}
	if out.Kind == chat.KindCard && !json.Valid([]byte(out.Content)) {
		return out, 0, chat.Errorf(chat.CodeInternal, "the model's card is not valid JSON, so nothing of it was published. Continue from the saved point to try again.")
	}
	if call != nil {
		tc, err := e.prepareCall(in, call, "")
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

// cutUTF8 is the longest start of s of at most n bytes that ends on a
// code point boundary (an invalid byte counts as one code point).
func cutUTF8(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	for back := 0; back < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(s[n]); back++ {
		n--
	}
	return s[:n]
}

// modelRequest builds the model's input from the confirmed context only:
// the run's instructions (a Responses API request's, as a system message
// first), published messages (tool results included) and the tools on
// offer.
func (e *Engine) modelRequest(in chat.RunInput) model.Request {
	req := model.Request{ResumeNote: in.ResumeNote, Messages: make([]model.Message, 0, len(in.Messages)+1), MaxBytes: e.cfg.MaxReplyBytes}
	if in.Instructions != "" {
		req.Messages = append(req.Messages, model.Message{Role: model.RoleSystem, Content: in.Instructions})
	}
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
