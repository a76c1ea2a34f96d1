package main

// End-to-end tests of the email tool against the real binary and its
// embedded email provider's faults: a process that dies during the commit
// after the provider accepted the key, and a provider whose answer is lost.
// Either way the key is accepted once, the operation is reconciled as
// committed, and the run completes.

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // read the database as an auditor would

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// eventOperation is the operation of a tool.* event.
func eventOperation(t *testing.T, ev client.Event) chat.Operation {
	t.Helper()
	b, ok := ev.Body.(*chat.ToolBody)
	if !ok || b.Operation.OperationID == "" {
		t.Fatalf("%s without an operation: %s", ev.Type, ev.Raw)
	}
	return b.Operation
}

// askEmail starts a run asking for an email and waits until it waits for
// the decision; it returns the run id and the prepared operation.
func (s *server) askEmail(evs *apptest.Stream, threadID string, expected int64, text string) (string, chat.Operation) {
	s.t.Helper()
	runID, op := s.askConsequential(evs, threadID, expected, text, "send_email")
	if !strings.HasPrefix(*op.IdempotencyKey, "email:step-") || !strings.HasSuffix(*op.IdempotencyKey, ":send") {
		s.t.Fatalf("prepared operation %+v", op)
	}
	return runID, op
}

// askConsequential starts a run whose request makes the model call the
// consequential tool, and waits until the run waits for the decision; it
// returns the run id and the prepared operation.
func (s *server) askConsequential(evs *apptest.Stream, threadID string, expected int64, text, tool string) (string, chat.Operation) {
	s.t.Helper()
	t := s.t
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
func (s *server) confirm(threadID, opID string) {
	s.t.Helper()
	v := s.Snapshot(threadID).StateVersion
	ack, err := s.API().ConfirmTool(context.Background(), opID, v)
	if err != nil {
		s.t.Fatalf("POST /api/operations/%s/confirm: %v", opID, err)
	}
	if ack.OperationID != opID || ack.Phase != "confirmed" || ack.StateVersion != v+1 {
		s.t.Fatalf("confirm ack %+v, want %s confirmed at version %d", ack, opID, v+1)
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
func checkSent(t *testing.T, srv *server, got settled, threadID, runID string, op chat.Operation) {
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

// auditDB opens the database read-only, as an auditor would; the caller
// closes it.
func auditDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: path}).EscapedPath()+"?mode=ro&_busy_timeout=5000")
	if err != nil {
		t.Fatalf("open %s read-only: %v", path, err)
	}
	return db
}

// queryValue is the one value q selects, as a T; an error (no row too)
// stops the test.
func queryValue[T any](t *testing.T, db *sql.DB, q string, args ...any) T {
	t.Helper()
	var v T
	if err := db.QueryRow(q, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
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

// TestBinaryToolsCrashDuringCommit: the process dies during the commit,
// after the provider recorded the key and before the gateway heard back.
// Restarted without the fault, the gateway reconciles the operation by its
// key (no second send) and completes the run.
func TestBinaryToolsCrashDuringCommit(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	const pace = "5ms"
	srv := startProcess(t, db, pace, "-outbox-fault", "crash", "-outbox-latency", "50ms")
	thread := srv.CreateThread()
	tid := thread.ThreadID
	evs := srv.Events(tid, thread.LastSeq)
	runID, op := srv.askEmail(evs, tid, thread.StateVersion, "Please send an email to ann@example.com about the signed contract")
	key := *op.IdempotencyKey
	seen := evs.LastSeq()

	srv.confirm(tid, op.OperationID)
	if code := srv.WaitExit(20 * time.Second); code == 0 {
		t.Fatalf("the gateway exited 0 during the commit, want a crash (non-zero)")
	} else {
		t.Logf("the gateway died during the commit with exit code %d", code)
	}
	evs.Close()

	// What the dead process left: the provider holds the key; the
	// operation is committing (the gateway never heard the answer).
	func() {
		audit := auditDB(t, db)
		defer audit.Close()
		if n := queryValue[int](t, audit, `SELECT COUNT(*) FROM outbox_attempts WHERE result = 'accepted' AND idempotency_key = ?`, key); n != 1 {
			t.Fatalf("after the crash the provider accepted %s %d times, want 1 (the crash comes after the acceptance)", key, n)
		}
		if ph := queryValue[string](t, audit, `SELECT phase FROM operations WHERE operation_id = ?`, op.OperationID); ph != "committing" {
			t.Fatalf("after the crash the operation is %s, want committing", ph)
		}
		if st := queryValue[string](t, audit, `SELECT status FROM runs WHERE run_id = ?`, runID); st != "running" {
			t.Fatalf("after the crash the run is %s, want running", st)
		}
	}()
	checkDB(t, db) // the invariants hold even mid-commit

	srv = startProcess(t, db, pace, "-log-level", "debug") // no fault any more
	evs = srv.Events(tid, seen)
	got := waitCompleted(t, evs, runID, op.OperationID)
	if !slices.Equal(got.phases, []string{"confirmed", "committing", "reconciled"}) {
		t.Errorf("tool.updated phases %v, want confirmed committing (before the crash) then reconciled", got.phases)
	}
	checkSent(t, srv, got, tid, runID, op)
	evs.Close()
	srv.Stop()

	wantOneAcceptance(t, db, key, 1) // reconciled by lookup: no second call
	checkDB(t, db)
	// Even at debug level, recovery and reconciliation log ids and phases,
	// never the message, the tool's arguments or the email's address.
	for _, secret := range []string{"ann@example.com", "signed contract"} {
		if logs := srv.Stderr(); strings.Contains(logs, secret) {
			t.Errorf("the debug server log contains %q", secret)
		}
	}
}
