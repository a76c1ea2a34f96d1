package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/tools"
)

// Tests of the holes an outside review found in the engine's honesty: a
// cancel that called a commit in flight "not started", an acknowledged
// cancel stuck behind a failed write, and a stalled execution that kept
// publishing after its run was claimed again in the same process.

// startWith starts the harness's engine with cfg changed by adjust.
func (h *harness) startWith(adjust func(*engine.Config)) {
	h.t.Helper()
	cfg := h.config()
	adjust(&cfg)
	h.eng = engine.New(cfg)
	if err := h.eng.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

// laggingMailer is a provider that records a key only when it has finished
// acting, as real services do: it takes the call, loses the answer (the
// caller times out), and acts when the test lets it; until then a lookup
// of the key finds nothing, and a repeat of the key is told the key is
// still in progress (HTTP 409 for a webhook), which settles nothing.
type laggingMailer struct {
	*fakeMailer
	act chan struct{} // closed by the test: the provider finishes acting

	mu      sync.Mutex
	pending map[string]bool // keys received, not acted on yet
	acted   chan string     // the key, once the provider acted
}

func newLaggingMailer() *laggingMailer {
	l := &laggingMailer{fakeMailer: newMailer(mailAccepts, false), act: make(chan struct{}),
		pending: map[string]bool{}, acted: make(chan string, 1)}
	return l
}

var errInProgress = errors.New("409 Conflict: a request with this key is in progress")

func (l *laggingMailer) Commit(ctx context.Context, key string, args json.RawMessage) (json.RawMessage, error) {
	l.fakeMailer.mu.Lock()
	l.commits[key]++
	l.fakeMailer.mu.Unlock()
	l.mu.Lock()
	first := !l.pending[key]
	l.pending[key] = true
	l.mu.Unlock()
	if !first {
		return nil, errInProgress
	}
	go func() { // the provider works on, whatever the caller does
		<-l.act
		l.fakeMailer.mu.Lock()
		l.accept(key)
		l.fakeMailer.mu.Unlock()
		l.acted <- key
	}()
	return nil, context.DeadlineExceeded // the answer is lost
}

func (l *laggingMailer) openAll() {
	select {
	case <-l.act:
	default:
		close(l.act)
	}
}

// confirmedLaggingEmail asks for an email through a laggingMailer, with a
// reconciler that polls every 20 ms, and confirms it.
func confirmedLaggingEmail(t *testing.T) (*toolEnv, *laggingMailer, chat.RunStartAck, chat.Operation) {
	t.Helper()
	m := &toolModel{tool: "fake_send_email", args: mailArgs}
	mail := newLaggingMailer()
	e := newToolEnv(t, m, mail)
	e.startWith(func(c *engine.Config) { c.ReconcilePoll = 20 * time.Millisecond })
	ack := e.ask("send the quote")
	op, _ := e.waitConfirmation(ack.RunID)
	if _, err := e.decide(op.OperationID, true); err != nil {
		t.Fatal(err)
	}
	return e, mail, ack, op
}

// A commit whose answer was lost, whose key the provider does not know yet
// and a cancel: the receipt says unknown (never not_started), the
// reconciler goes on asking after the run ended, and when the provider
// acts the outcome becomes committed, reported with tool.updated after
// run.cancelled. (The engine recorded voided/not_started, and the provider
// then sent the email.)
func TestCancelDuringReconciliationStaysUnknownUntilTheProviderAnswers(t *testing.T) {
	e, mail, ack, op := confirmedLaggingEmail(t)
	waitFor(t, e.sub, "the outcome unknown", func(ev *chat.Event) bool {
		return ev.Type == chat.EventToolUpdated && ev.Body.(chat.ToolBody).Operation.Phase == chat.PhaseUnknown
	})
	e.cancel(ack.RunID)
	evs := e.until("run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
	wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: op.OperationID, Tool: "fake_send_email", Phase: chat.PhaseUnknown, Outcome: chat.OutcomeUnknown})
	got := e.onlyOp()
	wantOp(t, got, chat.PhaseUnknown, chat.OutcomeUnknown)
	if got.ReconcileNextAt == nil || got.ReconcileUntil == nil {
		t.Fatalf("the unknown outcome is not being reconciled: %+v", got)
	}
	msgs := e.wantHistory("user assistant tool")
	if res := toolResult(t, msgs[2]); res["status"] != "unknown" || res["key"] != *op.IdempotencyKey || res["lookup"] != "scheduled" {
		t.Fatalf("the recorded result = %v, want status unknown naming the key, a lookup scheduled", res)
	}

	// The provider acts after the receipt; the reconciler finds it.
	mail.openAll()
	recv(t, mail.acted, "the provider's action")
	ev := waitFor(t, e.sub, "tool.updated reconciled", func(ev *chat.Event) bool {
		return ev.Type == chat.EventToolUpdated && ev.Body.(chat.ToolBody).Operation.Phase == chat.PhaseReconciled
	})
	if ev.RunID != ack.RunID {
		t.Fatalf("reconciliation reported for run %s, want %s", ev.RunID, ack.RunID)
	}
	got = e.onlyOp()
	wantOp(t, got, chat.PhaseReconciled, chat.OutcomeCommitted)
	if got.ReconcileNextAt != nil {
		t.Fatalf("still reconciling after the provider answered: %+v", got)
	}
	mail.checkActions(t, 1)
	e.wantRun(ack.RunID, chat.RunCancelled)
}

// Without a cancel, an ambiguity that outlasts the engine's tries is not a
// failure: nobody knows that the key did nothing. The run goes on with
// the outcome recorded unknown, and the reconciler settles it later.
// (After its tries the engine recorded failed.)
func TestAmbiguousCommitIsUnknownNotFailed(t *testing.T) {
	e, mail, ack, op := confirmedLaggingEmail(t)
	evs := e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
	if got := opPhases(evs, op.OperationID); slices.Contains(got, chat.PhaseFailed) || got[len(got)-1] != chat.PhaseUnknown {
		t.Fatalf("tool.updated phases = %v, want the outcome left unknown", got)
	}
	wantOp(t, e.onlyOp(), chat.PhaseUnknown, chat.OutcomeUnknown)
	mail.openAll()
	recv(t, mail.acted, "the provider's action")
	waitFor(t, e.sub, "tool.updated reconciled", func(ev *chat.Event) bool {
		return ev.Type == chat.EventToolUpdated && ev.Body.(chat.ToolBody).Operation.Phase == chat.PhaseReconciled
	})
	wantOp(t, e.onlyOp(), chat.PhaseReconciled, chat.OutcomeCommitted)
	mail.checkActions(t, 1)
}

// failingStore fails the writes that settle a run (the execution's
// FinishCancel) while failures is positive, counting down, or for ever
// when it is negative, as a database that is briefly away would.
type failingStore struct {
	engine.Store
	failures atomic.Int64
	failed   atomic.Int64
}

var errDBAway = errors.New("database is locked")

func (s *failingStore) FinishCancel(ctx context.Context, runID string, lease *chat.Lease, unbuffered int64) (bool, error) {
	if lease != nil {
		if n := s.failures.Load(); n < 0 || (n > 0 && s.failures.CompareAndSwap(n, n-1)) {
			s.failed.Add(1)
			return false, errDBAway
		}
	}
	return s.Store.FinishCancel(ctx, runID, lease, unbuffered)
}

// An acknowledged cancel is never stuck behind a failed write: the worker
// tries its final write again, and when that never succeeds it lets go of
// the run, whose lease then expires and is recovered by this very process.
// (The worker logged the error and kept its lease renewed: the run stayed
// cancel_requested until the next restart.)
func TestAcknowledgedCancelIsFinishedAfterAFailedWrite(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int64
	}{
		{"the write fails twice, then succeeds", 2},
		{"the write never succeeds", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newScripted(words, true)
			h := newHarness(t, m)
			fs := &failingStore{Store: h.st}
			fs.failures.Store(tc.failures)
			h.startWith(func(c *engine.Config) {
				c.Store = fs
				c.SettleTimeout = 300 * time.Millisecond
				c.LeaseTTL = 600 * time.Millisecond
			})
			snap := h.thread()
			sub := h.feed.Subscribe(snap.ThreadID, 1024)
			defer sub.Close()
			ack := h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
			m.release(t, 1)
			waitFor(t, sub, "a delta", isType(chat.EventMessageDelta, ack.RunID))
			if _, err := h.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID,
				Reason: chat.ReasonUserRequested, RequestedBy: "tab:t"}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, sub, "run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
			if fs.failed.Load() == 0 {
				t.Fatal("the final write never failed: the test proves nothing")
			}
			if r := h.run(ack.RunID); r.Status != chat.RunCancelled {
				t.Fatalf("run = %+v", r)
			}
		})
	}
}

// stalling is a model whose first two streams stall after their first
// chunk until the test lets each go on (a GC pause, a SIGSTOP, an
// overloaded machine); later streams answer at once.
type stalling struct {
	streams atomic.Int64
	stalled [2]chan struct{} // closed: stream i is stalled
	resume  [2]chan struct{} // closed by the test: stream i goes on
	closed  [2]chan struct{} // closed: the engine is done with stream i
}

func newStalling() *stalling {
	m := &stalling{}
	for i := range m.stalled {
		m.stalled[i], m.resume[i], m.closed[i] = make(chan struct{}), make(chan struct{}), make(chan struct{})
	}
	return m
}

func (m *stalling) let(i int) {
	select {
	case <-m.resume[i]:
	default:
		close(m.resume[i])
	}
}

func (m *stalling) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	n := int(m.streams.Add(1)) - 1
	return &stallStream{m: m, n: n}, nil
}

type stallStream struct {
	m *stalling
	n int // which stream of the model
	i int
}

func (s *stallStream) Next(ctx context.Context) (model.Chunk, error) {
	if s.i >= len(words) {
		return model.Chunk{}, model.EOF
	}
	if s.n < len(s.m.stalled) && s.i == 1 {
		close(s.m.stalled[s.n])
		select {
		case <-s.m.resume[s.n]:
		case <-ctx.Done():
			return model.Chunk{}, ctx.Err()
		}
	}
	w := words[s.i]
	if s.i > 0 {
		w = " " + w
	}
	s.i++
	return model.Chunk{Text: w}, nil
}

func (s *stallStream) Close() error {
	if s.n < len(s.m.closed) {
		select {
		case <-s.m.closed[s.n]:
		default:
			close(s.m.closed[s.n])
		}
	}
	return nil
}

// stallRenewals drops the renewal of the run's first lease, as a process
// that stalls past its lease TTL never renews it in time.
type stallRenewals struct {
	engine.Store
	runID string
	first atomic.Int64 // the first claim's epoch, once seen
}

func (s *stallRenewals) ClaimBatch(ctx context.Context, owner string, ttl time.Duration, max int) ([]*chat.Claim, error) {
	cs, err := s.Store.ClaimBatch(ctx, owner, ttl, max)
	for _, c := range cs {
		if c.Run.RunID == s.runID {
			s.first.CompareAndSwap(0, c.Lease.Epoch)
		}
	}
	return cs, err
}

func (s *stallRenewals) RenewLeases(ctx context.Context, leases []chat.Lease, ttl time.Duration) error {
	kept := slices.DeleteFunc(slices.Clone(leases), func(l chat.Lease) bool { return l.RunID == s.runID && l.Epoch == s.first.Load() })
	return s.Store.RenewLeases(ctx, kept, ttl)
}

// An execution that stalls past its lease in this very process is fenced:
// recovery re-queues the run and the same process claims it again; when
// the stalled execution wakes up while the new one is still streaming,
// its next write is refused — the step is published once, by the current
// execution, and the stale text never follows.
func TestStalledExecutionIsFencedInTheSameProcess(t *testing.T) {
	m := newStalling()
	h := newHarness(t, nil)
	h.backend = m
	t.Cleanup(func() { m.let(0); m.let(1) })
	snap := h.thread()
	sub := h.feed.Subscribe(snap.ThreadID, 1024)
	defer sub.Close()
	ack := h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
	rs := &stallRenewals{Store: h.st, runID: ack.RunID}
	h.startWith(func(c *engine.Config) {
		c.Store = rs
		c.LeaseTTL = 600 * time.Millisecond
	})
	first := waitFor(t, sub, "the first execution's delta", isType(chat.EventMessageDelta, ack.RunID)).Body.(chat.MessageDeltaBody).MessageID
	<-m.stalled[0] // the first execution stalls, its lease runs out
	// The run is claimed again here, and the new execution streams.
	waitFor(t, sub, "the second execution's delta", func(ev *chat.Event) bool {
		return ev.Type == chat.EventMessageDelta && ev.Body.(chat.MessageDeltaBody).MessageID != first
	})
	<-m.stalled[1]
	m.let(0) // the stalled execution wakes up while the current one runs …
	// … and, were it not fenced, streams its reply to the end and publishes it.
	recv(t, m.closed[0], "the stalled execution to be done with its stream")
	h.stop() // stopping hands the current execution's run back
	if r := h.run(ack.RunID); r.Status != chat.RunQueued || r.Attempt != 2 {
		t.Fatalf("run = %+v; want the second attempt handed back, nothing published", r)
	}
	if got := h.snapshot(snap.ThreadID); len(got.Messages) != 1 {
		t.Fatalf("history = %+v; the stalled execution published", got.Messages)
	}
	m.let(1)
	h.startWith(func(c *engine.Config) { c.LeaseTTL = 600 * time.Millisecond })
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, ack.RunID))
	h.stop()
	got := h.snapshot(snap.ThreadID)
	if len(got.Messages) != 2 {
		t.Fatalf("history = %+v; want the question and one answer", got.Messages)
	}
	// Of the stalled execution only the delta before the stall: nothing
	// after it woke.
	evs := h.allEvents(snap.ThreadID)
	wantSeqs(t, evs)
	perMessage := map[string]int{}
	for _, ev := range evs {
		if ev.Type == chat.EventMessageDelta {
			perMessage[ev.Body.(chat.MessageDeltaBody).MessageID]++
		}
	}
	if len(perMessage) != 3 || perMessage[got.Messages[1].MessageID] != len(words) {
		t.Fatalf("deltas per streamed message = %v; want the stalled one's 1, the handed-back one's 1 and the answer's %d", perMessage, len(words))
	}
	for id, n := range perMessage {
		if id != got.Messages[1].MessageID && n != 1 {
			t.Fatalf("message %s got %d deltas: an execution wrote after it lost its run", id, n)
		}
	}
}

var _ tools.Committer = (*laggingMailer)(nil)

// A fork re-running a step whose email the source conversation already
// sent names the same business key — the key is the step's (its lineage),
// not the thread's — so confirming it in the fork sends nothing: the
// provider answers with the first acceptance. Forked before the step that
// drafted the email, and forked while that step waited for the decision.
// (The key named the thread: a fork sent the email a second time.)
func TestForkReusesTheKeyOfAnActionAlreadyTaken(t *testing.T) {
	for _, from := range []string{"before the draft", "at the prepared draft"} {
		t.Run(from, func(t *testing.T) {
			ctx := context.Background()
			m := &toolModel{tool: "fake_send_email", args: mailArgs}
			mail := newMailer(mailAccepts, false)
			e := newToolEnv(t, m, mail)
			e.start()
			ack := e.ask("send the quote")
			op, _ := e.waitConfirmation(ack.RunID)
			if _, err := e.decide(op.OperationID, true); err != nil {
				t.Fatal(err)
			}
			e.until("run.completed", isType(chat.EventRunCompleted, ack.RunID))
			mail.checkActions(t, 1)

			_, cps, err := e.st.Checkpoints(ctx, chat.LocalUserID, e.thr.ThreadID)
			if err != nil {
				t.Fatal(err)
			}
			var at string
			for _, cp := range cps {
				switch {
				case from == "before the draft" && cp.Pending != nil && cp.Pending.Step == chat.StepGenerate && at == "":
					at = cp.CheckpointID // the user's request, before the step drafted the email
				case from == "at the prepared draft" && cp.Pending != nil && cp.Pending.Step == chat.StepTool:
					at = cp.CheckpointID
				}
			}
			forked, err := e.st.Fork(ctx, chat.Fork{UserID: chat.LocalUserID, ThreadID: e.thr.ThreadID, FromCheckpointID: at})
			if err != nil {
				t.Fatal(err)
			}
			sub := e.feed.Subscribe(forked.ThreadID, 4096)
			defer sub.Close()
			run, err := e.eng.StartRun(ctx, chat.StartRun{UserID: chat.LocalUserID, ThreadID: forked.ThreadID, ExpectedStateVersion: forked.StateVersion})
			if err != nil {
				t.Fatal(err)
			}
			prepared := waitFor(t, sub, "tool.prepared in the fork", isType(chat.EventToolPrepared, run.RunID)).Body.(chat.ToolBody).Operation
			waitFor(t, sub, "run.waiting_confirmation", isType(chat.EventRunWaitingConfirmation, run.RunID))
			if prepared.OperationID == op.OperationID || *prepared.IdempotencyKey != *op.IdempotencyKey {
				t.Fatalf("the fork prepared %s with key %s; want a call of its own under the source's key %s",
					prepared.OperationID, *prepared.IdempotencyKey, *op.IdempotencyKey)
			}
			th, err := e.st.Thread(ctx, chat.LocalUserID, forked.ThreadID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.eng.DecideOperation(ctx, chat.Decide{UserID: chat.LocalUserID, OperationID: prepared.OperationID, ExpectedStateVersion: th.StateVersion, Confirm: true}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, sub, "run.completed in the fork", isType(chat.EventRunCompleted, run.RunID))
			mail.checkActions(t, 1) // the source's one action, and no other
			ops, err := e.st.Operations(ctx, chat.LocalUserID, forked.ThreadID)
			if err != nil || len(ops) != 1 {
				t.Fatalf("fork operations = %+v, %v", ops, err)
			}
			wantOp(t, ops[0], chat.PhaseCommitted, chat.OutcomeCommitted)
		})
	}
}
