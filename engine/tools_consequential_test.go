// Runs that call consequential tools: confirm and reject, cancels while the
// run waits, before and during a commit, lost provider answers and their
// reconciliation, and a crash during a commit.

package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/tools"
)

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
