package engine_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/store"
	"github.com/honestcancel/gateway/tools"
)

// scripted is a model backend driven by the test: each Next waits for a
// token on gate (nil gate: no waiting) and returns the next word. It records
// every request and whether a stream's context was cancelled (the upstream
// call stopped).
type scripted struct {
	words []string
	gate  chan struct{}

	mu       sync.Mutex
	requests []model.Request
	streams  atomic.Int32
	stopped  chan struct{} // closed when a stream sees its context end
	stopOnce sync.Once
}

func newScripted(words []string, gated bool) *scripted {
	m := &scripted{words: words, stopped: make(chan struct{})}
	if gated {
		m.gate = make(chan struct{})
	}
	return m
}

func (m *scripted) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	m.mu.Lock()
	m.requests = append(m.requests, req)
	m.mu.Unlock()
	m.streams.Add(1)
	return &scriptedStream{m: m, ctx: ctx}, nil
}

func (m *scripted) lastRequest() model.Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests[len(m.requests)-1]
}

type scriptedStream struct {
	m   *scripted
	ctx context.Context
	i   int
}

func (s *scriptedStream) Next(ctx context.Context) (model.Chunk, error) {
	if s.i >= len(s.m.words) {
		return model.Chunk{}, model.EOF
	}
	if s.m.gate != nil {
		if err := waitGate(ctx, s.ctx, nil, s.m.gate, nil); err != nil {
			s.m.stopOnce.Do(func() { close(s.m.stopped) })
			return model.Chunk{}, err
		}
	}
	w := s.m.words[s.i]
	if s.i > 0 {
		w = " " + w
	}
	s.i++
	return model.Chunk{Text: w}, nil
}

func (s *scriptedStream) Close() error { return nil }

// waitStreams waits (bounded) until n streams were asked of the model.
func (m *scripted) waitStreams(t *testing.T, n int32) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); m.streams.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d runs reached the model, want %d", m.streams.Load(), n)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

// release lets n more chunks through a gated model.
func (m *scripted) release(t *testing.T, n int) {
	t.Helper()
	sendTokens(t, m.gate, n)
}

// sendTokens hands n tokens to a model waiting on gate, one per chunk,
// failing t when the model stops asking for them.
func sendTokens(t *testing.T, gate chan<- struct{}, n int) {
	t.Helper()
	for range n {
		select {
		case gate <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatal("the model was never asked for its next chunk")
		}
	}
}

// waitGate waits, for a model stream's next chunk, for a token on a or b
// (nil: never), and answers the error that ends the chunk instead: the
// call's context, the stream's context, or the stream closed (closed; nil:
// never closed).
func waitGate(ctx, stream context.Context, closed, a, b <-chan struct{}) error {
	select {
	case <-a:
		return nil
	case <-b:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stream.Done():
		return stream.Err()
	case <-closed:
		return errors.New("stream closed")
	}
}

type harness struct {
	t     *testing.T
	path  string
	st    *store.Store
	feed  *bus.Memory
	eng   *engine.Engine
	model *scripted
	// backend and tools, when set, configure the engine instead of model
	// (tool tests bring their own model and tools).
	backend model.Backend
	tools   *tools.Registry
}

func newHarness(t *testing.T, m *scripted) *harness {
	t.Helper()
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "gw.db"), model: m}
	h.open()
	t.Cleanup(func() {
		h.stop()
		h.check()
		h.st.Close()
	})
	return h
}

func (h *harness) open() {
	h.feed = bus.NewMemory()
	st, err := store.Open(context.Background(), h.path, store.Options{OnCommit: h.feed.Publish, Exclusive: true})
	if err != nil {
		h.t.Fatal(err)
	}
	h.st = st
}

func (h *harness) start() {
	h.t.Helper()
	h.startWith(func(*engine.Config) {})
}

// config is the engine configuration start uses.
func (h *harness) config() engine.Config {
	var m model.Backend = h.model
	if h.backend != nil {
		m = h.backend
	}
	return engine.Config{Store: h.st, Retention: h.st.Retention(), Model: m, Tools: h.tools, SingleInstance: true, LeaseTTL: time.Second}
}

func (h *harness) stop() {
	if h.eng != nil {
		h.eng.Close()
		h.eng = nil
	}
}

func (h *harness) check() {
	h.t.Helper()
	vs, err := h.st.Check(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	for _, v := range vs {
		h.t.Error(v)
	}
}

// must returns v, failing t first when err is not nil.
func must[T any](t *testing.T, v T, err error) T {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (h *harness) thread() chat.Snapshot {
	h.t.Helper()
	snap, err := h.st.CreateThread(context.Background(), chat.LocalUserID, "t")
	return must(h.t, snap, err)
}

// watchedThread creates a thread and subscribes to its live events; the
// subscription is closed when the test ends.
func (h *harness) watchedThread() (chat.Snapshot, *bus.Subscription) {
	h.t.Helper()
	snap := h.thread()
	sub := h.feed.Subscribe(snap.ThreadID, 4096)
	h.t.Cleanup(sub.Close)
	return snap, sub
}

func (h *harness) snapshot(threadID string) chat.Snapshot {
	h.t.Helper()
	snap, err := h.st.Snapshot(context.Background(), chat.LocalUserID, threadID)
	return must(h.t, snap, err)
}

func (h *harness) startRun(threadID string, version int64, text *string) chat.RunStartAck {
	h.t.Helper()
	ack, err := h.st.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID, ThreadID: threadID, ExpectedStateVersion: version, UserMessage: text})
	return must(h.t, ack, err)
}

func (h *harness) run(runID string) chat.Run {
	h.t.Helper()
	r, err := h.st.Run(context.Background(), chat.LocalUserID, runID)
	return must(h.t, r, err)
}

// pending is the step the run's thread waits on, as a worker reads it.
func (h *harness) pending(runID string) chat.Pending {
	h.t.Helper()
	in, err := h.st.RunInput(context.Background(), runID)
	if err != nil || in.Pending == nil {
		h.t.Fatalf("run input of %s: %+v, %v", runID, in.Pending, err)
	}
	return *in.Pending
}

// waitFor reads the thread's live events until one satisfies pred.
func waitFor(t *testing.T, sub *bus.Subscription, what string, pred func(*chat.Event) bool) *chat.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended waiting for %s: %v", what, sub.Err())
			}
			if pred(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func isType(typ, runID string) func(*chat.Event) bool {
	return func(ev *chat.Event) bool { return ev.Type == typ && (runID == "" || ev.RunID == runID) }
}

func ptr(s string) *string { return &s }

// runningHello starts an engine over the scripted words (gated: each chunk
// waits for the test to release it) and queues a run of "hello" on a new
// thread whose live events sub receives.
func runningHello(t *testing.T, gated bool) (*harness, *scripted, chat.Snapshot, *bus.Subscription, chat.RunStartAck) {
	t.Helper()
	m := newScripted(words, gated)
	h := newHarness(t, m)
	snap, sub := h.watchedThread()
	h.start()
	return h, m, snap, sub, h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
}

var words = strings.Fields("one two three four five six seven eight nine ten")

func TestRunStreamsPublishesAndCompletes(t *testing.T) {
	h, _, snap, sub, ack := runningHello(t, false)

	var deltas strings.Builder
	var published *chat.Event
	waitFor(t, sub, "run.completed", func(ev *chat.Event) bool {
		switch ev.Type {
		case chat.EventMessageDelta:
			deltas.WriteString(ev.Body.(chat.MessageDeltaBody).Text)
		case chat.EventMessagePublished:
			published = ev
		}
		return ev.Type == chat.EventRunCompleted && ev.RunID == ack.RunID
	})
	if published == nil {
		t.Fatal("no message.published before run.completed")
	}
	msg := published.Body.(chat.MessagePublishedBody).Message
	if want := strings.Join(words, " "); msg.Content != want || deltas.String() != want {
		t.Fatalf("published %q from deltas %q, want %q", msg.Content, deltas.String(), want)
	}
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 2 || after.Messages[1].MessageID != msg.MessageID || after.ActiveRun != nil {
		t.Fatalf("history after completion: %+v", after)
	}
	if r := h.run(ack.RunID); r.Status != chat.RunCompleted || r.FinishedAt == nil {
		t.Fatalf("run = %+v", r)
	}
}

func TestCancelMidStreamStopsModelAndPublishesNothing(t *testing.T) {
	h, m, snap, sub, ack := runningHello(t, true)
	m.release(t, 3)
	var seen int
	waitFor(t, sub, "three deltas", func(ev *chat.Event) bool {
		if ev.Type == chat.EventMessageDelta {
			seen++
		}
		return seen == 3
	})

	cancel, err := h.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID, Reason: "user_requested", RequestedBy: "tab:t1"})
	if err != nil {
		t.Fatal(err)
	}
	if cancel.Status != chat.RunCancelRequested || cancel.AlreadyRequested || cancel.AcceptedStateVersion != ack.StateVersion+1 {
		t.Fatalf("cancel ack = %+v", cancel)
	}
	select {
	case <-m.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the model call was not cancelled")
	}
	ev := waitFor(t, sub, "run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
	body := ev.Body.(chat.RunCancelledBody)
	if want := int64(len("one two three")); body.DiscardedStreamChars != want {
		t.Errorf("discarded_stream_chars = %d, want %d", body.DiscardedStreamChars, want)
	}
	if body.ResumePolicy != chat.ResumePolicyRegenerate || body.ResumeCheckpointID != cancel.ResumeCheckpointID || body.Operations == nil {
		t.Errorf("run.cancelled body = %+v", body)
	}
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 1 || after.Messages[0].Role != chat.RoleUser {
		t.Fatalf("history after cancel holds %d messages: %+v", len(after.Messages), after.Messages)
	}
	if r := h.run(ack.RunID); r.Status != chat.RunCancelled || r.RequestedBy == nil || *r.RequestedBy != "tab:t1" {
		t.Fatalf("run = %+v", r)
	}

	// A second cancel changes nothing.
	again, err := h.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID, Reason: "again", RequestedBy: "tab:t2"})
	if err != nil {
		t.Fatal(err)
	}
	if !again.AlreadyRequested || again.Status != chat.RunCancelled || again.AcceptedStateVersion != cancel.AcceptedStateVersion {
		t.Fatalf("second cancel = %+v", again)
	}
	if v := h.snapshot(snap.ThreadID).StateVersion; v != after.StateVersion {
		t.Fatalf("second cancel moved state_version %d -> %d", after.StateVersion, v)
	}
}

func TestContinueAfterCancelRegeneratesWithNote(t *testing.T) {
	h, m, snap, sub, first := runningHello(t, true)
	m.release(t, 2)
	waitFor(t, sub, "a delta", isType(chat.EventMessageDelta, first.RunID))
	if _, err := h.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: first.RunID, Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, sub, "run.cancelled", isType(chat.EventRunCancelled, first.RunID))

	m.gate = nil // the next stream runs freely
	cur := h.snapshot(snap.ThreadID)
	next, err := h.eng.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, ExpectedStateVersion: cur.StateVersion})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, next.RunID))
	req := m.lastRequest()
	if req.ResumeNote == "" || !strings.Contains(req.ResumeNote, "stopped") {
		t.Errorf("resume note = %q", req.ResumeNote)
	}
	if len(req.Messages) != 1 || req.Messages[0].Content != "hello" {
		t.Errorf("continuation context = %+v (discarded text must never be glued on)", req.Messages)
	}
	final := h.snapshot(snap.ThreadID)
	if len(final.Messages) != 2 || final.Messages[1].Content != strings.Join(words, " ") {
		t.Fatalf("history = %+v", final.Messages)
	}
}

func TestCancelOfQueuedRunFinishesWithoutWorker(t *testing.T) {
	h := newHarness(t, newScripted(words, false))
	snap, sub := h.watchedThread()
	// Not started: nothing claims the run.
	h.eng = engine.New(engine.Config{Store: h.st, Model: h.model, SingleInstance: true})
	ack := h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
	c, err := h.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID, Reason: "user_requested", RequestedBy: "api:test"})
	if err != nil || c.Status != chat.RunCancelRequested {
		t.Fatalf("cancel = %+v, %v", c, err)
	}
	ev := waitFor(t, sub, "run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
	if d := ev.Body.(chat.RunCancelledBody).DiscardedStreamChars; d != 0 {
		t.Fatalf("discarded %d chars of a run that never streamed", d)
	}
	if h.model.streams.Load() != 0 {
		t.Fatal("the model was called for a cancelled queued run")
	}
}

func TestShutdownHandsRunBackIntact(t *testing.T) {
	h, m, snap, sub, ack := runningHello(t, true)
	m.release(t, 2)
	waitFor(t, sub, "a delta", isType(chat.EventMessageDelta, ack.RunID))
	h.stop()
	if r := h.run(ack.RunID); r.Status != chat.RunQueued || r.Attempt != 1 {
		t.Fatalf("after shutdown run = %+v, want queued attempt 1", r)
	}
	if got := h.snapshot(snap.ThreadID); len(got.Messages) != 1 {
		t.Fatalf("shutdown published something: %+v", got.Messages)
	}
	m.gate = nil
	h.start()
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, ack.RunID))
}

// streamedByDeadWorker queues a run of "hello" on a new thread (the engine
// not started) and has owner claim it and stream texts as messageID under
// its lease, and nothing more: what a worker leaves when its process dies
// mid-stream.
func streamedByDeadWorker(t *testing.T, owner, messageID string, texts ...string) (*harness, chat.Snapshot, chat.RunStartAck, *chat.Claim) {
	t.Helper()
	ctx := context.Background()
	h := newHarness(t, newScripted(words, false))
	snap := h.thread()
	ack := h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
	run, err := h.st.Claim(ctx, owner, time.Hour)
	if err != nil || run == nil || run.Run.RunID != ack.RunID {
		t.Fatalf("claim = %+v, %v", run, err)
	}
	if err := h.st.AppendDeltas(ctx, run.Lease, messageID, texts); err != nil {
		t.Fatal(err)
	}
	return h, snap, ack, run
}

func TestRecoveryAfterCrash(t *testing.T) {
	ctx := context.Background()

	t.Run("interrupted stream is re-queued and completes", func(t *testing.T) {
		h, snap, ack, _ := streamedByDeadWorker(t, "dead-process", "msg_dead", "half", " a")
		sub := h.feed.Subscribe(snap.ThreadID, 1024)
		defer sub.Close()
		h.start()
		waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, ack.RunID))
		r := h.run(ack.RunID)
		if r.Attempt != 2 || r.DiscardedStreamChars != int64(len("half a")) {
			t.Fatalf("attempt = %d, discarded = %d; want 2 and the interrupted attempt's %d chars", r.Attempt, r.DiscardedStreamChars, len("half a"))
		}
		got := h.snapshot(snap.ThreadID)
		if len(got.Messages) != 2 || got.Messages[1].MessageID == "msg_dead" || got.Messages[1].Content != strings.Join(words, " ") {
			t.Fatalf("history = %+v", got.Messages)
		}
		if !strings.Contains(h.model.lastRequest().ResumeNote, "interrupted") {
			t.Errorf("retry note = %q", h.model.lastRequest().ResumeNote)
		}
	})

	t.Run("published but not finished ends completed without re-running", func(t *testing.T) {
		h, snap, ack, run := streamedByDeadWorker(t, "dead-process", "msg_done", "all", " of it")
		if err := h.st.PublishStep(ctx, run.Lease, chat.StepOutput{Step: h.pending(ack.RunID), MessageID: "msg_done", Kind: chat.KindText, Content: "all of it"}); err != nil {
			t.Fatal(err)
		}
		h.start()
		h.stop()
		if r := h.run(ack.RunID); r.Status != chat.RunCompleted || r.Attempt != 1 {
			t.Fatalf("run = %+v", r)
		}
		if n := h.model.streams.Load(); n != 0 {
			t.Fatalf("the model was called %d times for a published step", n)
		}
		if got := h.snapshot(snap.ThreadID); len(got.Messages) != 2 || got.Messages[1].MessageID != "msg_done" {
			t.Fatalf("history = %+v", got.Messages)
		}
	})

	t.Run("cancel recorded before the crash ends cancelled", func(t *testing.T) {
		h, _, ack, _ := streamedByDeadWorker(t, "dead-process", "msg_x", "abc")
		if _, _, err := h.st.RequestCancel(ctx, chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID, Reason: "user_requested", RequestedBy: "tab:x"}); err != nil {
			t.Fatal(err)
		}
		h.start()
		h.stop()
		r := h.run(ack.RunID)
		if r.Status != chat.RunCancelled || r.DiscardedStreamChars != 3 {
			t.Fatalf("run = %+v", r)
		}
	})

	t.Run("retry limit ends failed interrupted", func(t *testing.T) {
		h := newHarness(t, newScripted(words, false))
		snap := h.thread()
		ack := h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
		for i := range 3 {
			owner := "dead-" + string(rune('a'+i))
			if _, err := h.st.Claim(ctx, owner, time.Hour); err != nil {
				t.Fatal(err)
			}
			if _, err := h.st.Recover(ctx, "someone-else", true, 3); err != nil {
				t.Fatal(err)
			}
		}
		r := h.run(ack.RunID)
		if r.Status != chat.RunFailed || r.Error == nil || *r.Error != chat.ErrorInterrupted || r.Attempt != 3 {
			t.Fatalf("run = %+v", r)
		}
	})
}

func TestPublishLosesToRecordedCancel(t *testing.T) {
	ctx := context.Background()
	h, snap, ack, run := streamedByDeadWorker(t, "w", "msg_late", "late", " text")
	// The cancel commits while the last delta is "on the wire": the worker's
	// publish must lose.
	if _, _, err := h.st.RequestCancel(ctx, chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID, Reason: "user_requested", RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	err := h.st.PublishStep(ctx, run.Lease, chat.StepOutput{Step: h.pending(ack.RunID), MessageID: "msg_late", Kind: chat.KindText, Content: "late text"})
	var lost *chat.ErrNotRunning
	if !errors.As(err, &lost) || lost.Status != chat.RunCancelRequested {
		t.Fatalf("publish after cancel = %v", err)
	}
	if err := h.st.AppendDeltas(ctx, run.Lease, "msg_late", []string{" more"}); !errors.As(err, &lost) {
		t.Fatalf("delta after cancel = %v", err)
	}
	if ok, err := h.st.FinishCancel(ctx, ack.RunID, &run.Lease, 0); !ok || err != nil {
		t.Fatalf("finish cancel = %v, %v", ok, err)
	}
	if got := h.snapshot(snap.ThreadID); len(got.Messages) != 1 {
		t.Fatalf("a cancelled run published: %+v", got.Messages)
	}
	if r := h.run(ack.RunID); r.DiscardedStreamChars != int64(len("late text")) {
		t.Fatalf("discarded = %d", r.DiscardedStreamChars)
	}
}

// While a model streams (here: blocked before its next chunk), no write
// transaction is held: other writes commit at once.
func TestNoWriteTransactionHeldWhileModelStreams(t *testing.T) {
	h, m, _, sub, ack := runningHello(t, true)
	m.release(t, 1)
	waitFor(t, sub, "a delta", isType(chat.EventMessageDelta, ack.RunID))
	// The worker is now inside the model's Next, waiting for the gate.
	done := make(chan error, 1)
	go func() {
		_, err := h.st.CreateThread(context.Background(), chat.LocalUserID, "other")
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a write waited on the streaming run: a transaction is held open")
	}
}

// usageModel streams like scripted and reports token usage per stream, as
// an OpenAI-compatible endpoint does with include_usage.
type usageModel struct{ *scripted }

type usageStream struct{ model.Stream }

func (usageStream) Usage() (int64, int64) { return 11, 7 }

func (m usageModel) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	s, err := m.scripted.Stream(ctx, req)
	return usageStream{s}, err
}

func TestTokenUsageIsRecordedPerRun(t *testing.T) {
	m := newScripted(words, false)
	h := newHarness(t, m)
	h.backend = usageModel{m}
	snap, sub := h.watchedThread()
	h.start()
	ack := h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, ack.RunID))
	if u := h.run(ack.RunID).Usage; u.PromptTokens != 11 || u.CompletionTokens != 7 {
		t.Fatalf("usage = %+v, want 11 prompt and 7 completion tokens", u)
	}
}

// onePerClaim is a store that claims one run per ClaimBatch, as the
// PostgreSQL store does.
type onePerClaim struct{ engine.Store }

func (s onePerClaim) ClaimBatch(ctx context.Context, owner string, ttl time.Duration, max int) ([]*chat.Claim, error) {
	return s.Store.ClaimBatch(ctx, owner, ttl, min(max, 1))
}

// With a store that claims one run per transaction, runs queued at once
// are all claimed at once, one claim after the other, not one per wake-up
// (the poll is an hour here, and nothing else wakes the dispatcher: the
// runs were queued before the engine started and none ends).
func TestDispatchClaimsABurstOnePerTransaction(t *testing.T) {
	m := newScripted(words, true)
	h := newHarness(t, m)
	const n = 6
	for range n {
		snap := h.thread()
		h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
	}
	h.startWith(func(cfg *engine.Config) {
		cfg.Store, cfg.ClaimBatch, cfg.ClaimPoll = onePerClaim{h.st}, 1, time.Hour
	})
	m.waitStreams(t, n) // the others would wait for a wake-up that never comes
	m.release(t, n*len(words))
}

// countingClaims counts the runs ClaimBatch hands out.
type countingClaims struct {
	engine.Store
	n *atomic.Int32
}

func (s countingClaims) ClaimBatch(ctx context.Context, owner string, ttl time.Duration, max int) ([]*chat.Claim, error) {
	cs, err := s.Store.ClaimBatch(ctx, owner, ttl, max)
	s.n.Add(int32(len(cs)))
	return cs, err
}

// A run started through the engine while a slot is free is claimed by its
// start's own commit: it reaches the model, and its ack says running, with
// no claim of the dispatcher's (whose poll is an hour here). One started
// while the only slot is taken waits queued, first in line, and the
// dispatcher claims it when the slot frees.
func TestAStartWithAFreeSlotClaimsItsRun(t *testing.T) {
	m := newScripted(words, true)
	h := newHarness(t, m)
	var claims atomic.Int32
	h.startWith(func(cfg *engine.Config) {
		cfg.Store, cfg.Workers, cfg.ClaimPoll = countingClaims{h.st, &claims}, 1, time.Hour
	})
	start := func(snap chat.Snapshot) chat.RunStartAck {
		t.Helper()
		ack, err := h.eng.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID,
			ThreadID: snap.ThreadID, ExpectedStateVersion: snap.StateVersion, UserMessage: ptr("hello")})
		return must(t, ack, err)
	}
	snapA := h.thread()
	snapB, subB := h.watchedThread()
	a := start(snapA)
	if a.Status != chat.RunRunning || a.QueuePosition != 0 {
		t.Fatalf("run.start with a free slot: %+v; want running", a)
	}
	m.waitStreams(t, 1)
	b := start(snapB)
	if b.Status != chat.RunQueued || b.QueuePosition != 1 {
		t.Fatalf("run.start with the slot taken: %+v; want queued, first in line", b)
	}
	if n := claims.Load(); n != 0 {
		t.Fatalf("the dispatcher claimed %d runs; want none: the start claimed its own", n)
	}
	m.release(t, len(words)) // A completes; its slot frees
	m.waitStreams(t, 2)
	if n := claims.Load(); n != 1 {
		t.Fatalf("the dispatcher claimed %d runs; want 1, the one that waited", n)
	}
	m.release(t, len(words))
	waitFor(t, subB, "run.completed", isType(chat.EventRunCompleted, b.RunID))
}

// The engine holds every caller to the protocol's limits, not only the
// gateway's transports: a run.start or run.cancel over them changes
// nothing.
func TestEngineRefusesCommandsOverTheLimits(t *testing.T) {
	h := newHarness(t, newScripted(words, false))
	snap := h.thread()
	h.start()
	long := strings.Repeat("x", chat.MaxUserMessageBytes+1)
	_, err := h.eng.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID,
		ExpectedStateVersion: snap.StateVersion, UserMessage: &long})
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != chat.CodeInvalidRequest {
		t.Fatalf("run.start with a %d-byte message: %v, want invalid_request", len(long), err)
	}
	_, err = h.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: "run_x", RequestedBy: "tab:t"})
	if !errors.As(err, &ce) || ce.Code != chat.CodeInvalidRequest {
		t.Fatalf("run.cancel without a reason: %v, want invalid_request", err)
	}
	// The other commands, where a program calls the engine or the store
	// directly (no transport to check them first).
	ctx := context.Background()
	longID := strings.Repeat("c", chat.MaxIDBytes+1)
	for name, call := range map[string]func() error{
		"tool.confirm at a negative version": func() error {
			_, err := h.eng.DecideOperation(ctx, chat.Decide{UserID: chat.LocalUserID, OperationID: "op_x", ExpectedStateVersion: -1, Confirm: true})
			return err
		},
		"thread.delete at a negative version": func() error {
			_, err := h.eng.DeleteThread(ctx, chat.DeleteThread{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, ExpectedStateVersion: new(int64(-1)), RequestedBy: "tab:t"})
			return err
		},
		"thread.fork from an over-long checkpoint id": func() error {
			_, err := h.st.Fork(ctx, chat.Fork{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, FromCheckpointID: longID})
			return err
		},
		"thread.checkout at a negative version": func() error {
			_, err := h.st.Checkout(ctx, chat.Checkout{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, CheckpointID: snap.HeadCheckpointID, ExpectedStateVersion: -1})
			return err
		},
		"draft.delete without a message": func() error {
			_, err := h.st.DeleteDraft(ctx, chat.DeleteDraft{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, MessageID: "", ExpectedStateVersion: snap.StateVersion})
			return err
		},
		"fragment.save before any delta": func() error {
			_, err := h.st.SaveFragment(ctx, chat.SaveFragment{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, MessageID: "msg_x", ExpectedStateVersion: snap.StateVersion})
			return err
		},
	} {
		if err := call(); !errors.As(err, &ce) || ce.Code != chat.CodeInvalidRequest {
			t.Errorf("%s: %v, want invalid_request", name, err)
		}
	}
	after, err := h.st.Snapshot(context.Background(), chat.LocalUserID, snap.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if after.StateVersion != snap.StateVersion || after.LastSeq != snap.LastSeq || after.ActiveRun != nil {
		t.Fatalf("a refused command changed the thread: version %d→%d, last seq %d→%d, active run %v",
			snap.StateVersion, after.StateVersion, snap.LastSeq, after.LastSeq, after.ActiveRun)
	}
}
