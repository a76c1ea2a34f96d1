// Shared helpers for the tool tests: the toolEnv harness (an engine, a
// thread and its events), event and operation checks, the email and runner
// scenarios' set-up, and hookStore, which acts at a precise point of a
// worker's progress.

package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/tools"
)

// ---------------------------------------------------------------------------
// Harness for tool runs.

type toolEnv struct {
	*harness
	m   *toolModel
	thr chat.Snapshot
	sub *bus.Subscription
}

// newToolEnv is a harness whose engine offers ts to m, with a thread and a
// subscription to its events. Gates of the tools are opened before the
// engine closes, so a failing test never hangs.
func newToolEnv(t *testing.T, m *toolModel, ts ...tools.Tool) *toolEnv {
	t.Helper()
	reg, err := tools.NewRegistry(ts...)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, nil)
	h.backend, h.tools = m, reg
	t.Cleanup(func() { // runs before the harness's cleanup
		for _, tl := range ts {
			if o, ok := tl.(opener); ok {
				o.openAll()
			}
		}
		for _, g := range []*chunkGate{m.userGate, m.toolGate} {
			if g != nil {
				g.open()
			}
		}
	})
	thr := h.thread()
	sub := h.feed.Subscribe(thr.ThreadID, 4096)
	t.Cleanup(sub.Close)
	return &toolEnv{harness: h, m: m, thr: thr, sub: sub}
}

// resubscribe replaces the subscription: events from now on.
func (e *toolEnv) resubscribe() {
	e.sub.Close()
	e.sub = e.feed.Subscribe(e.thr.ThreadID, 4096)
	e.t.Cleanup(e.sub.Close)
}

func (e *toolEnv) version() int64 { return e.snapshot(e.thr.ThreadID).StateVersion }

// ask starts a run with a user message through the engine.
func (e *toolEnv) ask(text string) chat.RunStartAck {
	e.t.Helper()
	ack, err := e.eng.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID, ThreadID: e.thr.ThreadID,
		ExpectedStateVersion: e.version(), UserMessage: &text})
	if err != nil {
		e.t.Fatal(err)
	}
	return ack
}

// resume starts a run that continues the head's pending step.
func (e *toolEnv) resume() chat.RunStartAck {
	e.t.Helper()
	ack, err := e.eng.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID, ThreadID: e.thr.ThreadID,
		ExpectedStateVersion: e.version()})
	if err != nil {
		e.t.Fatal(err)
	}
	return ack
}

func (e *toolEnv) cancel(runID string) chat.CancelAck {
	e.t.Helper()
	ack, err := e.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: runID,
		Reason: chat.ReasonUserRequested, RequestedBy: "tab:test"})
	if err != nil {
		e.t.Fatal(err)
	}
	if ack.Status != chat.RunCancelRequested || ack.AlreadyRequested {
		e.t.Fatalf("cancel ack = %+v", ack)
	}
	return ack
}

// confirm confirms the operation, failing the test if it is refused.
func (e *toolEnv) confirm(opID string) {
	e.t.Helper()
	if _, err := e.decide(opID, true); err != nil {
		e.t.Fatal(err)
	}
}

func (e *toolEnv) decide(opID string, confirm bool) (chat.ConfirmAck, error) {
	return e.eng.DecideOperation(context.Background(), chat.Decide{UserID: chat.LocalUserID, OperationID: opID, ExpectedStateVersion: e.version(), Confirm: confirm})
}

// until collects the thread's events up to and including the first one
// that satisfies pred.
func (e *toolEnv) until(what string, pred func(*chat.Event) bool) []*chat.Event {
	e.t.Helper()
	var evs []*chat.Event
	waitFor(e.t, e.sub, what, func(ev *chat.Event) bool {
		evs = append(evs, ev)
		return pred(ev)
	})
	return evs
}

func (e *toolEnv) ops() []chat.Operation {
	e.t.Helper()
	ops, err := e.st.Operations(context.Background(), chat.LocalUserID, e.thr.ThreadID)
	if err != nil {
		e.t.Fatal(err)
	}
	return ops
}

// onlyOp returns the thread's one operation.
func (e *toolEnv) onlyOp() chat.Operation {
	e.t.Helper()
	ops := e.ops()
	if len(ops) != 1 {
		e.t.Fatalf("%d operations, want 1: %+v", len(ops), ops)
	}
	return ops[0]
}

// history returns the roles of the head's messages, e.g. "user assistant".
func (e *toolEnv) history() string {
	var roles []string
	for _, m := range e.snapshot(e.thr.ThreadID).Messages {
		roles = append(roles, string(m.Role))
	}
	return strings.Join(roles, " ")
}

func (e *toolEnv) wantHistory(want string) []chat.Message {
	e.t.Helper()
	snap := e.snapshot(e.thr.ThreadID)
	if got := e.history(); got != want {
		e.t.Fatalf("history = %q, want %q: %+v", got, want, snap.Messages)
	}
	return snap.Messages
}

func (e *toolEnv) wantRun(runID string, want chat.RunStatus) {
	e.t.Helper()
	if r := e.run(runID); r.Status != want {
		e.t.Fatalf("run %s is %s, want %s (%+v)", runID, r.Status, want, r)
	}
}

func wantOp(t *testing.T, op chat.Operation, phase, outcome string) {
	t.Helper()
	got := ""
	if op.Outcome != nil {
		got = *op.Outcome
	}
	if op.Phase != phase || got != outcome {
		t.Fatalf("operation %s is %s/%s, want %s/%s", op.OperationID, op.Phase, got, phase, outcome)
	}
}

// opPhases lists the phases the tool.* events of opID reported, in order.
func opPhases(evs []*chat.Event, opID string) []string {
	var out []string
	for _, ev := range evs {
		if ev.Type != chat.EventToolPrepared && ev.Type != chat.EventToolUpdated {
			continue
		}
		if op := ev.Body.(chat.ToolBody).Operation; op.OperationID == opID && op.Progress == nil {
			out = append(out, op.Phase)
		}
	}
	return out
}

// opProgress lists the progress reports of opID's tool.updated events, in
// order, each with the phase it was reported in.
func opProgress(evs []*chat.Event, opID string) (reports []chat.ToolProgress, phases []string) {
	for _, ev := range evs {
		if ev.Type != chat.EventToolUpdated {
			continue
		}
		if op := ev.Body.(chat.ToolBody).Operation; op.OperationID == opID && op.Progress != nil {
			reports = append(reports, *op.Progress)
			phases = append(phases, op.Phase)
		}
	}
	return reports, phases
}

func countType(evs []*chat.Event, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func findType(t *testing.T, evs []*chat.Event, typ string) *chat.Event {
	t.Helper()
	for _, ev := range evs {
		if ev.Type == typ {
			return ev
		}
	}
	t.Fatalf("no %s event among %d", typ, len(evs))
	return nil
}

// publishedRoles lists the roles of the messages published in evs.
func publishedRoles(evs []*chat.Event) string {
	var roles []string
	for _, ev := range evs {
		if ev.Type == chat.EventMessagePublished {
			roles = append(roles, string(ev.Body.(chat.MessagePublishedBody).Message.Role))
		}
	}
	return strings.Join(roles, " ")
}

// toolResult decodes a tool message's recorded result.
func toolResult(t *testing.T, m chat.Message) map[string]any {
	t.Helper()
	var rec struct {
		Tool        string         `json:"tool"`
		OperationID string         `json:"operation_id"`
		Result      map[string]any `json:"result"`
	}
	if m.Role != chat.RoleTool || json.Unmarshal([]byte(m.Content), &rec) != nil {
		t.Fatalf("not a tool message: %+v", m)
	}
	return rec.Result
}

func wantReceipt(t *testing.T, ev *chat.Event, want ...chat.OperationOutcome) {
	t.Helper()
	got := ev.Body.(chat.RunCancelledBody).Operations
	if got == nil || !slices.Equal(got, want) {
		t.Fatalf("run.cancelled operations = %+v, want %+v", got, want)
	}
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

func wantCode(t *testing.T, err error, code string) *chat.Error {
	t.Helper()
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != code {
		t.Fatalf("error = %v, want %s", err, code)
	}
	return ce
}

var (
	lookupArgs = json.RawMessage(`{"q":"weather in Oslo"}`)
	mailArgs   = json.RawMessage(`{"to":"ann@example.com","subject":"Quote 483","body":"Here is revision 7."}`)
)

// wantEmailed checks how an emailing run ended: completed, with the tool
// message saying status after the model's call and its answer after it,
// and the mailer's actions: sent times, by one commit call at the most.
func (e *toolEnv) wantEmailed(mail *fakeMailer, runID string, op chat.Operation, status string, sent int) {
	e.t.Helper()
	msgs := e.wantHistory("user assistant tool assistant")
	if toolResult(e.t, msgs[2])["status"] != status {
		e.t.Fatalf("tool message = %s, want status %s", msgs[2].Content, status)
	}
	e.wantRun(runID, chat.RunCompleted)
	mail.checkActions(e.t, sent)
	if n := mail.commitCalls(*op.IdempotencyKey); sent > 0 && n != 1 {
		e.t.Fatalf("Commit called %d times", n)
	}
}

// emailDrafted starts an engine whose model asks to send the quote by
// email through a fake mailer (mode; gated: its commits wait to be let go)
// and waits until the run waits for the user to confirm the draft: the
// environment, the mailer, the run, the prepared operation and the events
// up to the wait.
func emailDrafted(t *testing.T, mode string, gated bool) (*toolEnv, *fakeMailer, chat.RunStartAck, chat.Operation, []*chat.Event) {
	t.Helper()
	mail := newMailer(mode, gated)
	e := newToolEnv(t, &toolModel{tool: "fake_send_email", args: mailArgs}, mail)
	e.start()
	ack := e.ask("send the quote")
	op, evs := e.waitConfirmation(ack.RunID)
	return e, mail, ack, op, evs
}

// wantEmailCancelled waits for the run's run.cancelled and checks how it
// left op: the one phase reported after the cancel, the receipt, the
// operation's phase and outcome, and the run cancelled.
func (e *toolEnv) wantEmailCancelled(runID string, op chat.Operation, phase, outcome string) {
	e.t.Helper()
	evs := e.until("run.cancelled", isType(chat.EventRunCancelled, runID))
	if got := opPhases(evs, op.OperationID); !slices.Equal(got, []string{phase}) {
		e.t.Fatalf("tool.updated phases after the cancel = %v", got)
	}
	wantReceipt(e.t, evs[len(evs)-1], chat.OperationOutcome{OperationID: op.OperationID, Tool: "fake_send_email", Phase: phase, Outcome: outcome})
	wantOp(e.t, e.onlyOp(), phase, outcome)
	e.wantRun(runID, chat.RunCancelled)
}

// waitConfirmation runs a user request up to the prepared intent and
// returns the operation.
func (e *toolEnv) waitConfirmation(runID string) (chat.Operation, []*chat.Event) {
	e.t.Helper()
	evs := e.until("run.waiting_confirmation", isType(chat.EventRunWaitingConfirmation, runID))
	prepared := findType(e.t, evs, chat.EventToolPrepared).Body.(chat.ToolBody).Operation
	wait := findType(e.t, evs, chat.EventRunWaitingConfirmation).Body.(chat.RunWaitingConfirmationBody)
	if wait.OperationID != prepared.OperationID {
		e.t.Fatalf("waiting for %s, prepared %s", wait.OperationID, prepared.OperationID)
	}
	e.wantRun(runID, chat.RunWaitingConfirmation)
	return prepared, evs
}

// ---------------------------------------------------------------------------
// Runner tools.

// newRunnerEnv is a tool environment (engine not started) whose model calls
// a runner tool, name with contract, with lookupArgs; gated: each call
// waits for r.gate.
func newRunnerEnv(t *testing.T, name, contract string, gated bool) (*toolModel, *fakeRunner, *toolEnv) {
	t.Helper()
	m := &toolModel{tool: name, args: lookupArgs}
	r := newRunner(name, contract, gated)
	return m, r, newToolEnv(t, m, r)
}

// askUntilCall starts the engine, asks text and waits until r's call
// starts: the run and the call's key.
func (e *toolEnv) askUntilCall(r *fakeRunner, text string) (chat.RunStartAck, string) {
	e.t.Helper()
	e.start()
	ack := e.ask(text)
	return ack, recv(e.t, r.started, "the tool call")
}

// hookStore lets a test act at a precise point of a worker's progress: right
// after a step is published, or right before an operation changes phase.
type hookStore struct {
	engine.Store
	afterPublish func(out chat.StepOutput)
	beforePhase  func(phase string)
}

func (s *hookStore) PublishStep(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	err := s.Store.PublishStep(ctx, lease, out)
	if err == nil && s.afterPublish != nil {
		s.afterPublish(out)
	}
	return err
}

func (s *hookStore) SetOperationPhase(ctx context.Context, lease chat.Lease, opID, phase, outcome string, needRunning bool) error {
	if s.beforePhase != nil {
		s.beforePhase(phase)
	}
	return s.Store.SetOperationPhase(ctx, lease, opID, phase, outcome, needRunning)
}

// cancelFromWorker cancels from inside a store hook, on the worker's
// goroutine, where a test may not stop.
func (e *toolEnv) cancelFromWorker(runID string) {
	ack, err := e.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: runID,
		Reason: chat.ReasonUserRequested, RequestedBy: "tab:test"})
	if err != nil || ack.Status != chat.RunCancelRequested {
		e.t.Errorf("cancel = %+v, %v", ack, err)
	}
}

// startHooked starts an engine over hs whose maintenance never runs during
// the test (an hour's lease): whatever settles the run must be the worker
// or the cancel itself.
func (e *toolEnv) startHooked(hs *hookStore) {
	e.t.Helper()
	hs.Store = e.st
	e.startWith(func(cfg *engine.Config) { cfg.Store, cfg.LeaseTTL = hs, time.Hour })
}
