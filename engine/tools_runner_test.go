// Runs that call runner tools (idempotent, cancellable): results, progress
// reports, cancels during a call and before the runner starts, and shutdown
// during a call; and, for every contract, cancels before a tool call and
// after its result.

package engine_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/tools"
)

// A tool's progress reaches the tabs as tool.updated events carrying it,
// while the call works and never after its result: the first report at
// once, then the latest one, at most one a second.
func TestToolProgressIsReportedWhileItWorks(t *testing.T) {
	_, r, e := newRunnerEnv(t, "lookup", tools.Idempotent, true)
	r.progress = []chat.ToolProgress{{Progress: 1, Total: 3, Message: "first"}, {Progress: 2, Total: 3, Message: "second"}}
	ack, key := e.askUntilCall(r, "what is the weather?")
	waitFor(t, e.sub, "the latest progress", func(ev *chat.Event) bool {
		if ev.Type != chat.EventToolUpdated {
			return false
		}
		p := ev.Body.(chat.ToolBody).Operation.Progress
		return p != nil && p.Progress == 2
	})
	r.openAll()
	evs := e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
	if got := opPhases(evs, key); !slices.Equal(got, []string{chat.PhaseCompleted}) {
		t.Fatalf("phase changes after the progress = %v", got)
	}
	if reports, _ := opProgress(evs, key); len(reports) != 0 {
		t.Fatalf("progress reported after the result: %+v", reports)
	}
	ops := e.ops()
	if len(ops) != 1 || ops[0].Progress != nil {
		t.Fatalf("the stored operation holds progress: %+v", ops)
	}
}

// A tool that still reports progress after its run was cancelled emits
// nothing: the store refuses the report once the cancel is recorded, so
// no event of the run follows run.cancelled (invariant 4).
func TestNoToolProgressAfterTheCancel(t *testing.T) {
	_, r, e := newRunnerEnv(t, "search", tools.Cancellable, true)
	r.lateProgress = &chat.ToolProgress{Progress: 9, Total: 10}
	ack, key := e.askUntilCall(r, "search for it")
	e.cancel(ack.RunID)
	evs := e.until("run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
	if reports, _ := opProgress(evs, key); len(reports) != 0 {
		t.Fatalf("progress reported after the cancel: %+v", reports)
	}
	wantOp(t, e.onlyOp(), chat.PhaseAborted, chat.OutcomeAborted)
	// Nothing of the run comes later either.
	next := e.resume()
	r.openAll()
	evs = e.until("run.completed", isType(chat.EventRunCompleted, next.RunID))
	for _, ev := range evs {
		if ev.RunID == ack.RunID {
			t.Fatalf("an event of the cancelled run after run.cancelled: %s %+v", ev.Type, ev.Body)
		}
	}
}

func TestIdempotentToolHappyPath(t *testing.T) {
	m, r, e := newRunnerEnv(t, "lookup", tools.Idempotent, false)
	e.start()
	ack := e.ask("what is the weather?")
	evs := e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))

	op := e.onlyOp()
	wantOp(t, op, chat.PhaseCompleted, chat.OutcomeCompleted)
	if op.Contract != tools.Idempotent || op.RunID != ack.RunID || op.ResultRef == nil {
		t.Fatalf("operation = %+v", op)
	}
	if got := opPhases(evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseRunning, chat.PhaseCompleted}) {
		t.Fatalf("tool.updated phases = %v", got)
	}
	if got := publishedRoles(evs); got != "user assistant tool assistant" {
		t.Fatalf("published = %q", got)
	}
	msgs := e.wantHistory("user assistant tool assistant")
	if msgs[2].MessageID != *op.ResultRef || toolResult(t, msgs[2])["answer"] != "sunny" {
		t.Fatalf("tool message = %+v, result_ref %s", msgs[2], *op.ResultRef)
	}
	if msgs[3].Content != strings.Join(answerWords, "") {
		t.Fatalf("final answer = %q", msgs[3].Content)
	}
	e.wantRun(ack.RunID, chat.RunCompleted)
	if got := r.callCounts(); len(got) != 1 || got[op.OperationID] != 1 {
		t.Fatalf("tool calls = %v", got)
	}
	// The model saw the result as a tool message naming the call.
	reqs := m.calls()
	last := reqs[len(reqs)-1].Messages
	if tm := last[len(last)-1]; tm.Role != model.RoleTool || tm.Call == nil || tm.Call.ID != op.OperationID ||
		tm.Call.Name != "lookup" || !strings.Contains(tm.Content, "sunny") {
		t.Fatalf("tool message sent to the model = %+v", tm)
	}
}

func TestIdempotentToolCancelWhileRunningKeepsResult(t *testing.T) {
	_, r, e := newRunnerEnv(t, "lookup", tools.Idempotent, true)
	ack, key := e.askUntilCall(r, "what is the weather?")
	e.cancel(ack.RunID)

	ev := waitFor(t, e.sub, "run.cancelling", isType(chat.EventRunCancelling, ack.RunID))
	if a := ev.Body.(chat.RunCancellingBody).ActiveOperation; a.Kind != "tool" || a.OperationID != key {
		t.Fatalf("active_operation = %+v, want tool %s", a, key)
	}
	r.gate.open() // the call the cancel could not stop ends
	evs := e.until("run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
	if got := opPhases(evs, key); !slices.Equal(got, []string{chat.PhaseCompleted}) {
		t.Fatalf("tool.updated phases after the cancel = %v", got)
	}
	if got := publishedRoles(evs); got != "tool" {
		t.Fatalf("published after the cancel = %q, want the tool result only", got)
	}
	wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: key, Tool: "lookup", Phase: chat.PhaseCompleted, Outcome: chat.OutcomeCompleted})
	wantOp(t, e.onlyOp(), chat.PhaseCompleted, chat.OutcomeCompleted)
	e.wantRun(ack.RunID, chat.RunCancelled)
	e.wantHistory("user assistant tool")
	if last := e.snapshot(e.thr.ThreadID).LastRun; last == nil || len(last.Operations) != 1 || last.Operations[0].Outcome != chat.OutcomeCompleted {
		t.Fatalf("snapshot last_run = %+v", last)
	}

	// Continue: the recorded result is reused, the tool is not called again.
	next := e.resume()
	e.until("run.completed", isType(chat.EventRunCompleted, next.RunID))
	e.wantHistory("user assistant tool assistant")
	if got := r.callCounts(); len(got) != 1 || got[key] != 1 {
		t.Fatalf("tool calls = %v, want one", got)
	}
	wantOp(t, e.onlyOp(), chat.PhaseCompleted, chat.OutcomeCompleted)
}

func TestCancellableToolCancelWhileRunningAbortsAndReruns(t *testing.T) {
	m, r, e := newRunnerEnv(t, "search", tools.Cancellable, true)
	ack, first := e.askUntilCall(r, "search for it")
	e.cancel(ack.RunID)
	evs := e.until("run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
	if n := countType(evs, chat.EventRunCancelling); n != 0 {
		t.Fatalf("%d run.cancelling events for a call the cancel stopped", n)
	}
	if got := publishedRoles(evs); got != "user assistant" {
		t.Fatalf("published up to the cancel: %q, want no tool result", got)
	}
	if got := opPhases(evs, first); !slices.Equal(got, []string{chat.PhaseRunning, chat.PhaseAborted}) {
		t.Fatalf("tool.updated phases after the cancel = %v", got)
	}
	wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: first, Tool: "search", Phase: chat.PhaseAborted, Outcome: chat.OutcomeAborted})
	wantOp(t, e.onlyOp(), chat.PhaseAborted, chat.OutcomeAborted)
	e.wantRun(ack.RunID, chat.RunCancelled)
	e.wantHistory("user assistant")

	// Continue: the step runs again, as a new call of the new run.
	r.gate.open()
	next := e.resume()
	second := recv(t, r.started, "the second tool call")
	evs = e.until("run.completed", isType(chat.EventRunCompleted, next.RunID))
	if second == first {
		t.Fatalf("the re-run reused the aborted call's key %s", first)
	}
	if got := publishedRoles(evs); got != "tool assistant" {
		t.Fatalf("published by the continue = %q", got)
	}
	e.wantHistory("user assistant tool assistant")
	if got := r.callCounts(); len(got) != 2 || got[first] != 1 || got[second] != 1 {
		t.Fatalf("tool calls = %v", got)
	}
	ops := e.ops()
	if len(ops) != 2 || ops[0].OperationID != first || ops[1].OperationID != second || ops[1].RunID != next.RunID {
		t.Fatalf("operations = %+v", ops)
	}
	wantOp(t, ops[0], chat.PhaseAborted, chat.OutcomeAborted)
	wantOp(t, ops[1], chat.PhaseCompleted, chat.OutcomeCompleted)
	for _, req := range m.calls() {
		if last := req.Messages[len(req.Messages)-1]; last.Role == model.RoleAssistant {
			t.Fatalf("the model was asked to go on from its own text instead of the tool's result: %+v", req.Messages)
		}
	}
}

// A cancel while the model streams the text before its call: nothing is
// prepared, no operation exists, for every contract.
func TestCancelBeforeToolCallRecordsNoOperation(t *testing.T) {
	for _, tc := range []struct {
		name string
		tool tools.Tool
		args json.RawMessage
	}{
		{"cancellable", newRunner("search", tools.Cancellable, false), lookupArgs},
		{"idempotent", newRunner("lookup", tools.Idempotent, false), lookupArgs},
		{"consequential", newMailer(mailAccepts, false), mailArgs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &toolModel{tool: tc.tool.Spec().Name, args: tc.args, userGate: newChunkGate()}
			e := newToolEnv(t, m, tc.tool)
			e.start()
			ack := e.ask("do it")
			m.userGate.release(t, 2)
			waitFor(t, e.sub, "a delta", isType(chat.EventMessageDelta, ack.RunID))
			e.cancel(ack.RunID)
			evs := e.until("run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
			if n := countType(evs, chat.EventToolPrepared) + countType(evs, chat.EventToolUpdated); n != 0 {
				t.Fatalf("%d tool events for a call never made", n)
			}
			wantReceipt(t, evs[len(evs)-1])
			if ops := e.ops(); len(ops) != 0 {
				t.Fatalf("operations = %+v", ops)
			}
			e.wantRun(ack.RunID, chat.RunCancelled)
			e.wantHistory("user")
			switch tl := tc.tool.(type) {
			case *fakeRunner:
				if n := len(tl.callCounts()); n != 0 {
					t.Fatalf("the tool ran %d times", n)
				}
			case *fakeMailer:
				tl.mu.Lock()
				prepares := tl.prepares
				tl.mu.Unlock()
				if prepares != 0 {
					t.Fatalf("prepared %d times", prepares)
				}
				tl.checkActions(t, 0)
			}
		})
	}
}

// A cancel while the model streams its answer to a tool result: the tool's
// outcome stands and is reported, the answer is discarded, and a continue
// answers again without calling the tool.
func TestCancelAfterToolResultKeepsIt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tool    tools.Tool
		args    json.RawMessage
		confirm bool
		phase   string
		outcome string
	}{
		{"cancellable", newRunner("search", tools.Cancellable, false), lookupArgs, false, chat.PhaseCompleted, chat.OutcomeCompleted},
		{"idempotent", newRunner("lookup", tools.Idempotent, false), lookupArgs, false, chat.PhaseCompleted, chat.OutcomeCompleted},
		{"consequential", newMailer(mailAccepts, false), mailArgs, true, chat.PhaseCommitted, chat.OutcomeCommitted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.tool.Spec().Name
			m := &toolModel{tool: name, args: tc.args, toolGate: newChunkGate()}
			e := newToolEnv(t, m, tc.tool)
			e.start()
			ack := e.ask("do it")
			if tc.confirm {
				op, _ := e.waitConfirmation(ack.RunID)
				if _, err := e.decide(op.OperationID, true); err != nil {
					t.Fatal(err)
				}
			}
			e.until("the tool message", func(ev *chat.Event) bool {
				return ev.Type == chat.EventMessagePublished && ev.Body.(chat.MessagePublishedBody).Message.Role == chat.RoleTool
			})
			m.toolGate.release(t, 2)
			waitFor(t, e.sub, "a delta of the answer", isType(chat.EventMessageDelta, ack.RunID))
			e.cancel(ack.RunID)
			evs := e.until("run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
			op := e.onlyOp()
			wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: op.OperationID, Tool: name, Phase: tc.phase, Outcome: tc.outcome})
			if got := publishedRoles(evs); got != "" {
				t.Fatalf("published after the cancel: %q", got)
			}
			e.wantHistory("user assistant tool")

			m.toolGate.open()
			next := e.resume()
			e.until("run.completed", isType(chat.EventRunCompleted, next.RunID))
			e.wantHistory("user assistant tool assistant")
			wantOp(t, e.onlyOp(), tc.phase, tc.outcome)
			switch tl := tc.tool.(type) {
			case *fakeRunner:
				if got := tl.callCounts(); len(got) != 1 || got[op.OperationID] != 1 {
					t.Fatalf("tool calls = %v", got)
				}
			case *fakeMailer:
				tl.checkActions(t, 1)
			}
		})
	}
}

// A cancel right after a runner call is recorded, before the tool started:
// the call never runs, it is reported aborted, and a continue runs it.
func TestCancelBeforeRunnerStarts(t *testing.T) {
	for _, contract := range []string{tools.Cancellable, tools.Idempotent} {
		t.Run(contract, func(t *testing.T) {
			_, r, e := newRunnerEnv(t, "lookup", contract, false)
			var runID string
			hs := &hookStore{afterPublish: func(out chat.StepOutput) {
				if out.Call != nil && out.Content != "" {
					e.cancelFromWorker(runID)
				}
			}}
			runID = e.startRun(e.thr.ThreadID, e.thr.StateVersion, ptr("look it up")).RunID
			e.startHooked(hs)
			evs := e.until("run.cancelled", isType(chat.EventRunCancelled, runID))
			op := e.onlyOp()
			wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: op.OperationID, Tool: "lookup", Phase: chat.PhaseAborted, Outcome: chat.OutcomeAborted})
			if n := len(r.callCounts()); n != 0 {
				t.Fatalf("the tool ran %d times after the cancel", n)
			}
			e.wantHistory("user assistant")

			next := e.resume()
			e.until("run.completed", isType(chat.EventRunCompleted, next.RunID))
			e.wantHistory("user assistant tool assistant")
			ops := e.ops()
			if len(ops) != 2 {
				t.Fatalf("operations = %+v", ops)
			}
			wantOp(t, ops[1], chat.PhaseCompleted, chat.OutcomeCompleted)
			if got := r.callCounts(); len(got) != 1 || got[ops[1].OperationID] != 1 {
				t.Fatalf("tool calls = %v", got)
			}
		})
	}
}

// Shutdown is not a cancel: a cancellable call it stopped runs again after
// the restart; an idempotent call is awaited and its result kept, so it
// runs once. Either way the run completes.
func TestShutdownDuringToolCall(t *testing.T) {
	t.Run("cancellable", func(t *testing.T) {
		_, r, e := newRunnerEnv(t, "search", tools.Cancellable, true)
		ack, first := e.askUntilCall(r, "search for it")
		e.stop()
		e.wantRun(ack.RunID, chat.RunQueued)
		wantOp(t, e.onlyOp(), chat.PhaseAborted, chat.OutcomeAborted)
		r.gate.open()
		e.start()
		e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
		e.wantHistory("user assistant tool assistant")
		ops := e.ops()
		if len(ops) != 2 || ops[0].OperationID != first || ops[1].RunID != ack.RunID {
			t.Fatalf("operations = %+v", ops)
		}
		wantOp(t, ops[1], chat.PhaseCompleted, chat.OutcomeCompleted)
		if got := r.callCounts(); len(got) != 2 || got[first] != 1 || got[ops[1].OperationID] != 1 {
			t.Fatalf("tool calls = %v", got)
		}
	})
	t.Run("idempotent", func(t *testing.T) {
		_, r, e := newRunnerEnv(t, "lookup", tools.Idempotent, true)
		ack, key := e.askUntilCall(r, "look it up")
		stopped := make(chan struct{})
		go func() { e.stop(); close(stopped) }()
		r.gate.open() // shutdown waits for the call, whichever comes first
		recv(t, stopped, "the engine to close")
		e.start()
		e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
		e.wantHistory("user assistant tool assistant")
		wantOp(t, e.onlyOp(), chat.PhaseCompleted, chat.OutcomeCompleted)
		if got := r.callCounts(); len(got) != 1 || got[key] != 1 {
			t.Fatalf("tool calls = %v", got)
		}
	})
}
