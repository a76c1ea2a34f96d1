package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/tools"
)

// The five race scenarios of the reliability issue, each with the engine
// running and the ordering forced by gates and store hooks (never sleeps).
// Each asserts the protocol's invariants, not only the final status; the
// harness's cleanup also runs the store's consistency check.

// raceStore is the engine's store with hooks at the publish of a step, and a
// crash switch: once crashed, every call fails without touching the
// database, as if the process had died at that instant.
type raceStore struct {
	engine.Store
	beforePublish func(runID string, out chat.StepOutput)
	afterPublish  func(runID string, out chat.StepOutput)
	crashed       atomic.Bool
}

var errCrashed = errors.New("the process is dead")

func (s *raceStore) dead() error {
	if s.crashed.Load() {
		return errCrashed
	}
	return nil
}

// unlessDead returns what call returns, or errCrashed without calling it
// once the process is dead.
func (s *raceStore) unlessDead(call func() error) error {
	if err := s.dead(); err != nil {
		return err
	}
	return call()
}

// valueUnlessDead is unlessDead for a call that also returns a value.
func valueUnlessDead[T any](s *raceStore, call func() (T, error)) (T, error) {
	if err := s.dead(); err != nil {
		var zero T
		return zero, err
	}
	return call()
}

func (s *raceStore) PublishStep(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	runID := lease.RunID
	if err := s.dead(); err != nil {
		return err
	}
	if s.beforePublish != nil {
		s.beforePublish(runID, out)
	}
	err := s.Store.PublishStep(ctx, lease, out)
	if err == nil && s.afterPublish != nil {
		s.afterPublish(runID, out)
	}
	return err
}

// CompleteWith is split into PublishStep and Complete here, hooks in
// between, so that a crash can land between the two: the engine writes
// them in one transaction, but a database an earlier version wrote may
// hold a run published and not completed, which recovery must finish.
func (s *raceStore) CompleteWith(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	if err := s.PublishStep(ctx, lease, out); err != nil {
		return err
	}
	return s.Complete(ctx, lease)
}

func (s *raceStore) ClaimBatch(ctx context.Context, owner string, ttl time.Duration, max int) ([]*chat.Claim, error) {
	return valueUnlessDead(s, func() ([]*chat.Claim, error) { return s.Store.ClaimBatch(ctx, owner, ttl, max) })
}

// StartRunClaimed claims nothing once the process is dead: like
// ClaimBatch's, a dead process's claim never reaches the database (the
// start itself is not this double's, as StartRun is not).
func (s *raceStore) StartRunClaimed(ctx context.Context, p chat.StartRun, owner string, ttl time.Duration, spare int) (
	chat.RunStartAck, *chat.Claim, error,
) {
	if s.dead() != nil {
		ack, err := s.Store.StartRun(ctx, p)
		return ack, nil, err
	}
	return s.Store.StartRunClaimed(ctx, p, owner, ttl, spare)
}

func (s *raceStore) RenewLeases(ctx context.Context, leases []chat.Lease, ttl time.Duration) error {
	return s.unlessDead(func() error { return s.Store.RenewLeases(ctx, leases, ttl) })
}

func (s *raceStore) RunInput(ctx context.Context, runID string) (chat.RunInput, error) {
	return valueUnlessDead(s, func() (chat.RunInput, error) { return s.Store.RunInput(ctx, runID) })
}

func (s *raceStore) AppendDeltas(ctx context.Context, lease chat.Lease, messageID string, texts []string) error {
	return s.unlessDead(func() error { return s.Store.AppendDeltas(ctx, lease, messageID, texts) })
}

func (s *raceStore) SetOperationPhase(ctx context.Context, lease chat.Lease, opID, phase, outcome string, needRunning bool) error {
	return s.unlessDead(func() error { return s.Store.SetOperationPhase(ctx, lease, opID, phase, outcome, needRunning) })
}

func (s *raceStore) RecordToolResult(ctx context.Context, lease chat.Lease, opID string, out chat.ToolOutcome) error {
	return s.unlessDead(func() error { return s.Store.RecordToolResult(ctx, lease, opID, out) })
}

func (s *raceStore) MarkCancelling(ctx context.Context, lease chat.Lease, active chat.ActiveOperation) error {
	return s.unlessDead(func() error { return s.Store.MarkCancelling(ctx, lease, active) })
}

func (s *raceStore) Complete(ctx context.Context, lease chat.Lease) error {
	return s.unlessDead(func() error { return s.Store.Complete(ctx, lease) })
}

func (s *raceStore) Fail(ctx context.Context, lease chat.Lease, message string) error {
	return s.unlessDead(func() error { return s.Store.Fail(ctx, lease, message) })
}

func (s *raceStore) Release(ctx context.Context, lease chat.Lease) error {
	return s.unlessDead(func() error { return s.Store.Release(ctx, lease) })
}

func (s *raceStore) FinishCancel(ctx context.Context, runID string, lease *chat.Lease, unbuffered int64) (bool, error) {
	return valueUnlessDead(s, func() (bool, error) { return s.Store.FinishCancel(ctx, runID, lease, unbuffered) })
}

func (s *raceStore) Recover(ctx context.Context, owner string, foreign bool, maxAttempts int) ([]chat.Recovered, error) {
	return valueUnlessDead(s, func() ([]chat.Recovered, error) { return s.Store.Recover(ctx, owner, foreign, maxAttempts) })
}

// raceRetention is the store's retention behind a raceStore's crash
// switch: a dead process purges nothing.
type raceRetention struct {
	engine.Retention
	rs *raceStore
}

func (r raceRetention) PurgeStream(ctx context.Context, before time.Time) (int64, error) {
	return valueUnlessDead(r.rs, func() (int64, error) { return r.Retention.PurgeStream(ctx, before) })
}

func (r raceRetention) PurgeEvents(ctx context.Context, before time.Time) (int64, error) {
	return valueUnlessDead(r.rs, func() (int64, error) { return r.Retention.PurgeEvents(ctx, before) })
}

func (r raceRetention) PurgeCancelAudit(ctx context.Context, before time.Time) (int64, error) {
	return valueUnlessDead(r.rs, func() (int64, error) { return r.Retention.PurgeCancelAudit(ctx, before) })
}

func (r raceRetention) RedactDeletedDrafts(ctx context.Context, before time.Time) (int64, error) {
	return valueUnlessDead(r.rs, func() (int64, error) { return r.Retention.RedactDeletedDrafts(ctx, before) })
}

func (r raceRetention) RedactDeletedThreads(ctx context.Context, before time.Time) (int64, error) {
	return valueUnlessDead(r.rs, func() (int64, error) { return r.Retention.RedactDeletedThreads(ctx, before) })
}

func (s *raceStore) AddUsage(ctx context.Context, runID string, u chat.Usage) error {
	return s.unlessDead(func() error { return s.Store.AddUsage(ctx, runID, u) })
}

// startOver starts the harness's engine over store (nil: the real store)
// with an hour's lease, so no maintenance pass settles anything during the
// test: the worker, the cancel or the startup recovery must.
func (h *harness) startOver(store engine.Store) {
	h.t.Helper()
	h.startWith(func(cfg *engine.Config) {
		if store != nil {
			cfg.Store = store
		}
		if rs, ok := store.(*raceStore); ok {
			cfg.Retention = raceRetention{Retention: cfg.Retention, rs: rs}
		}
		cfg.LeaseTTL = time.Hour
	})
}

// allEvents reads the thread's whole committed event log.
func (h *harness) allEvents(threadID string) []*chat.Event {
	h.t.Helper()
	r, err := h.st.Events(context.Background(), chat.LocalUserID, threadID, 0)
	if err != nil || !r.Complete {
		h.t.Fatalf("events = %+v, %v", r, err)
	}
	return r.Events
}

// wantSeqs fails unless evs have strictly increasing, gap-free seqs.
func wantSeqs(t *testing.T, evs []*chat.Event) {
	t.Helper()
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq != evs[i-1].Seq+1 {
			t.Fatalf("seq %d follows seq %d", evs[i].Seq, evs[i-1].Seq)
		}
	}
}

func typesOf(evs []*chat.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// TestRaceScenario1_LastDeltaOnTheWire: a cancel is recorded while the last
// message.delta is already committed and on its way to the client, just
// before the worker publishes the message; the publish loses, so the
// protocol never publishes that text, and nothing streams after the cancel.
func TestRaceScenario1_LastDeltaOnTheWire(t *testing.T) {
	m := newScripted(words, true)
	h := newHarness(t, m)
	snap, sub := h.watchedThread()
	var cancelled atomic.Bool
	rs := &raceStore{Store: h.st}
	rs.beforePublish = func(runID string, out chat.StepOutput) {
		// Every delta is committed (the model reached EOF); the message is
		// not published yet. The cancel lands here, from the worker's own
		// goroutine, so the ordering is exact.
		if cancelled.CompareAndSwap(false, true) {
			ack, err := h.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: runID,
				Reason: chat.ReasonUserRequested, RequestedBy: "tab:a"})
			if err != nil || ack.Status != chat.RunCancelRequested || ack.AlreadyRequested {
				t.Errorf("cancel = %+v, %v", ack, err)
			}
		}
	}
	h.startOver(rs)
	ack, err := h.eng.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID,
		ExpectedStateVersion: snap.StateVersion, UserMessage: ptr("hello")})
	if err != nil {
		t.Fatal(err)
	}
	m.release(t, len(words)) // the whole reply, to its last delta
	var live []*chat.Event
	waitFor(t, sub, "run.cancelled", func(ev *chat.Event) bool {
		live = append(live, ev)
		return ev.Type == chat.EventRunCancelled && ev.RunID == ack.RunID
	})
	if !cancelled.Load() {
		t.Fatal("the worker never reached its publish")
	}

	full := strings.Join(words, " ")
	evs := h.allEvents(snap.ThreadID)
	wantSeqs(t, evs)
	cancelAt := slices.IndexFunc(evs, func(ev *chat.Event) bool { return ev.Type == chat.EventRunCancelRequested })
	if cancelAt < 0 {
		t.Fatalf("no run.cancel_requested in %v", typesOf(evs))
	}
	var streamed strings.Builder
	for i, ev := range live {
		switch ev.Type {
		case chat.EventMessagePublished:
			if msg := ev.Body.(chat.MessagePublishedBody).Message; msg.Role != chat.RoleUser {
				t.Fatalf("a message was published for a cancelled run: %+v", msg)
			}
		case chat.EventMessageDelta:
			if ev.Seq > evs[cancelAt].Seq {
				t.Fatalf("delta seq %d after the cancel (seq %d)", ev.Seq, evs[cancelAt].Seq)
			}
			streamed.WriteString(ev.Body.(chat.MessageDeltaBody).Text)
		}
		if i > 0 && ev.Seq <= live[i-1].Seq {
			t.Fatalf("live seqs out of order: %d after %d", ev.Seq, live[i-1].Seq)
		}
	}
	if streamed.String() != full {
		t.Fatalf("deltas on the wire = %q, want the whole reply %q", streamed.String(), full)
	}
	if got := countType(evs, chat.EventMessagePublished); got != 1 { // the user's message only
		t.Fatalf("%d message.published events, want 1 (the user's)", got)
	}
	body := live[len(live)-1].Body.(chat.RunCancelledBody)
	if body.DiscardedStreamChars != int64(len(full)) {
		t.Errorf("discarded_stream_chars = %d, want %d: the whole streamed reply", body.DiscardedStreamChars, len(full))
	}
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 1 || after.Messages[0].Role != chat.RoleUser || after.ActiveRun != nil {
		t.Fatalf("after the cancel: %+v", after)
	}
	if after.LastRun == nil || after.LastRun.Status != chat.RunCancelled {
		t.Fatalf("last_run = %+v", after.LastRun)
	}
	if r := h.run(ack.RunID); r.Status != chat.RunCancelled || r.RequestedBy == nil || *r.RequestedBy != "tab:a" {
		t.Fatalf("run = %+v", r)
	}
}

// TestRaceScenario2_ToolFinishesBeforeFlagRead: a tool call finishes after
// cancel_requested is written but before the worker reads the flag; its
// result is recorded as a fact, the cancel reports it exactly, and the next
// run reuses it instead of calling the tool again.
func TestRaceScenario2_ToolFinishesBeforeFlagRead(t *testing.T) {
	for _, contract := range []string{tools.Cancellable, tools.Idempotent} {
		t.Run(contract, func(t *testing.T) {
			m, r, e := newRunnerEnv(t, "lookup", contract, true)
			e.startOver(nil)
			ack := e.ask("what is the weather?")
			key := recv(t, r.started, "the tool call")
			// The cancel is written, and only written: the worker is not
			// woken, so it reads the flag at its next read of the run.
			if _, _, err := e.st.RequestCancel(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: ack.RunID,
				Reason: chat.ReasonUserRequested, RequestedBy: "tab:a"}); err != nil {
				t.Fatal(err)
			}
			r.gate.open() // the tool finishes in between
			evs := e.until("run.cancelled", isType(chat.EventRunCancelled, ack.RunID))
			wantReceipt(t, evs[len(evs)-1], chat.OperationOutcome{OperationID: key, Tool: "lookup", Phase: chat.PhaseCompleted, Outcome: chat.OutcomeCompleted})
			if got := publishedRoles(evs); got != "user assistant tool" {
				t.Fatalf("published = %q, want the call step and the tool result", got)
			}
			wantOp(t, e.onlyOp(), chat.PhaseCompleted, chat.OutcomeCompleted)
			e.wantRun(ack.RunID, chat.RunCancelled)
			msgs := e.wantHistory("user assistant tool")
			if res := toolResult(t, msgs[2]); res["answer"] != "sunny" || res["key"] != key {
				t.Fatalf("recorded result = %v", res)
			}
			last := e.snapshot(e.thr.ThreadID).LastRun
			if last == nil || len(last.Operations) != 1 || last.Operations[0].Phase != chat.PhaseCompleted || last.Operations[0].Outcome != chat.OutcomeCompleted {
				t.Fatalf("snapshot last_run = %+v", last)
			}
			before := len(m.calls())

			next := e.resume()
			e.until("run.completed", isType(chat.EventRunCompleted, next.RunID))
			e.wantHistory("user assistant tool assistant")
			if got := r.callCounts(); len(got) != 1 || got[key] != 1 {
				t.Fatalf("tool calls = %v, want the one call", got)
			}
			calls := m.calls()
			if len(calls) != before+1 {
				t.Fatalf("the continue asked the model %d times, want once", len(calls)-before)
			}
			msgsIn := calls[len(calls)-1].Messages
			if tm := msgsIn[len(msgsIn)-1]; tm.Role != "tool" || tm.Call == nil || tm.Call.ID != key || !strings.Contains(tm.Content, "sunny") {
				t.Fatalf("the continue's model input ends with %+v, want the recorded result", tm)
			}
			wantOp(t, e.onlyOp(), chat.PhaseCompleted, chat.OutcomeCompleted)
			wantSeqs(t, e.allEvents(e.thr.ThreadID))
		})
	}
}

// TestRaceScenario3_TwoTabsContinueSameCheckpoint: two tabs continue the
// same checkpoint at the same instant; exactly one gets the new version,
// the other a state_version_conflict that changed nothing, after which it
// forks explicitly and continues there.
func TestRaceScenario3_TwoTabsContinueSameCheckpoint(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, newScripted(words, false))
	snap, sub := h.watchedThread()
	h.start()
	first, err := h.eng.StartRun(ctx, chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, ExpectedStateVersion: snap.StateVersion, UserMessage: ptr("hello")})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, first.RunID))
	base := h.snapshot(snap.ThreadID)

	texts := []string{"from tab A", "from tab B"}
	acks := make([]chat.RunStartAck, 2)
	errs := make([]error, 2)
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i := range texts {
		wg.Go(func() {
			<-ready
			acks[i], errs[i] = h.eng.StartRun(ctx, chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID,
				ExpectedStateVersion: base.StateVersion, ResumeFromCheckpointID: base.HeadCheckpointID, UserMessage: &texts[i]})
		})
	}
	close(ready)
	wg.Wait()
	winner := slices.IndexFunc(errs, func(err error) bool { return err == nil })
	if winner < 0 || errs[1-winner] == nil {
		t.Fatalf("start results = %v, want exactly one success", errs)
	}
	loser := 1 - winner
	wantCode(t, errs[loser], chat.CodeStateVersionConflict)
	if acks[winner].StateVersion <= base.StateVersion {
		t.Fatalf("winner's ack %+v did not move the version past %d", acks[winner], base.StateVersion)
	}
	waitFor(t, sub, "the winner's run.completed", isType(chat.EventRunCompleted, acks[winner].RunID))

	got := h.snapshot(snap.ThreadID)
	if len(got.Messages) != 4 || got.Messages[2].Content != texts[winner] {
		t.Fatalf("history = %+v, want the winner's turn only", got.Messages)
	}
	for _, msg := range got.Messages {
		if msg.Content == texts[loser] {
			t.Fatalf("the refused tab's message is in the thread: %+v", got.Messages)
		}
	}
	evs := h.allEvents(snap.ThreadID)
	wantSeqs(t, evs)
	if n := countType(evs, chat.EventRunStarted); n != 2 {
		t.Fatalf("%d run.started events, want 2 (the first run and the winner's)", n)
	}

	// The refused tab forks from the checkpoint it was on, explicitly.
	fork, err := h.st.Fork(ctx, chat.Fork{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, FromCheckpointID: base.HeadCheckpointID})
	if err != nil {
		t.Fatal(err)
	}
	fsub := h.feed.Subscribe(fork.ThreadID, 4096)
	defer fsub.Close()
	fsnap := h.snapshot(fork.ThreadID)
	if len(fsnap.Messages) != 2 || fsnap.Messages[1].MessageID != base.Messages[1].MessageID {
		t.Fatalf("fork history = %+v, want the checkpoint's", fsnap.Messages)
	}
	fack, err := h.eng.StartRun(ctx, chat.StartRun{UserID: chat.LocalUserID, ThreadID: fork.ThreadID,
		ExpectedStateVersion: fsnap.StateVersion, UserMessage: &texts[loser]})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, fsub, "the fork's run.completed", isType(chat.EventRunCompleted, fack.RunID))
	if fm := h.snapshot(fork.ThreadID).Messages; len(fm) != 4 || fm[2].Content != texts[loser] {
		t.Fatalf("fork history = %+v", fm)
	}
	if again := h.snapshot(snap.ThreadID); again.StateVersion != got.StateVersion || len(again.Messages) != 4 {
		t.Fatalf("the fork changed the original thread: %+v", again)
	}
}

// TestRaceScenario4_DisconnectNeverCancels: a client's connection drops
// mid-run without a cancel; the run goes on and completes, nothing records
// a cancel, and the client's replay from its last seq plus the live events
// after it is exactly the full event sequence.
func TestRaceScenario4_DisconnectNeverCancels(t *testing.T) {
	m := newScripted(words, true)
	h := newHarness(t, m)
	snap := h.thread()
	watch := h.feed.Subscribe(snap.ThreadID, 4096) // the test's own view
	defer watch.Close()
	conn := h.feed.Subscribe(snap.ThreadID, 4096) // the client's connection
	h.start()
	reqCtx, endRequest := context.WithCancel(context.Background())
	ack, err := h.eng.StartRun(reqCtx, chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID,
		ExpectedStateVersion: snap.StateVersion, UserMessage: ptr("hello")})
	if err != nil {
		t.Fatal(err)
	}

	m.release(t, 3)
	var seen []*chat.Event
	deltas := 0
	waitFor(t, conn, "three deltas on the connection", func(ev *chat.Event) bool {
		seen = append(seen, ev)
		if ev.Type == chat.EventMessageDelta {
			deltas++
		}
		return deltas == 3
	})
	// The connection drops: its subscription and its request both end.
	conn.Close()
	endRequest()
	lastSeq := seen[len(seen)-1].Seq

	// The run goes on while the client is away.
	m.release(t, 3)
	deltas = 0
	waitFor(t, watch, "six deltas", func(ev *chat.Event) bool {
		if ev.Type == chat.EventMessageDelta {
			deltas++
		}
		return deltas == 6
	})

	// The client returns: live events first, then what it missed.
	back := h.feed.Subscribe(snap.ThreadID, 4096)
	defer back.Close()
	replay, err := h.st.Events(context.Background(), chat.LocalUserID, snap.ThreadID, lastSeq)
	if err != nil || !replay.Complete {
		t.Fatalf("replay = %+v, %v", replay, err)
	}
	if r := h.run(ack.RunID); r.Status != chat.RunRunning {
		t.Fatalf("on return the run is %s, want running", r.Status)
	}
	m.release(t, len(words)-6)
	got := slices.Clone(seen)
	got = append(got, replay.Events...)
	waitFor(t, back, "run.completed", func(ev *chat.Event) bool {
		if ev.Seq > replay.LastSeq {
			got = append(got, ev)
		}
		return ev.Type == chat.EventRunCompleted && ev.RunID == ack.RunID
	})

	// The connection opened on the snapshot: it must see everything after it.
	full := h.allEvents(snap.ThreadID)
	full = full[slices.IndexFunc(full, func(ev *chat.Event) bool { return ev.Seq > snap.LastSeq }):]
	wantSeqs(t, got)
	if len(got) != len(full) || got[0].Seq != full[0].Seq || got[len(got)-1].Seq != full[len(full)-1].Seq ||
		!slices.Equal(typesOf(got), typesOf(full)) {
		t.Fatalf("before + replay + live = %v, want the full sequence %v", typesOf(got), typesOf(full))
	}
	for _, typ := range []string{chat.EventRunCancelRequested, chat.EventRunCancelling, chat.EventRunCancelled} {
		if n := countType(full, typ); n != 0 {
			t.Fatalf("%d %s events for a run nobody cancelled", n, typ)
		}
	}
	select {
	case <-m.stopped:
		t.Fatal("the model call was cancelled by the disconnect")
	default:
	}
	r := h.run(ack.RunID)
	if r.Status != chat.RunCompleted || r.RequestedBy != nil || r.DiscardedStreamChars != 0 {
		t.Fatalf("run = %+v", r)
	}
	msgs := h.snapshot(snap.ThreadID).Messages
	if len(msgs) != 2 || msgs[1].Content != strings.Join(words, " ") {
		t.Fatalf("history = %+v", msgs)
	}
}

// TestRaceScenario5_CrashAfterPublishBeforeStatus: the process dies right
// after a step's message is published and before the run's final status is
// written; the restarted engine finds the checkpoint and finishes (text
// step) or resumes from the pending tool step, never regenerating what was
// published nor replaying the dialog.
func TestRaceScenario5_CrashAfterPublishBeforeStatus(t *testing.T) {
	t.Run("text step: finish", func(t *testing.T) {
		ctx := context.Background()
		m := &toolModel{}
		h := newHarness(t, nil)
		h.backend = m
		snap, sub := h.watchedThread()
		rs := &raceStore{Store: h.st}
		var texts atomic.Int32
		rs.afterPublish = func(_ string, out chat.StepOutput) {
			if out.Call == nil && texts.Add(1) == 2 {
				rs.crashed.Store(true) // dies right after the second run's publish committed
			}
		}
		h.startOver(rs)
		// An earlier exchange completes normally: the dialog to not replay.
		a, err := h.eng.StartRun(ctx, chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, ExpectedStateVersion: snap.StateVersion, UserMessage: ptr("first")})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, a.RunID))
		b, err := h.eng.StartRun(ctx, chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, ExpectedStateVersion: h.snapshot(snap.ThreadID).StateVersion, UserMessage: ptr("second")})
		if err != nil {
			t.Fatal(err)
		}
		pub := waitFor(t, sub, "the second reply's message.published", func(ev *chat.Event) bool {
			return ev.Type == chat.EventMessagePublished && ev.RunID == b.RunID && ev.Body.(chat.MessagePublishedBody).Message.Role == chat.RoleAssistant
		})
		h.stop() // the dead process's goroutines end; it wrote nothing more
		if !rs.crashed.Load() {
			t.Fatal("the crash switch never fired")
		}
		if r := h.run(b.RunID); r.Status != chat.RunRunning {
			t.Fatalf("after the crash the run is %s, want running (no final status)", r.Status)
		}
		asked := len(m.calls())

		h.startOver(nil) // the restart: recovery runs first
		waitFor(t, sub, "run.completed after recovery", isType(chat.EventRunCompleted, b.RunID))
		if n := len(m.calls()) - asked; n != 0 {
			t.Fatalf("recovery asked the model %d times for a published step", n)
		}
		r := h.run(b.RunID)
		if r.Status != chat.RunCompleted || r.Attempt != 1 || r.DiscardedStreamChars != 0 {
			t.Fatalf("run = %+v, want completed at attempt 1 with nothing discarded", r)
		}
		msgs := h.snapshot(snap.ThreadID).Messages
		want := pub.Body.(chat.MessagePublishedBody).Message
		if len(msgs) != 4 || msgs[3].MessageID != want.MessageID || msgs[3].Content != want.Content {
			t.Fatalf("history = %+v, want the reply published before the crash last", msgs)
		}
		evs := h.allEvents(snap.ThreadID)
		wantSeqs(t, evs)
		if n := countType(evs, chat.EventMessagePublished); n != 4 {
			t.Fatalf("%d message.published events, want 4 (nothing published twice)", n)
		}
		if n := countType(evs, chat.EventRunCompleted); n != 2 {
			t.Fatalf("%d run.completed events, want 2", n)
		}
	})

	t.Run("tool call step: resume from the checkpoint", func(t *testing.T) {
		m, r, e := newRunnerEnv(t, "lookup", tools.Idempotent, false)
		rs := &raceStore{Store: e.st}
		rs.afterPublish = func(_ string, out chat.StepOutput) {
			if out.Call != nil {
				rs.crashed.Store(true) // dies after the call step is published, before the tool runs
			}
		}
		e.startOver(rs)
		ack := e.ask("what is the weather?")
		pub := waitFor(t, e.sub, "the call step's message.published", func(ev *chat.Event) bool {
			return ev.Type == chat.EventMessagePublished && ev.Body.(chat.MessagePublishedBody).Message.Role == chat.RoleAssistant
		})
		e.stop()
		if !rs.crashed.Load() {
			t.Fatal("the crash switch never fired")
		}
		e.wantRun(ack.RunID, chat.RunRunning)
		if n := len(r.callCounts()); n != 0 {
			t.Fatalf("the tool ran %d times before the crash", n)
		}
		asked := len(m.calls())

		e.startOver(nil)
		e.until("run.completed after recovery", isType(chat.EventRunCompleted, ack.RunID))
		msgs := e.wantHistory("user assistant tool assistant")
		if msgs[1].MessageID != pub.Body.(chat.MessagePublishedBody).Message.MessageID {
			t.Fatalf("the call step was published again: %+v", msgs)
		}
		op := e.onlyOp()
		wantOp(t, op, chat.PhaseCompleted, chat.OutcomeCompleted)
		if got := r.callCounts(); len(got) != 1 || got[op.OperationID] != 1 {
			t.Fatalf("tool calls = %v, want one", got)
		}
		calls := m.calls()[asked:]
		if len(calls) != 1 {
			t.Fatalf("recovery asked the model %d times, want once (for the answer)", len(calls))
		}
		if last := calls[0].Messages[len(calls[0].Messages)-1]; last.Role != "tool" {
			t.Fatalf("recovery's model input ends with %+v, want the tool result (not the user turn again)", last)
		}
		wantSeqs(t, e.allEvents(e.thr.ThreadID))
	})
}
