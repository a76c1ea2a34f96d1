package store_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/internal/pgtest"
	"github.com/honestcancel/gateway/store"
)

// claimOnly claims, as owner, the one run that is claimable and returns
// its claim.
func claimOnly(t *testing.T, st *store.Store, owner, runID string, ttl time.Duration) *chat.Claim {
	t.Helper()
	c, err := st.Claim(ctx, owner, ttl)
	if err != nil || c == nil || c.Run.RunID != runID {
		t.Fatalf("claim = %+v, %v; want run %s", c, err, runID)
	}
	return c
}

// wantFenced requires err to refuse a write of a lease that is no longer
// the run's current one.
func wantFenced(t *testing.T, what string, err error) {
	t.Helper()
	var nr *chat.ErrNotRunning
	if !errors.As(err, &nr) || !nr.Fenced {
		t.Fatalf("%s with a superseded lease = %v, want a fenced *chat.ErrNotRunning", what, err)
	}
}

// A run claimed again by the same process (the first execution stalled
// past its lease, recovery re-queued the run) is held by the new claim
// only: every write of the old execution is refused, whatever it is, and
// the new one's pass. Before leases had epochs, both executions passed
// every check (the lease named only the process) and one step was
// published twice.
func TestClaimsFenceEachOther(t *testing.T) {
	st, _ := open(t)
	th, runID := newThreadWithRun(t, st, "hi")
	old := claimOnly(t, st, "w", runID, time.Hour)
	if old.Lease.Epoch != 1 {
		t.Fatalf("a run's first claim has epoch %d, want 1 (leaseW relies on it)", old.Lease.Epoch)
	}
	step := pendingStep(t, st, runID)
	if err := st.AppendDeltas(ctx, old.Lease, "msg_old", []string{"stale "}); err != nil {
		t.Fatal(err)
	}
	// The lease runs out (its last renewal set it to end a second ago: the
	// execution stalled): recovery, by the same owner's process, re-queues
	// the run; the same owner claims it again.
	if err := st.RenewLeases(ctx, []chat.Lease{old.Lease}, -time.Second); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Recover(ctx, "w", false, 3); err != nil || len(got) != 1 || got[0].Action != "requeued" {
		t.Fatalf("recover = %+v, %v; want the run re-queued", got, err)
	}
	cur := claimOnly(t, st, "w", runID, time.Hour)
	if cur.Lease.Epoch <= old.Lease.Epoch || cur.Lease.Owner != old.Lease.Owner {
		t.Fatalf("leases %+v then %+v: the new claim must take a higher epoch", old.Lease, cur.Lease)
	}

	out := chat.StepOutput{Step: step, MessageID: "msg_old", Kind: chat.KindText, Content: "stale "}
	wantFenced(t, "AppendDeltas", st.AppendDeltas(ctx, old.Lease, "msg_old", []string{"more"}))
	wantFenced(t, "PublishStep", st.PublishStep(ctx, old.Lease, out))
	wantFenced(t, "Complete", st.Complete(ctx, old.Lease))
	wantFenced(t, "Fail", st.Fail(ctx, old.Lease, "x"))
	wantFenced(t, "Release", st.Release(ctx, old.Lease))
	wantFenced(t, "MarkCancelling", st.MarkCancelling(ctx, old.Lease, chat.ActiveOperation{Kind: "model_generation"}))
	_, err := st.FinishCancel(ctx, runID, &old.Lease, 0)
	wantFenced(t, "FinishCancel", err)
	// Renewing the old lease renews nothing: it never comes back.
	if err := st.RenewLeases(ctx, []chat.Lease{old.Lease}, 10*time.Hour); err != nil {
		t.Fatal(err)
	}
	wantFenced(t, "AppendDeltas after renewing", st.AppendDeltas(ctx, old.Lease, "msg_old", []string{"more"}))

	// The current execution publishes once.
	if err := st.AppendDeltas(ctx, cur.Lease, "msg_new", []string{"fresh"}); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishStep(ctx, cur.Lease, chat.StepOutput{Step: step, MessageID: "msg_new", Kind: chat.KindText, Content: "fresh"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, cur.Lease); err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(snap.Messages); n != 2 || snap.Messages[1].MessageID != "msg_new" {
		t.Fatalf("history = %+v, want the question and the current execution's answer", snap.Messages)
	}
}

// Tool operations are fenced the same way: a superseded execution can
// neither move an operation nor record its result.
func TestOperationWritesAreFenced(t *testing.T) {
	st, _ := open(t)
	_, runID := newThreadWithRun(t, st, "search")
	first := claimOnly(t, st, "w", runID, time.Hour)
	opID := chat.NewID(chat.PrefixOperation)
	if err := st.PublishStep(ctx, first.Lease, chat.StepOutput{Step: pendingStep(t, st, runID),
		Call: &chat.ToolCall{OperationID: opID, Tool: "catalog_search", Contract: "idempotent", Args: json.RawMessage(`{}`), IdempotencyKey: opID}}); err != nil {
		t.Fatal(err)
	}
	// Shut down mid-tool: handed back, claimed again.
	if err := st.Release(ctx, first.Lease); err != nil {
		t.Fatal(err)
	}
	second := claimOnly(t, st, "w", runID, time.Hour)
	result := chat.ToolOutcome{Phase: chat.PhaseCompleted, Outcome: chat.OutcomeCompleted, Result: json.RawMessage(`{"items":[]}`)}
	wantFenced(t, "SetOperationPhase", st.SetOperationPhase(ctx, first.Lease, opID, chat.PhaseAborted, chat.OutcomeAborted, false))
	wantFenced(t, "RecordToolResult", st.RecordToolResult(ctx, first.Lease, opID, result))
	if err := st.RecordToolResult(ctx, second.Lease, opID, result); err != nil {
		t.Fatal(err)
	}
	// Recorded once: the same result again is a step no longer pending.
	if err := st.RecordToolResult(ctx, second.Lease, opID, result); !errors.Is(err, chat.ErrStepNotPending) {
		t.Fatalf("a second result of one call = %v, want chat.ErrStepNotPending", err)
	}
	if err := st.Fail(ctx, second.Lease, "stop here"); err != nil {
		t.Fatal(err)
	}
}

// PublishStep publishes only the step the thread waits on: the same step
// published again (by any execution), or a step the thread no longer
// waits on, is refused, so no step is published twice (invariant 9).
func TestPublishStepRefusesAStepNoLongerPending(t *testing.T) {
	st, _ := open(t)
	_, runID := newThreadWithRun(t, st, "hi")
	c := claimOnly(t, st, "w", runID, time.Hour)
	step := pendingStep(t, st, runID)
	// A tool call: the thread then waits on the tool step, not on this
	// generate step.
	opID := chat.NewID(chat.PrefixOperation)
	call := &chat.ToolCall{OperationID: opID, Tool: "catalog_search", Contract: "idempotent", Args: json.RawMessage(`{}`), IdempotencyKey: opID}
	if err := st.PublishStep(ctx, c.Lease, chat.StepOutput{Step: step, Call: call}); err != nil {
		t.Fatal(err)
	}
	again := chat.StepOutput{Step: step, MessageID: "msg_dup", Kind: chat.KindText, Content: "twice"}
	if err := st.PublishStep(ctx, c.Lease, again); !errors.Is(err, chat.ErrStepNotPending) {
		t.Fatalf("the same step published again = %v, want chat.ErrStepNotPending", err)
	}
	wrong := chat.StepOutput{Step: chat.Pending{Step: chat.StepGenerate, InputHash: "sha256:other"}, MessageID: "msg_x", Kind: chat.KindText, Content: "x"}
	if err := st.PublishStep(ctx, c.Lease, wrong); !errors.Is(err, chat.ErrStepNotPending) {
		t.Fatalf("a step the thread never waited on = %v, want chat.ErrStepNotPending", err)
	}
	if err := st.Fail(ctx, c.Lease, "stop"); err != nil {
		t.Fatal(err)
	}
}

// Recovery reads whether a run's last step was published from the run's
// own checkpoints, not from the thread's head: a saved fragment or a
// deleted draft on top of the published answer (a checkpoint with no run)
// must not make recovery run the step again. (It did: the run was
// re-queued, its answer generated and published a second time.)
func TestRecoveryReadsTheRunsOwnRecords(t *testing.T) {
	for _, userStep := range []string{"fragment saved", "draft deleted"} {
		t.Run(userStep, func(t *testing.T) {
			st, _ := open(t)
			th := newThread(t, st)
			// A draft to delete later: a cancelled run's saved fragment.
			runA, streamed, lastDelta := streamAndCancel(t, st, th.ThreadID, th.StateVersion, "kept", " text")
			_ = runA
			draft := saveDraft(t, st, th.ThreadID, streamed, lastDelta)

			runID := startRun(t, st, th.ThreadID, version(t, st, th.ThreadID), "again")
			c := claimOnly(t, st, "dead", runID, time.Hour)
			msgID := chat.NewID(chat.PrefixMessage)
			if err := st.AppendDeltas(ctx, c.Lease, msgID, []string{"the", " answer"}); err != nil {
				t.Fatal(err)
			}
			if err := st.PublishStep(ctx, c.Lease, chat.StepOutput{Step: pendingStep(t, st, runID), MessageID: msgID, Kind: chat.KindText, Content: "the answer"}); err != nil {
				t.Fatal(err)
			}
			// The process dies before Complete; meanwhile a user checkpoint
			// lands on top.
			switch userStep {
			case "fragment saved":
				snap, err := st.Snapshot(ctx, user, th.ThreadID)
				if err != nil {
					t.Fatal(err)
				}
				saveDraft(t, st, th.ThreadID, msgID, snap.LastSeq-2) // the answer's deltas precede its publish events
			case "draft deleted":
				deleteDraft(t, st, th.ThreadID, draft.MessageID)
			}
			got, err := st.Recover(ctx, "new-process", true, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].RunID != runID || got[0].Action != "completed" {
				t.Fatalf("recover = %+v; want run %s completed (its last step was published)", got, runID)
			}
			r, err := st.Run(ctx, user, runID)
			if err != nil || r.Status != chat.RunCompleted || r.Attempt != 1 {
				t.Fatalf("run = %+v, %v; want completed at attempt 1", r, err)
			}
		})
	}
}

// On PostgreSQL leases are granted and judged by the database's clock: an
// instance whose own clock runs 30 s ahead takes no run whose owner is
// alive, and one whose clock runs behind still takes a run whose owner
// died. (Judged by each instance's own clock, the first took every live
// run it saw.)
func TestLeasesFollowTheDatabaseClock(t *testing.T) {
	dsn := postgresDSN(t)
	open := func(skew time.Duration) *store.Store {
		st, err := store.Open(ctx, dsn, store.Options{Clock: func() time.Time { return time.Now().Add(skew) }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	owner, ahead, behind := open(0), open(30*time.Second), open(-30*time.Second)
	_, runID := newThreadWithRun(t, owner, "hi")
	c := claimOnly(t, owner, "alive", runID, 15*time.Second)
	if got, err := ahead.Recover(ctx, "ahead", false, 3); err != nil || len(got) != 0 {
		t.Fatalf("an instance 30 s ahead recovered %+v, %v: it took a live run", got, err)
	}
	if err := owner.AppendDeltas(ctx, c.Lease, "msg_a", []string{"still mine"}); err != nil {
		t.Fatalf("the owner lost its run: %v", err)
	}
	// The owner dies: its last renewal set the lease to end a second ago
	// by the database's clock, and an instance 30 s behind takes the run
	// over anyway.
	if err := owner.RenewLeases(ctx, []chat.Lease{c.Lease}, -time.Second); err != nil {
		t.Fatal(err)
	}
	if got, err := behind.Recover(ctx, "behind", false, 3); err != nil || len(got) != 1 || got[0].Action != "requeued" {
		t.Fatalf("an instance 30 s behind did not take over the expired run: %+v, %v", got, err)
	}
	wantFenced(t, "the dead owner's write", owner.AppendDeltas(ctx, c.Lease, "msg_a", []string{"late"}))
}

// ClaimBatch takes up to max claimable runs, oldest first, each once, in
// one transaction, each with its own new lease.
// TestClaimReadsOnlyUnleasedRuns: the query by which a claim picks its run
// walks runs_unleased (runs without a lease that are not over), not every
// run of a status. Through runs_by_status it read every streaming run on
// every claim, which cost the single writer half a millisecond a claim
// with 500 runs streaming. (SQLite: PostgreSQL's planner decides by its
// statistics.)
func TestClaimReadsOnlyUnleasedRuns(t *testing.T) {
	if onPostgres() {
		t.Skip("SQLite's query plan; PostgreSQL chooses by its statistics")
	}
	_, dsn := open(t) // migrated
	for name, query := range map[string]string{"without a share": store.ClaimCandidate, "with a user's share": store.ClaimCandidateShared} {
		rows, err := rawDB(t, dsn).Query(`EXPLAIN QUERY PLAN ` + query)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if len(plan) == 0 || plan[0] != "SCAN runs USING INDEX runs_unleased" {
			t.Errorf("the claim's plan %s = %q, want it to start with a scan of runs_unleased", name, plan)
		}
	}
}

func TestClaimBatchTakesTheOldestOnce(t *testing.T) {
	st, _ := open(t)
	var runs []string
	for range 5 {
		_, runID := newThreadWithRun(t, st, "go")
		runs = append(runs, runID)
	}
	// On PostgreSQL a batch is one run (see ClaimBatch).
	per := 3
	if pgtest.OnPostgres() {
		per = 1
	}
	if got := st.ClaimsPerTransaction(); got < per || (pgtest.OnPostgres() && got != 1) {
		t.Fatalf("ClaimsPerTransaction = %d: the engine would ask for more than a claim gives, and wait for a wake-up for the rest", got)
	}
	var claims []*chat.Claim
	for len(claims) < 5 {
		batch, err := st.ClaimBatch(ctx, "w", time.Hour, 3)
		if err != nil || len(batch) != min(per, 5-len(claims)) {
			t.Fatalf("ClaimBatch(3) after %d claims: %d claims, %v; want %d", len(claims), len(batch), err, min(per, 5-len(claims)))
		}
		claims = append(claims, batch...)
	}
	var got []string
	for _, c := range claims {
		if c.Lease.RunID != c.Run.RunID || c.Lease.Owner != "w" || c.Lease.Epoch != 1 || c.Run.Status != chat.RunRunning {
			t.Errorf("claim %+v: want run running under w's first lease", c)
		}
		got = append(got, c.Run.RunID)
	}
	if strings.Join(got, ",") != strings.Join(runs, ",") {
		t.Errorf("claimed %v, want the runs oldest first %v", got, runs)
	}
	if none, err := st.ClaimBatch(ctx, "w", time.Hour, 4); err != nil || len(none) != 0 {
		t.Errorf("ClaimBatch with nothing claimable: %d, %v", len(none), err)
	}
}
