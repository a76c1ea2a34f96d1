package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/tools"
)

// ---------------------------------------------------------------------------
// Test doubles.

// toolModel is a model backend that decides from the last message, like a
// real tool-using model: after a user message it says a few words and then
// calls the configured tool (only when the request offers it); after a tool
// result it answers in a few words. Each chunk of a user turn (or of a tool
// turn) waits for a token on userGate (toolGate) when that gate is set, until
// the gate is opened for good.
type toolModel struct {
	tool string
	args json.RawMessage

	userGate, toolGate *chunkGate

	mu       sync.Mutex
	requests []model.Request
}

var (
	callWords   = []string{"Let", " me", " do", " that."}
	answerWords = []string{"Done:", " here", " is", " the", " result."}
	otherWords  = []string{"Picking", " up", " again."}
)

func (m *toolModel) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	m.mu.Lock()
	m.requests = append(m.requests, req)
	m.mu.Unlock()
	if len(req.Messages) == 0 {
		return nil, errors.New("toolModel: empty conversation")
	}
	var chunks []model.Chunk
	var gate *chunkGate
	switch req.Messages[len(req.Messages)-1].Role {
	case model.RoleUser:
		gate = m.userGate
		for _, w := range callWords {
			chunks = append(chunks, model.Chunk{Text: w})
		}
		if m.tool != "" && slices.ContainsFunc(req.Tools, func(s model.ToolSpec) bool { return s.Name == m.tool }) {
			chunks = append(chunks, model.Chunk{Call: &model.ToolCall{ID: "call_1", Name: m.tool, Arguments: m.args}})
		}
	case model.RoleTool:
		gate = m.toolGate
		for _, w := range answerWords {
			chunks = append(chunks, model.Chunk{Text: w})
		}
	default:
		for _, w := range otherWords {
			chunks = append(chunks, model.Chunk{Text: w})
		}
	}
	return &toolStream{ctx: ctx, chunks: chunks, gate: gate, closed: make(chan struct{})}, nil
}

func (m *toolModel) calls() []model.Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.requests)
}

type toolStream struct {
	ctx       context.Context
	chunks    []model.Chunk
	gate      *chunkGate
	closed    chan struct{}
	closeOnce sync.Once
}

func (s *toolStream) Next(ctx context.Context) (model.Chunk, error) {
	if len(s.chunks) == 0 {
		return model.Chunk{}, model.EOF
	}
	if s.gate != nil {
		if err := waitGate(ctx, s.ctx, s.closed, s.gate.tokens, s.gate.free); err != nil {
			return model.Chunk{}, err
		}
	}
	c := s.chunks[0]
	s.chunks = s.chunks[1:]
	return c, nil
}

func (s *toolStream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

// chunkGate lets a test step a model chunk by chunk, or let it run freely.
type chunkGate struct {
	tokens   chan struct{}
	free     chan struct{}
	freeOnce sync.Once
}

func newChunkGate() *chunkGate {
	return &chunkGate{tokens: make(chan struct{}), free: make(chan struct{})}
}

func (g *chunkGate) release(t *testing.T, n int) {
	t.Helper()
	sendTokens(t, g.tokens, n)
}

func (g *chunkGate) open() { g.freeOnce.Do(func() { close(g.free) }) }

// gate holds a tool call until the test opens it (for good).
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) wait(ctx context.Context) error {
	if g == nil {
		return nil
	}
	select {
	case <-g.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) open() {
	if g != nil {
		g.once.Do(func() { close(g.ch) })
	}
}

// opener is a double holding gates that a test's cleanup opens, so that a
// failed test never leaves a call blocked while its engine closes.
type opener interface{ openAll() }

// fakeRunner is a cancellable or idempotent tool. Run blocks on gate (when
// set) or on its context, which is how a real call behaves: a cancellable
// call ends when its context ends; an idempotent one runs to its end.
type fakeRunner struct {
	name, contract string
	gate           *gate
	started        chan string // the key of every call, as it starts
	// progress is reported (tools.ProgressReporter) as a call starts,
	// lateProgress when its context ends; set before the engine starts.
	progress     []chat.ToolProgress
	lateProgress *chat.ToolProgress

	mu    sync.Mutex
	calls map[string]int
}

func newRunner(name, contract string, gated bool) *fakeRunner {
	r := &fakeRunner{name: name, contract: contract, started: make(chan string, 16), calls: map[string]int{}}
	if gated {
		r.gate = newGate()
	}
	return r
}

func (r *fakeRunner) Spec() tools.Spec {
	return tools.Spec{Name: r.name, Description: "looks something up", Contract: r.contract,
		Parameters: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`)}
}

func (r *fakeRunner) Validate(args json.RawMessage) (json.RawMessage, error) {
	var v struct {
		Q string `json:"q"`
	}
	if err := json.Unmarshal(args, &v); err != nil || v.Q == "" {
		return nil, &tools.InvalidArgs{Reason: "q must be a non-empty string"}
	}
	return json.Marshal(v)
}

func (r *fakeRunner) Run(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	r.mu.Lock()
	r.calls[key]++
	n := r.calls[key]
	r.mu.Unlock()
	report := tools.ProgressReporter(ctx)
	for _, p := range r.progress {
		report(p)
	}
	select {
	case r.started <- key:
	default:
	}
	if err := r.gate.wait(ctx); err != nil {
		if r.lateProgress != nil {
			report(*r.lateProgress) // a tool still talking after the cancel
		}
		return nil, err
	}
	return json.Marshal(map[string]any{"answer": "sunny", "key": key, "call": n})
}

func (r *fakeRunner) callCounts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.calls)
}

func (r *fakeRunner) openAll() { r.gate.open() }

// Modes of the fake mail provider.
const (
	mailAccepts       = ""
	mailRejects       = "reject"         // refuses for good: ErrRejected, nothing sent
	mailAcceptTimeout = "accept_timeout" // sends, then the answer is lost
)

// fakeMailer is a consequential tool backed by a fake provider that keeps
// its own record of accepted keys: one key is accepted (acts) at most once,
// and a repeated Commit with an accepted key answers the first result
// without acting again, which is what a real idempotent API promises.
type fakeMailer struct {
	mode    string
	gate    *gate
	entered chan string // the key of every Commit, as it reaches the provider

	mu       sync.Mutex
	prepares int
	commits  map[string]int             // Commit calls per key
	accepted map[string]json.RawMessage // the provider's record: key -> result
	actions  map[string]int             // accepted actions per key
	statuses int
	// statusErr, when set, is what every key lookup answers: the
	// provider's status endpoint is down.
	statusErr error
	// once: the provider does not deduplicate by key (not a
	// tools.Resender), so the engine must send a key at most once. Set
	// before the engine starts.
	once bool
}

// ResendSafe implements tools.Resender: a provider that deduplicates,
// unless once.
func (m *fakeMailer) ResendSafe() bool { return !m.once }

func newMailer(mode string, gated bool) *fakeMailer {
	m := &fakeMailer{mode: mode, entered: make(chan string, 16), commits: map[string]int{},
		accepted: map[string]json.RawMessage{}, actions: map[string]int{}}
	if gated {
		m.gate = newGate()
	}
	return m
}

type email struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
	Body    string `json:"body"`
}

func (m *fakeMailer) Spec() tools.Spec {
	return tools.Spec{Name: "fake_send_email", Description: "sends an email", Contract: tools.Consequential,
		Parameters: json.RawMessage(`{"type":"object","properties":{"to":{"type":"string"},"subject":{"type":"string"},"body":{"type":"string"}},"required":["to","subject","body"]}`)}
}

func (m *fakeMailer) Validate(args json.RawMessage) (json.RawMessage, error) {
	var e email
	if err := json.Unmarshal(args, &e); err != nil || e.To == "" || e.Subject == "" || e.Body == "" {
		return nil, &tools.InvalidArgs{Reason: "to, subject and body are required"}
	}
	return json.Marshal(e)
}

func (m *fakeMailer) Prepare(scope string, args json.RawMessage) (json.RawMessage, string, error) {
	m.mu.Lock()
	m.prepares++
	m.mu.Unlock()
	var e email
	if err := json.Unmarshal(args, &e); err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(args)
	preview, err := json.Marshal(map[string]string{"to": e.To, "subject": e.Subject, "body": e.Body})
	return preview, "email:" + scope + ":" + hex.EncodeToString(sum[:8]) + ":send", err
}

func (m *fakeMailer) Commit(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	m.mu.Lock()
	m.commits[key]++
	m.mu.Unlock()
	select {
	case m.entered <- key:
	default:
	}
	if err := m.gate.wait(ctx); err != nil {
		return nil, err // never reached the provider
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if res, ok := m.accepted[key]; ok {
		return res, nil // the provider's idempotency: the first answer again
	}
	switch m.mode {
	case mailRejects:
		return nil, tools.ErrRejected
	case mailAcceptTimeout:
		m.accept(key)
		return nil, context.DeadlineExceeded
	}
	return m.accept(key), nil
}

// accept records one action for key; the caller holds m.mu.
func (m *fakeMailer) accept(key string) json.RawMessage {
	res, _ := json.Marshal(map[string]string{"status": "sent", "provider_id": fmt.Sprintf("mail-%d", len(m.accepted)+1), "key": key})
	m.accepted[key] = res
	m.actions[key]++
	return res
}

func (m *fakeMailer) Status(ctx context.Context, key string) (tools.Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.statuses++
	if m.statusErr != nil {
		return tools.Status{}, m.statusErr
	}
	res, ok := m.accepted[key]
	return tools.Status{Known: ok, Result: res}, nil
}

func (m *fakeMailer) openAll() { m.gate.open() }

// commitCalls returns how often Commit was called with key.
func (m *fakeMailer) commitCalls(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.commits[key]
}

// checkActions fails unless the provider accepted want actions in all, and
// no key more than once.
func (m *fakeMailer) checkActions(t *testing.T, want int) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	total := 0
	for key, n := range m.actions {
		if n > 1 {
			t.Errorf("key %s caused %d external actions", key, n)
		}
		total += n
	}
	if total != want {
		t.Errorf("the provider accepted %d actions, want %d (%v)", total, want, m.actions)
	}
}

// wantCommits checks the provider's actions over every key (each at most
// once) and how often Commit was called with key.
func (m *fakeMailer) wantCommits(t *testing.T, key string, actions, calls int) {
	t.Helper()
	m.checkActions(t, actions)
	if n := m.commitCalls(key); n != calls {
		t.Fatalf("Commit called %d times with %s, want %d", n, key, calls)
	}
}

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

// ---------------------------------------------------------------------------
// Consequential tools.

func TestConsequentialToolConfirmCommits(t *testing.T) {
	e, mail, ack, op, evs := emailDrafted(t, mailAccepts, false)
	if op.Phase != chat.PhasePrepared || op.Contract != tools.Consequential || op.IdempotencyKey == nil ||
		!strings.HasPrefix(*op.IdempotencyKey, "email:step-") || !strings.HasSuffix(*op.IdempotencyKey, ":send") {
		t.Fatalf("prepared operation = %+v", op)
	}
	var preview email
	if err := json.Unmarshal(op.Preview, &preview); err != nil || preview.To != "ann@example.com" {
		t.Fatalf("preview = %s", op.Preview)
	}
	if got := publishedRoles(evs); got != "user assistant" {
		t.Fatalf("published before confirmation = %q", got)
	}
	if mail.commitCalls(*op.IdempotencyKey) != 0 {
		t.Fatal("committed before the user confirmed")
	}

	before := e.version()
	ca, err := e.decide(op.OperationID, true)
	if err != nil || ca.Phase != chat.PhaseConfirmed || ca.OperationID != op.OperationID || ca.StateVersion != before+1 {
		t.Fatalf("confirm = %+v, %v", ca, err)
	}
	evs = e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
	if got := opPhases(evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseConfirmed, chat.PhaseCommitting, chat.PhaseCommitted}) {
		t.Fatalf("tool.updated phases = %v", got)
	}
	if got := publishedRoles(evs); got != "tool assistant" {
		t.Fatalf("published after confirmation = %q", got)
	}
	wantOp(t, e.onlyOp(), chat.PhaseCommitted, chat.OutcomeCommitted)
	e.wantEmailed(mail, ack.RunID, op, "sent", 1)
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

func TestConsequentialCancelWhileWaitingVoids(t *testing.T) {
	e, mail, ack, op, _ := emailDrafted(t, mailAccepts, false)
	e.cancel(ack.RunID)
	e.wantEmailCancelled(ack.RunID, op, chat.PhaseVoided, chat.OutcomeNotStarted)
	e.wantHistory("user assistant")

	// A late confirm (or reject) finds nothing to decide, and changes nothing.
	v := e.version()
	for _, confirm := range []bool{true, false} {
		_, err := e.decide(op.OperationID, confirm)
		if ce := wantCode(t, err, chat.CodeOperationNotPending); ce.Fields["phase"] != chat.PhaseVoided || ce.Fields["operation_id"] != op.OperationID {
			t.Fatalf("operation_not_pending fields = %v", ce.Fields)
		}
	}
	if e.version() != v {
		t.Fatal("a refused decision moved state_version")
	}
	wantOp(t, e.onlyOp(), chat.PhaseVoided, chat.OutcomeNotStarted)
	mail.wantCommits(t, *op.IdempotencyKey, 0, 0) // for a voided intent

	// Continue: the intent is prepared again and waits for a new decision.
	next := e.resume()
	again, _ := e.waitConfirmation(next.RunID)
	if again.OperationID == op.OperationID || again.Phase != chat.PhasePrepared || *again.IdempotencyKey != *op.IdempotencyKey {
		t.Fatalf("re-prepared operation = %+v (voided %+v)", again, op)
	}
	if _, err := e.decide(again.OperationID, false); err != nil {
		t.Fatal(err)
	}
	e.until("run.completed", isType(chat.EventRunCompleted, next.RunID))
	e.wantHistory("user assistant tool assistant")
	mail.checkActions(t, 0)
}

func TestConsequentialDecisions(t *testing.T) {
	t.Run("stale, unknown, foreign, then duplicate confirm", func(t *testing.T) {
		e, mail, ack, op, _ := emailDrafted(t, mailAccepts, true)
		ctx := context.Background()
		v := e.version()

		_, err := e.eng.DecideOperation(ctx, chat.Decide{UserID: chat.LocalUserID, OperationID: op.OperationID, ExpectedStateVersion: v - 1, Confirm: true})
		if ce := wantCode(t, err, chat.CodeStateVersionConflict); ce.Fields["current_state_version"] != v {
			t.Fatalf("conflict fields = %v", ce.Fields)
		}
		_, err = e.eng.DecideOperation(ctx, chat.Decide{UserID: chat.LocalUserID, OperationID: "op_unknown", ExpectedStateVersion: v, Confirm: true})
		wantCode(t, err, chat.CodeNotFound)
		_, err = e.eng.DecideOperation(ctx, chat.Decide{UserID: "usr_someone_else", OperationID: op.OperationID, ExpectedStateVersion: v, Confirm: true})
		wantCode(t, err, chat.CodeNotFound)
		if e.version() != v {
			t.Fatal("a refused decision moved state_version")
		}
		wantOp(t, e.onlyOp(), chat.PhasePrepared, "")
		e.wantRun(ack.RunID, chat.RunWaitingConfirmation)

		if _, err := e.decide(op.OperationID, true); err != nil {
			t.Fatal(err)
		}
		recv(t, mail.entered, "the commit")
		e.until("tool.updated committing", func(ev *chat.Event) bool {
			return ev.Type == chat.EventToolUpdated && ev.Body.(chat.ToolBody).Operation.Phase == chat.PhaseCommitting
		})
		_, err = e.decide(op.OperationID, true)
		if ce := wantCode(t, err, chat.CodeOperationNotPending); ce.Fields["phase"] != chat.PhaseCommitting {
			t.Fatalf("duplicate confirm fields = %v", ce.Fields)
		}
		mail.gate.open()
		e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
		wantOp(t, e.onlyOp(), chat.PhaseCommitted, chat.OutcomeCommitted)
		_, err = e.decide(op.OperationID, true)
		if ce := wantCode(t, err, chat.CodeOperationNotPending); ce.Fields["phase"] != chat.PhaseCommitted {
			t.Fatalf("confirm after commit fields = %v", ce.Fields)
		}
		mail.wantCommits(t, *op.IdempotencyKey, 1, 1)
	})

	t.Run("reject", func(t *testing.T) {
		e, mail, ack, op, _ := emailDrafted(t, mailAccepts, false)
		ra, err := e.decide(op.OperationID, false)
		if err != nil || ra.Phase != chat.PhaseRejected {
			t.Fatalf("reject = %+v, %v", ra, err)
		}
		evs := e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
		if got := opPhases(evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseRejected}) {
			t.Fatalf("tool.updated phases = %v", got)
		}
		if got := publishedRoles(evs); got != "tool assistant" {
			t.Fatalf("published after the reject = %q", got)
		}
		wantOp(t, e.onlyOp(), chat.PhaseRejected, chat.OutcomeNotStarted)
		msgs := e.wantHistory("user assistant tool assistant")
		if toolResult(t, msgs[2])["status"] != "rejected" {
			t.Fatalf("tool message = %s", msgs[2].Content)
		}
		e.wantRun(ack.RunID, chat.RunCompleted)
		_, err = e.decide(op.OperationID, true)
		if ce := wantCode(t, err, chat.CodeOperationNotPending); ce.Fields["phase"] != chat.PhaseRejected {
			t.Fatalf("confirm after reject fields = %v", ce.Fields)
		}
		mail.wantCommits(t, *op.IdempotencyKey, 0, 0) // for a rejected intent
	})
}

func TestConsequentialCancelDuringCommitWaitsForOutcome(t *testing.T) {
	e, mail, ack, op, _ := emailDrafted(t, mailAccepts, true)
	e.confirm(op.OperationID)
	recv(t, mail.entered, "the commit")
	e.cancel(ack.RunID)
	ev := waitFor(t, e.sub, "run.cancelling", isType(chat.EventRunCancelling, ack.RunID))
	if a := ev.Body.(chat.RunCancellingBody).ActiveOperation; a.Kind != "tool_commit" || a.OperationID != op.OperationID {
		t.Fatalf("active_operation = %+v", a)
	}
	if r := e.run(ack.RunID); r.Status != chat.RunCancelling {
		t.Fatalf("run = %s while the commit is out", r.Status)
	}
	mail.gate.open()
	e.wantEmailCancelled(ack.RunID, op, chat.PhaseCommitted, chat.OutcomeCommitted)
	e.wantHistory("user assistant tool") // what was sent is on record; no answer after the cancel
	mail.wantCommits(t, *op.IdempotencyKey, 1, 1)
}

func TestConsequentialLostAnswerIsReconciled(t *testing.T) {
	e, mail, ack, op, _ := emailDrafted(t, mailAcceptTimeout, false)
	e.confirm(op.OperationID)
	evs := e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
	if got := opPhases(evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseConfirmed, chat.PhaseCommitting, chat.PhaseUnknown, chat.PhaseReconciled}) {
		t.Fatalf("tool.updated phases = %v", got)
	}
	for _, ev := range evs {
		if ev.Type == chat.EventToolUpdated {
			if o := ev.Body.(chat.ToolBody).Operation; o.Phase == chat.PhaseUnknown && (o.Outcome == nil || *o.Outcome != chat.OutcomeUnknown) {
				t.Fatalf("unknown phase reported outcome %v", o.Outcome)
			}
		}
	}
	wantOp(t, e.onlyOp(), chat.PhaseReconciled, chat.OutcomeCommitted)
	e.wantEmailed(mail, ack.RunID, op, "sent", 1) // the key was known: reconcile must not send again
}

// A lost answer from a provider that does not deduplicate by key is not
// retried: the key is sent once, the outcome recorded unknown, and the
// reconciler settles it when a lookup finds the key.
func TestLostAnswerIsNotResentToAProviderThatDoesNotDeduplicate(t *testing.T) {
	mail := newMailer(mailAcceptTimeout, false)
	mail.once = true
	e := newToolEnv(t, &toolModel{tool: "fake_send_email", args: mailArgs}, mail)
	e.start()
	ack := e.ask("send the quote")
	op, _ := e.waitConfirmation(ack.RunID)
	mail.mu.Lock()
	mail.statusErr = errors.New("status endpoint unavailable")
	mail.mu.Unlock()
	e.confirm(op.OperationID)
	evs := e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
	if got := opPhases(evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseConfirmed, chat.PhaseCommitting, chat.PhaseUnknown}) {
		t.Fatalf("tool.updated phases = %v", got)
	}
	wantOp(t, e.onlyOp(), chat.PhaseUnknown, chat.OutcomeUnknown)
	if msgs := e.wantHistory("user assistant tool assistant"); !strings.Contains(msgs[2].Content, "not sent again") {
		t.Errorf("the recorded result does not say why it was not retried: %s", msgs[2].Content)
	}
	mail.wantCommits(t, *op.IdempotencyKey, 1, 1)
	mail.mu.Lock()
	mail.statusErr = nil
	mail.mu.Unlock()
	waitFor(t, e.sub, "tool.updated reconciled", func(ev *chat.Event) bool {
		return ev.Type == chat.EventToolUpdated && ev.Body.(chat.ToolBody).Operation.Phase == chat.PhaseReconciled
	})
	wantOp(t, e.onlyOp(), chat.PhaseReconciled, chat.OutcomeCommitted)
	mail.wantCommits(t, *op.IdempotencyKey, 1, 1)
}

func TestConsequentialProviderRejects(t *testing.T) {
	e, mail, ack, op, _ := emailDrafted(t, mailRejects, false)
	e.confirm(op.OperationID)
	evs := e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
	if got := opPhases(evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseConfirmed, chat.PhaseCommitting, chat.PhaseFailed}) {
		t.Fatalf("tool.updated phases = %v", got)
	}
	wantOp(t, e.onlyOp(), chat.PhaseFailed, chat.OutcomeFailed)
	e.wantEmailed(mail, ack.RunID, op, "failed", 0)
}

// A worker died with a commit handed off (phase committing): the next
// engine reconciles it by its key before anything else.
func TestCrashDuringCommitIsReconciled(t *testing.T) {
	ctx := context.Background()
	// crashed leaves a run whose dead worker set the operation committing,
	// after (reached) or before its Commit reached the provider.
	crashed := func(t *testing.T, reached, cancelled bool) (*toolEnv, *fakeMailer, string, string) {
		m := &toolModel{tool: "fake_send_email", args: mailArgs}
		mail := newMailer(mailAccepts, false)
		e := newToolEnv(t, m, mail)
		ack := e.startRun(e.thr.ThreadID, e.thr.StateVersion, ptr("send the quote"))
		r, err := e.st.Claim(ctx, "dead", time.Hour)
		if err != nil || r == nil || r.Run.RunID != ack.RunID {
			t.Fatalf("claim = %+v, %v", r, err)
		}
		args, _ := mail.Validate(mailArgs)
		preview, key, err := mail.Prepare(e.thr.ThreadID, args)
		if err != nil {
			t.Fatal(err)
		}
		call := &chat.ToolCall{OperationID: chat.NewID(chat.PrefixOperation), Tool: "fake_send_email", Contract: tools.Consequential,
			Args: args, Preview: preview, IdempotencyKey: key}
		if err := e.st.PublishStep(ctx, r.Lease, chat.StepOutput{Step: e.pending(ack.RunID), MessageID: chat.NewID(chat.PrefixMessage),
			Kind: chat.KindText, Content: "I will send it.", Call: call}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.DecideOperation(ctx, chat.Decide{UserID: chat.LocalUserID, OperationID: call.OperationID, ExpectedStateVersion: e.version(), Confirm: true}); err != nil {
			t.Fatal(err)
		}
		r, err = e.st.Claim(ctx, "dead", time.Hour)
		if err != nil || r == nil || r.Run.RunID != ack.RunID {
			t.Fatalf("claim of the confirmed run = %+v, %v", r, err)
		}
		if err := e.st.SetOperationPhase(ctx, r.Lease, call.OperationID, chat.PhaseCommitting, "", true); err != nil {
			t.Fatal(err)
		}
		if reached {
			if _, err := mail.Commit(ctx, key, args); err != nil { // the dead worker's call
				t.Fatal(err)
			}
		}
		if cancelled {
			if _, _, err := e.st.RequestCancel(ctx, chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID,
				Reason: chat.ReasonUserRequested, RequestedBy: "tab:test"}); err != nil {
				t.Fatal(err)
			}
		}
		e.resubscribe() // from the restart on
		return e, mail, ack.RunID, call.OperationID
	}

	for _, tc := range []struct {
		name               string
		reached, cancelled bool
		phase, outcome     string
		actions, calls     int
		history            string
		lookupFails        bool
		once               bool
	}{
		{"provider had accepted", true, false, chat.PhaseReconciled, chat.OutcomeCommitted, 1, 1, "user assistant tool assistant", false, false},
		{"provider never got it", false, false, chat.PhaseCommitted, chat.OutcomeCommitted, 1, 1, "user assistant tool assistant", false, false},
		{"cancelled, provider had accepted", true, true, chat.PhaseReconciled, chat.OutcomeCommitted, 1, 1, "user assistant tool", false, false},
		// It never reached the provider and the user has cancelled since:
		// never sent after the cancel, but since the dead worker had passed
		// the safe point, nobody can say it was not sent: unknown (never
		// not_started), and the reconciler keeps looking the key up.
		{"cancelled, provider never got it", false, true, chat.PhaseUnknown, chat.OutcomeUnknown, 0, 0, "user assistant tool", false, false},
		// The provider had accepted, but its status endpoint is down: the
		// cancel cannot know, so it must not report "not started".
		{"cancelled, provider had accepted, lookup fails", true, true, chat.PhaseUnknown, chat.OutcomeUnknown, 1, 1, "user assistant tool", true, false},
		// A provider that does not deduplicate (an MCP server) is never
		// sent a key again: what the dead worker may have sent stays
		// unknown unless a lookup finds it.
		{"provider never got it, does not deduplicate", false, false, chat.PhaseUnknown, chat.OutcomeUnknown, 0, 0, "user assistant tool assistant", false, true},
		{"provider had accepted, does not deduplicate", true, false, chat.PhaseReconciled, chat.OutcomeCommitted, 1, 1, "user assistant tool assistant", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, mail, runID, opID := crashed(t, tc.reached, tc.cancelled)
			mail.once = tc.once
			if tc.lookupFails {
				mail.mu.Lock()
				mail.statusErr = errors.New("status endpoint unavailable")
				mail.mu.Unlock()
			}
			key := *e.onlyOp().IdempotencyKey
			e.start()
			end := chat.EventRunCompleted
			if tc.cancelled {
				end = chat.EventRunCancelled
			}
			evs := e.until(end, isType(end, runID))
			if got := opPhases(evs, opID); !slices.Equal(got, []string{tc.phase}) {
				t.Fatalf("tool.updated phases = %v, want [%s]", got, tc.phase)
			}
			wantOp(t, e.onlyOp(), tc.phase, tc.outcome)
			mail.checkActions(t, tc.actions)
			if n := mail.commitCalls(key); n != tc.calls {
				t.Fatalf("Commit called %d times in all, want %d", n, tc.calls)
			}
			e.wantHistory(tc.history)
			if tc.cancelled {
				wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: opID, Tool: "fake_send_email", Phase: tc.phase, Outcome: tc.outcome})
				e.wantRun(runID, chat.RunCancelled)
				// The outcome was settled before the cancel could report it.
				settled := slices.IndexFunc(evs, func(ev *chat.Event) bool { return ev.Type == chat.EventToolUpdated })
				if settled < 0 || settled > len(evs)-2 {
					t.Fatalf("events = %v", evs)
				}
				return
			}
			e.wantRun(runID, chat.RunCompleted)
		})
	}
}

// A cancel that lands after the confirm but before a worker committed: the
// intent is voided and nothing is sent.
func TestCancelAfterConfirmBeforeCommitVoids(t *testing.T) {
	for _, viaEngine := range []bool{true, false} {
		name := "cancel through an unstarted engine"
		if !viaEngine {
			name = "cancel recorded, then recovery"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e, mail, ack, op, _ := emailDrafted(t, mailAccepts, false)
			e.stop() // no worker between the confirm and the claim
			if _, err := e.st.DecideOperation(ctx, chat.Decide{UserID: chat.LocalUserID, OperationID: op.OperationID, ExpectedStateVersion: e.version(), Confirm: true}); err != nil {
				t.Fatal(err)
			}
			wantOp(t, e.onlyOp(), chat.PhaseConfirmed, "")
			if viaEngine {
				e.eng = engine.New(e.config()) // not started: nothing claims
				e.cancel(ack.RunID)
			} else {
				if _, _, err := e.st.RequestCancel(ctx, chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID,
					Reason: chat.ReasonUserRequested, RequestedBy: "tab:test"}); err != nil {
					t.Fatal(err)
				}
				e.start()
			}
			evs := e.until("run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
			wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: op.OperationID, Tool: "fake_send_email", Phase: chat.PhaseVoided, Outcome: chat.OutcomeNotStarted})
			if viaEngine {
				e.stop()
				e.start() // a worker now finds nothing to commit
			}
			e.stop()
			wantOp(t, e.onlyOp(), chat.PhaseVoided, chat.OutcomeNotStarted)
			e.wantRun(ack.RunID, chat.RunCancelled)
			e.wantHistory("user assistant")
			mail.wantCommits(t, *op.IdempotencyKey, 0, 0)
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

// A cancel that lands as the worker hands the run over to wait for a
// confirmation (the worker is still registered) is finished at once.
func TestCancelAsRunStartsWaitingIsFinished(t *testing.T) {
	m := &toolModel{tool: "fake_send_email", args: mailArgs}
	mail := newMailer(mailAccepts, false)
	e := newToolEnv(t, m, mail)
	var runID string
	hs := &hookStore{afterPublish: func(out chat.StepOutput) {
		if out.Call != nil {
			e.cancelFromWorker(runID) // the worker has not returned yet
		}
	}}
	runID = e.startRun(e.thr.ThreadID, e.thr.StateVersion, ptr("send the quote")).RunID
	e.startHooked(hs)
	evs := e.until("run.cancelled", isType(chat.EventRunCancelled, runID))
	op := e.onlyOp()
	wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: op.OperationID, Tool: "fake_send_email", Phase: chat.PhaseVoided, Outcome: chat.OutcomeNotStarted})
	e.wantRun(runID, chat.RunCancelled)
	mail.checkActions(t, 0)
}

// A cancel between a worker's claim of a confirmed run and its commit is
// caught at the safe point before the commit: voided, nothing sent.
func TestCancelAtSafePointBeforeCommitVoids(t *testing.T) {
	m := &toolModel{tool: "fake_send_email", args: mailArgs}
	mail := newMailer(mailAccepts, false)
	e := newToolEnv(t, m, mail)
	var runID string
	var once sync.Once
	hs := &hookStore{beforePhase: func(phase string) {
		if phase == chat.PhaseCommitting {
			once.Do(func() { e.cancelFromWorker(runID) })
		}
	}}
	runID = e.startRun(e.thr.ThreadID, e.thr.StateVersion, ptr("send the quote")).RunID
	e.startHooked(hs)
	op, _ := e.waitConfirmation(runID)
	e.confirm(op.OperationID)
	evs := e.until("run.cancelled", isType(chat.EventRunCancelled, runID))
	if got := opPhases(evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseConfirmed, chat.PhaseVoided}) {
		t.Fatalf("tool.updated phases = %v", got)
	}
	if n := countType(evs, chat.EventRunCancelling); n != 0 {
		t.Fatalf("%d run.cancelling events: nothing was in flight", n)
	}
	wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: op.OperationID, Tool: "fake_send_email", Phase: chat.PhaseVoided, Outcome: chat.OutcomeNotStarted})
	e.wantRun(runID, chat.RunCancelled)
	e.wantHistory("user assistant")
	mail.wantCommits(t, *op.IdempotencyKey, 0, 0)
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
