package app_test

// The email tool and its embedded email provider's faults, in-process: a
// provider whose answer is lost. The key is accepted once, the operation
// is reconciled as committed, and the run completes. (A process that dies
// during the commit is tested in the root package, through the binary;
// it has these helpers too.)

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// eventOperation is the operation of a tool.* event.
func eventOperation(t testing.TB, ev client.Event) chat.Operation {
	t.Helper()
	b, ok := ev.Body.(*chat.ToolBody)
	if !ok || b.Operation.OperationID == "" {
		t.Fatalf("%s without an operation: %s", ev.Type, ev.Raw)
	}
	return b.Operation
}

// askEmail starts a run asking for an email and waits until it waits for
// the decision; it returns the run id and the prepared operation.
func askEmail(s *apptest.Server, evs *apptest.Stream, threadID string, expected int64, text string) (string, chat.Operation) {
	s.T.Helper()
	runID, op := askConsequential(s, evs, threadID, expected, text, "send_email")
	if !strings.HasPrefix(*op.IdempotencyKey, "email:step-") || !strings.HasSuffix(*op.IdempotencyKey, ":send") {
		s.T.Fatalf("prepared operation %+v", op)
	}
	return runID, op
}

// askConsequential starts a run whose request makes the model call the
// consequential tool, and waits until the run waits for the decision; it
// returns the run id and the prepared operation.
func askConsequential(s *apptest.Server, evs *apptest.Stream, threadID string, expected int64, text, tool string) (string, chat.Operation) {
	s.T.Helper()
	t := s.T
	started := s.StartRun(threadID, expected, text)
	deadline := time.Now().Add(20 * time.Second)
	var op *chat.Operation
	evs.WaitFor(deadline, "run.waiting_confirmation", func(ev client.Event) bool {
		if ev.RunID != started.RunID {
			return false
		}
		switch ev.Type {
		case chat.EventToolPrepared:
			o := eventOperation(t, ev)
			op = &o
		case chat.EventRunCompleted, chat.EventRunFailed, chat.EventRunCancelled:
			t.Fatalf("run %s ended before asking for a confirmation: %s", started.RunID, ev.Raw)
		}
		return ev.Type == chat.EventRunWaitingConfirmation
	})
	if op == nil {
		t.Fatalf("run.waiting_confirmation without a tool.prepared")
	}
	if op.Tool != tool || op.Phase != "prepared" || op.Contract != "consequential" || op.IdempotencyKey == nil {
		t.Fatalf("prepared operation %+v, want %s prepared, consequential, with a key", op, tool)
	}
	return started.RunID, *op
}

// confirm confirms the operation at the thread's current version.
func confirm(s *apptest.Server, threadID, opID string) {
	s.T.Helper()
	v := s.Snapshot(threadID).StateVersion
	ack, err := s.API().ConfirmTool(context.Background(), opID, v)
	if err != nil {
		s.T.Fatalf("POST /api/operations/%s/confirm: %v", opID, err)
	}
	if ack.OperationID != opID || ack.Phase != "confirmed" || ack.StateVersion != v+1 {
		s.T.Fatalf("confirm ack %+v, want %s confirmed at version %d", ack, opID, v+1)
	}
}

// settled is what the stream showed of a run after its confirmation.
type settled struct {
	phases   []string         // of the operation's tool.updated events
	last     chat.Operation   // the operation as the last tool.updated reported it
	messages []chat.Message   // published by the run
	unknown  []chat.Operation // tool.updated events in phase unknown
}

// waitCompleted reads until run.completed of runID, failing on any other
// end, and collects what happened to opID.
func waitCompleted(t *testing.T, evs *apptest.Stream, runID, opID string) settled {
	t.Helper()
	var out settled
	evs.WaitFor(time.Now().Add(30*time.Second), "run.completed "+runID, func(ev client.Event) bool {
		switch {
		case ev.Type == chat.EventToolUpdated:
			if op := eventOperation(t, ev); op.OperationID == opID {
				out.phases = append(out.phases, op.Phase)
				out.last = op
				if op.Phase == "unknown" {
					out.unknown = append(out.unknown, op)
				}
			}
		case ev.Type == chat.EventMessagePublished && ev.RunID == runID:
			out.messages = append(out.messages, ev.Published().Message)
		case ev.RunID == runID && (ev.Type == chat.EventRunFailed || ev.Type == chat.EventRunCancelled):
			t.Fatalf("run %s ended %s: %s", runID, ev.Type, ev.Raw)
		}
		return ev.Type == chat.EventRunCompleted && ev.RunID == runID
	})
	return out
}

// checkSent checks the end of a sent email: the operation reconciled as
// committed, the provider's result published as a tool message naming the
// key, then the model's answer; and the stored state says the same.
func checkSent(t *testing.T, srv *apptest.Server, got settled, threadID, runID string, op chat.Operation) {
	t.Helper()
	if got.last.Phase != "reconciled" || got.last.Outcome == nil || *got.last.Outcome != "committed" || got.last.ResultRef == nil {
		t.Fatalf("operation after the restart/reconciliation: %+v, want reconciled with outcome committed", got.last)
	}
	var roles []string
	for _, m := range got.messages {
		roles = append(roles, m.Role)
	}
	if !slices.Equal(roles, []string{"tool", "assistant"}) {
		t.Fatalf("published after the confirmation: %v, want a tool message and an answer", roles)
	}
	tool := got.messages[0]
	var rec struct {
		Tool        string `json:"tool"`
		OperationID string `json:"operation_id"`
		Result      struct {
			Status     string `json:"status"`
			ProviderID string `json:"provider_id"`
			Key        string `json:"key"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(tool.Content), &rec); err != nil || rec.Tool != "send_email" || rec.OperationID != op.OperationID ||
		rec.Result.Status != "committed" || rec.Result.Key != *op.IdempotencyKey || !strings.HasPrefix(rec.Result.ProviderID, "prov_") {
		t.Errorf("tool message %q (%v)", tool.Content, err)
	}
	if tool.MessageID != *got.last.ResultRef {
		t.Errorf("result_ref %s, tool message %s", *got.last.ResultRef, tool.MessageID)
	}
	if answer := got.messages[1].Content; !strings.Contains(answer, "handed to the provider") || !strings.Contains(answer, rec.Result.ProviderID) {
		t.Errorf("the model's answer %q does not report the send", answer)
	}
	ops, err := srv.API().Operations(context.Background(), threadID)
	if err != nil {
		t.Fatalf("GET /api/threads/%s/operations: %v", threadID, err)
	}
	if len(ops) != 1 || ops[0].Phase != "reconciled" || ops[0].Outcome == nil || *ops[0].Outcome != "committed" {
		t.Errorf("GET operations %+v, want the one operation reconciled / committed", ops)
	}
	if r := srv.Run(runID); r.Status != "completed" {
		t.Errorf("run %+v, want completed", r)
	}
	snap := srv.Snapshot(threadID)
	var hist []string
	for _, m := range snap.Messages {
		hist = append(hist, m.Role)
	}
	if !slices.Equal(hist, []string{"user", "assistant", "tool", "assistant"}) || snap.ActiveRun != nil {
		t.Errorf("history %v, active_run %+v", hist, snap.ActiveRun)
	}
}

// wantOneAcceptance requires that the provider accepted key exactly once
// and, over all calls, saw it exactly calls times.
func wantOneAcceptance(t *testing.T, path, key string, calls int) {
	t.Helper()
	db := auditDB(t, path)
	defer db.Close()
	if n := queryValue[int](t, db, `SELECT COUNT(*) FROM outbox_attempts WHERE result = 'accepted' AND idempotency_key = ?`, key); n != 1 {
		t.Errorf("the provider accepted %s %d times, want 1", key, n)
	}
	if n := queryValue[int](t, db, `SELECT COUNT(*) FROM outbox_attempts WHERE idempotency_key = ?`, key); n != calls {
		t.Errorf("the provider saw %d calls for %s, want %d", n, key, calls)
	}
	if n := queryValue[int](t, db, `SELECT COUNT(*) FROM outbox_attempts WHERE result = 'accepted'`); n != 1 {
		t.Errorf("%d acceptances in all, want 1", n)
	}
}

// TestBinaryToolsLostAnswer: the provider accepts the key but its answer
// is lost: the operation is reported unknown, then reconciled as committed
// by its key, with one acceptance.
func TestBinaryToolsLostAnswer(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg := apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.OutboxFault, cfg.OutboxLatency = "accept-then-timeout", 50*time.Millisecond
	srv := apptest.Start(t, cfg)
	thread := srv.CreateThread()
	tid := thread.ThreadID
	evs := srv.Events(tid, thread.LastSeq)
	runID, op := askEmail(srv, evs, tid, thread.StateVersion, "Send an email to bob@example.com about the lost parcel")

	confirm(srv, tid, op.OperationID)
	got := waitCompleted(t, evs, runID, op.OperationID)
	if !slices.Equal(got.phases, []string{"confirmed", "committing", "unknown", "reconciled"}) {
		t.Errorf("tool.updated phases %v, want confirmed committing unknown reconciled", got.phases)
	}
	for _, u := range got.unknown {
		if u.Outcome == nil || *u.Outcome != "unknown" {
			t.Errorf("phase unknown reported outcome %v, want unknown", u.Outcome)
		}
	}
	checkSent(t, srv, got, tid, runID, op)
	evs.Close()
	srv.Stop()

	wantOneAcceptance(t, db, *op.IdempotencyKey, 1)
	checkDB(t, db)
}
