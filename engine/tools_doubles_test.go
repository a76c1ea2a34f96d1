// Test doubles for runs that call tools: a tool-calling model, gates that
// step it, a runner tool and a consequential mail tool with a fake provider.
// The other engine tests (honesty, races, interleavings) use them too.

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
	"sync"
	"testing"

	"github.com/honestcancel/gateway/chat"
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
