package store_test

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
	"github.com/honestcancel/gateway/tools/email"
)

// committingRun leaves a run whose confirmed email is being committed
// (committing) under the returned lease.
func committingRun(t *testing.T, st *store.Store, threadID string) (chat.Lease, string) {
	t.Helper()
	runID := startRun(t, st, threadID, version(t, st, threadID), "send it")
	c := claimOnly(t, st, "w", runID, time.Hour)
	opID := chat.NewID(chat.PrefixOperation)
	if err := st.PublishStep(ctx, c.Lease, chat.StepOutput{Step: pendingStep(t, st, runID), MessageID: chat.NewID(chat.PrefixMessage),
		Kind: chat.KindText, Content: "I will send this.",
		Call: &chat.ToolCall{OperationID: opID, Tool: "send_email", Contract: "consequential", Args: json.RawMessage(`{"to":"a@example.com"}`),
			Preview: json.RawMessage(`{"to":"a@example.com"}`), IdempotencyKey: "email:" + opID}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DecideOperation(ctx, chat.Decide{UserID: user, OperationID: opID, ExpectedStateVersion: version(t, st, threadID), Confirm: true}); err != nil {
		t.Fatal(err)
	}
	c = claimOnly(t, st, "w", runID, time.Hour)
	if err := st.SetOperationPhase(ctx, c.Lease, opID, chat.PhaseCommitting, "", true); err != nil {
		t.Fatal(err)
	}
	return c.Lease, opID
}

// openWithClock opens a store (checked at the end) whose clock is the
// returned one, in milliseconds since the epoch, starting now: the test
// moves it. The store appends every event it commits to events; horizon is
// its ReconcileHorizon (0: the default).
func openWithClock(t *testing.T, horizon time.Duration, events *[]*chat.Event) (*store.Store, *atomic.Int64) {
	t.Helper()
	clock := new(atomic.Int64)
	clock.Store(time.Now().UnixMilli())
	st, _ := openStoreWith(t, true, store.Options{
		Clock:            func() time.Time { return time.UnixMilli(clock.Load()) },
		ReconcileHorizon: horizon,
		OnCommit:         func(evs []*chat.Event) { *events = append(*events, evs...) },
	})
	return st, clock
}

func operation(t *testing.T, st *store.Store, opID string) chat.Operation {
	t.Helper()
	op, err := st.Operation(ctx, user, opID)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// A run that fails while its call may have reached the provider never
// leaves the call committing with nobody to settle it: the outcome
// becomes unknown and is reconciled from then on. (It stayed committing,
// reconciled never.)
func TestFailedRunLeavesNoCallInFlight(t *testing.T) {
	st, _ := open(t)
	th := newThread(t, st).ThreadID
	lease, opID := committingRun(t, st, th)
	if err := st.Fail(ctx, lease, "the tool is not configured any more"); err != nil {
		t.Fatal(err)
	}
	op := operation(t, st, opID)
	if op.Phase != chat.PhaseUnknown || op.Outcome == nil || *op.Outcome != chat.OutcomeUnknown {
		t.Fatalf("operation after the run failed = %s/%v, want unknown/unknown", op.Phase, op.Outcome)
	}
	if op.ReconcileNextAt == nil || op.ReconcileUntil == nil {
		t.Fatalf("the unknown outcome is not scheduled for reconciliation: %+v", op)
	}
	due, err := st.DueReconciliations(ctx, 10)
	if err != nil || len(due) != 0 {
		t.Fatalf("due at once = %+v, %v; the first lookup waits a second", due, err)
	}
}

// A cancel of a run whose commit nobody could settle (its worker failed,
// its tool is gone) ends the run cancelled with the outcome unknown and
// reconciled from then on. (Finishing refused, so the run was handed to a
// worker again and again, and the cancel never ended.)
func TestCancelWithACommitNobodySettledEnds(t *testing.T) {
	st, _ := open(t)
	th := newThread(t, st).ThreadID
	lease, opID := committingRun(t, st, th)
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: lease.RunID, Reason: "user_requested", RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	if done, err := st.FinishCancel(ctx, lease.RunID, &lease, 0); err != nil || !done {
		t.Fatalf("finish cancel = %v, %v", done, err)
	}
	r, err := st.Run(ctx, user, lease.RunID)
	if err != nil || r.Status != chat.RunCancelled {
		t.Fatalf("run = %+v, %v", r, err)
	}
	op := operation(t, st, opID)
	if op.Phase != chat.PhaseUnknown || op.ReconcileNextAt == nil {
		t.Fatalf("operation = %s, next lookup %v; want unknown and reconciled", op.Phase, op.ReconcileNextAt)
	}
}

// The reconciler's schedule: a lookup is handed out once it is due and
// not again while it is being made; a key the provider knows settles the
// outcome (tool.updated, after the run ended too); one it does not know
// is asked again later, with backoff, until the horizon — then the
// gateway stops asking and says so.
func TestReconciliationSchedule(t *testing.T) {
	var events []*chat.Event
	st, clock := openWithClock(t, time.Minute, &events)
	th := newThread(t, st).ThreadID
	lease, opID := committingRun(t, st, th)
	if err := st.Fail(ctx, lease, "stopped"); err != nil {
		t.Fatal(err)
	}
	due := func() []chat.Operation {
		t.Helper()
		ops, err := st.DueReconciliations(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return ops
	}
	clock.Add(1000)
	if got := due(); len(got) != 1 || got[0].OperationID != opID {
		t.Fatalf("due after a second = %+v, want the operation", got)
	}
	if got := due(); len(got) != 0 {
		t.Fatalf("handed out twice: %+v", got)
	}
	// Not known: asked again after 2 s, then 4 s …, no event.
	before := len(events)
	op, err := st.SettleReconciliation(ctx, opID, chat.LookupNotFound)
	if err != nil || op.Phase != chat.PhaseUnknown || op.ReconcileNextAt == nil {
		t.Fatalf("after a lookup that found nothing: %+v, %v", op, err)
	}
	if next := op.ReconcileNextAt.Sub(time.UnixMilli(clock.Load())); next != 2*time.Second {
		t.Fatalf("next lookup in %v, want 2s", next)
	}
	if len(events) != before {
		t.Fatalf("a lookup that changed nothing emitted %d events", len(events)-before)
	}
	// Past the horizon: no next lookup, and the tabs are told.
	for i := 0; op.ReconcileNextAt != nil && i < 20; i++ {
		clock.Store(op.ReconcileNextAt.UnixMilli())
		if got := due(); len(got) != 1 {
			t.Fatalf("lookup %d not handed out when due", i)
		}
		if op, err = st.SettleReconciliation(ctx, opID, chat.LookupNotFound); err != nil {
			t.Fatal(err)
		}
	}
	if op.ReconcileNextAt != nil || op.Phase != chat.PhaseUnknown || op.ReconcileUntil == nil {
		t.Fatalf("after the horizon: %+v, want unknown with no next lookup", op)
	}
	if last := events[len(events)-1]; last.Type != chat.EventToolUpdated || last.Body.(chat.ToolBody).Operation.ReconcileNextAt != nil {
		t.Fatalf("giving up was not reported: last event %s", last.Type)
	}
	if _, err := st.SettleReconciliation(ctx, opID, chat.LookupFound); err != nil {
		t.Fatal(err)
	}
	if got := operation(t, st, opID); got.Phase != chat.PhaseUnknown {
		t.Fatalf("an answer after the gateway gave up asking changed the operation: %s", got.Phase)
	}
}

// A key the provider knows settles the outcome, reported after the run
// ended.
func TestReconciliationFindsTheKey(t *testing.T) {
	var events []*chat.Event
	st, clock := openWithClock(t, 0, &events)
	th := newThread(t, st).ThreadID
	lease, opID := committingRun(t, st, th)
	if err := st.Fail(ctx, lease, "stopped"); err != nil {
		t.Fatal(err)
	}
	clock.Add(1000)
	if got, err := st.DueReconciliations(ctx, 10); err != nil || len(got) != 1 {
		t.Fatalf("due = %+v, %v", got, err)
	}
	// The provider did take the key (the answer was lost): what the lookup
	// finds, and what check compares the committed outcome with.
	outbox, err := email.NewOutbox(st.ServiceDB(), email.OutboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Send(ctx, "email:"+opID, email.Email{To: "a@example.com"}); err != nil {
		t.Fatal(err)
	}
	op, err := st.SettleReconciliation(ctx, opID, chat.LookupFound)
	if err != nil || op.Phase != chat.PhaseReconciled || op.Outcome == nil || *op.Outcome != chat.OutcomeCommitted || op.ReconcileNextAt != nil {
		t.Fatalf("after the provider knew the key: %+v, %v", op, err)
	}
	last := events[len(events)-1]
	if last.Type != chat.EventToolUpdated || last.RunID != op.RunID || last.Body.(chat.ToolBody).Operation.Phase != chat.PhaseReconciled {
		t.Fatalf("last event %s %+v, want tool.updated reconciled of the run", last.Type, last.Body)
	}
}

// A system that can never be asked about a key (an MCP server): an
// unknown outcome recorded with NoLookup schedules no lookup and reads as
// given up at once (the tab is told in the same tool.updated); one found
// by the reconciler to be unaskable is given up at its first lookup.
func TestReconciliationOfAnUnaskableSystem(t *testing.T) {
	var events []*chat.Event
	st, clock := openWithClock(t, time.Hour, &events)
	th := newThread(t, st).ThreadID
	lease, opID := committingRun(t, st, th)
	result := json.RawMessage(`{"status":"unknown"}`)
	if err := st.RecordToolResult(ctx, lease, opID, chat.ToolOutcome{Phase: chat.PhaseUnknown, Outcome: chat.OutcomeUnknown, Result: result, NoLookup: true}); err != nil {
		t.Fatal(err)
	}
	op := operation(t, st, opID)
	if op.Phase != chat.PhaseUnknown || op.ReconcileNextAt != nil || op.ReconcileUntil == nil {
		t.Fatalf("recorded with NoLookup: %+v, want unknown, no next lookup, a horizon on record", op)
	}
	var told *chat.Operation
	for _, ev := range events {
		if ev.Type == chat.EventToolUpdated && ev.Body.(chat.ToolBody).Operation.OperationID == opID {
			o := ev.Body.(chat.ToolBody).Operation
			told = &o
		}
	}
	if told == nil || told.Phase != chat.PhaseUnknown || told.ReconcileNextAt != nil || told.ReconcileUntil == nil {
		t.Fatalf("the tabs were told %+v, want unknown and not asked", told)
	}
	clock.Add(time.Hour.Milliseconds())
	if got, err := st.DueReconciliations(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("a lookup was scheduled for a system that cannot be asked: %+v, %v", got, err)
	}

	// Recorded unknown without it (a run that ended mid-commit): the first
	// lookup finds the system cannot be asked, and the gateway gives up.
	th2 := newThread(t, st).ThreadID
	lease2, opID2 := committingRun(t, st, th2)
	if err := st.Fail(ctx, lease2, "stopped"); err != nil {
		t.Fatal(err)
	}
	clock.Add(1000)
	if got, err := st.DueReconciliations(ctx, 10); err != nil || len(got) != 1 || got[0].OperationID != opID2 {
		t.Fatalf("due = %+v, %v", got, err)
	}
	before := len(events)
	op, err := st.SettleReconciliation(ctx, opID2, chat.LookupImpossible)
	if err != nil || op.Phase != chat.PhaseUnknown || op.ReconcileNextAt != nil || op.ReconcileUntil == nil {
		t.Fatalf("after a lookup of an unaskable system: %+v, %v; want unknown, given up", op, err)
	}
	if len(events) != before+1 || events[len(events)-1].Type != chat.EventToolUpdated {
		t.Fatalf("giving up was not reported with one tool.updated: %d events", len(events)-before)
	}
}
