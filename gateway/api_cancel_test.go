package gateway_test

// Cancels over the API: mid-stream, concurrent, of a queued run; continuing
// from the saved point afterwards; concurrent starts.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// TestCancelMidStream: a cancel is accepted at once with the resume point;
// the run ends cancelled, nothing of it is published, and a second cancel
// changes nothing.
func TestCancelMidStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	snap, s, ack, deltas := h.runUntilDeltas("Explain the CAP theorem with examples", 3)
	before := h.snapshot(snap.ThreadID)
	if before.ActiveRun == nil || before.ActiveRun.RunID != ack.RunID {
		t.Fatalf("no active run in %+v", before)
	}

	r := h.do(http.MethodPost, "/api/runs/"+ack.RunID+"/cancel", map[string]any{"expected_state_version": 1}, "X-Client-Name", "api-test")
	if r.status != http.StatusAccepted {
		t.Fatalf("%v: want 202", r)
	}
	raw := rawFields(t, r.body)
	for _, k := range []string{"run_id", "status", "accepted_state_version", "resume_checkpoint_id", "published_message_id", "already_requested"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("cancel ack lacks %q: %s", k, r.body)
		}
	}
	var cack chat.CancelAck
	json.Unmarshal(r.body, &cack)
	userMsg := before.Messages[0].MessageID
	if cack.RunID != ack.RunID || cack.Status != chat.RunCancelRequested || cack.AlreadyRequested ||
		cack.AcceptedStateVersion != before.StateVersion+1 || cack.ResumeCheckpointID != before.HeadCheckpointID ||
		cack.PublishedMessageID == nil || *cack.PublishedMessageID != userMsg {
		t.Errorf("cancel ack %+v; thread before %+v", cack, before)
	}

	req := s.waitType(chat.EventRunCancelRequested, ack.RunID)
	if req.StateVersion != cack.AcceptedStateVersion || req.Reason != chat.ReasonUserRequested || req.RequestedBy != "api:api-test" {
		t.Errorf("run.cancel_requested %s", req.Data)
	}
	done := s.waitType(chat.EventRunCancelled, ack.RunID)
	all := s.events
	for _, e := range all {
		if e.RunID == ack.RunID && e.Type == chat.EventMessagePublished {
			t.Errorf("cancelled run published %v", e)
		}
	}
	streamed := runeCount(filter(all, func(e *wireEvent) bool { return e.Type == chat.EventMessageDelta }))
	if done.DiscardedStreamChars < streamed || done.DiscardedStreamChars <= 0 || streamed < runeCount(deltas) {
		t.Errorf("discarded_stream_chars %d, streamed %d", done.DiscardedStreamChars, streamed)
	}
	if done.ResumePolicy != chat.ResumePolicyRegenerate || done.ResumeCheckpointID != cack.ResumeCheckpointID ||
		done.PublishedMessageID == nil || *done.PublishedMessageID != userMsg || len(done.Operations) != 0 ||
		!strings.Contains(string(done.Data), `"operations":[]`) {
		t.Errorf("run.cancelled %s", done.Data)
	}

	after := h.snapshot(snap.ThreadID)
	if after.ActiveRun != nil || !slices.Equal(messageIDs(after.Messages), []string{userMsg}) ||
		after.HeadCheckpointID != cack.ResumeCheckpointID || after.StateVersion != done.StateVersion {
		t.Errorf("snapshot after cancel %+v", after)
	}
	run := h.run(ack.RunID)
	if run.Status != chat.RunCancelled || run.CancelRequestedAt == nil || run.CancelReason == nil || *run.CancelReason != chat.ReasonUserRequested ||
		run.RequestedBy == nil || *run.RequestedBy != "api:api-test" || run.DiscardedStreamChars != done.DiscardedStreamChars ||
		run.ResumeCheckpointID == nil || *run.ResumeCheckpointID != cack.ResumeCheckpointID || run.FinishedAt == nil {
		t.Errorf("cancelled run %+v", run)
	}
	cps := h.checkpoints(snap.ThreadID)
	head := cps.Checkpoints[len(cps.Checkpoints)-1]
	if len(cps.Checkpoints) != 2 || head.Pending == nil || head.Pending.Step != chat.StepGenerate {
		t.Errorf("a cancel must create no checkpoint and keep the pending step: %+v", cps)
	}

	// A second cancel: already_requested, no event, no version bump.
	again := h.cancel(ack.RunID, nil)
	if !again.AlreadyRequested || again.RunID != ack.RunID || again.Status != chat.RunCancelled ||
		again.AcceptedStateVersion != cack.AcceptedStateVersion || again.ResumeCheckpointID != cack.ResumeCheckpointID {
		t.Errorf("second cancel %+v", again)
	}
	h.requireUnchanged(after)

	// The continue run's events follow run.cancelled directly: nothing of
	// the cancelled run came in between (the stream's observer fails any
	// event of a run after its run.cancelled).
	next := h.startRun(snap.ThreadID, after.StateVersion, "")
	if e := s.next(); e.Seq != done.Seq+1 || e.RunID != next.RunID {
		t.Errorf("after run.cancelled came %v", e)
	}
	h.cancel(next.RunID, map[string]any{"reason": "changed my mind"})
	if e := s.waitType(chat.EventRunCancelRequested, next.RunID); e.Reason != "changed my mind" || e.RequestedBy != "api:http" {
		t.Errorf("cancel_requested %s", e.Data)
	}
	s.waitType(chat.EventRunCancelled, next.RunID)

	// Cancelling a completed run is refused with its status.
	h.model.setPace(time.Millisecond)
	cur := h.snapshot(snap.ThreadID)
	okRun, _ := h.runToEnd(snap.ThreadID, cur.StateVersion, "short question")
	cur = h.snapshot(snap.ThreadID)
	body := h.wantError(t, h.do(http.MethodPost, "/api/runs/"+okRun.RunID+"/cancel", nil), http.StatusConflict, chat.CodeRunNotActive)
	if body["run_id"] != okRun.RunID || body["status"] != string(chat.RunCompleted) {
		t.Errorf("run_not_active body %v", body)
	}
	h.requireUnchanged(cur)
}

// TestConcurrentCancels: of several cancels at once exactly one is
// accepted; the others answer already_requested with the same version.
func TestConcurrentCancels(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	_, s, ack, _ := h.runUntilDeltas("Compare Raft and Paxos", 1)
	const n = 6
	acks := make([]chat.CancelAck, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { acks[i] = h.cancel(ack.RunID, nil) })
	}
	wg.Wait()
	fresh := 0
	for _, a := range acks {
		if !a.AlreadyRequested {
			fresh++
		}
		if a.AcceptedStateVersion != acks[0].AcceptedStateVersion || a.ResumeCheckpointID != acks[0].ResumeCheckpointID {
			t.Errorf("cancel acks disagree: %+v vs %+v", a, acks[0])
		}
	}
	if fresh != 1 {
		t.Errorf("%d cancels accepted as new, want 1: %+v", fresh, acks)
	}
	s.waitType(chat.EventRunCancelled, ack.RunID)
	n1 := len(filter(s.events, func(e *wireEvent) bool { return e.Type == chat.EventRunCancelRequested }))
	if n1 != 1 {
		t.Errorf("%d run.cancel_requested events, want 1", n1)
	}
}

// TestContinueFromSavedPoint: after a cancel, run.start without a message
// re-runs the pending step with a resume note; stale versions, a second
// active run and retried client_request_ids are answered honestly.
func TestContinueFromSavedPoint(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	const question = "What is a write ahead log?"
	snap, s, ack, _ := h.runUntilDeltas(question, 2)

	// While it runs: a second run.start is refused with the active run.
	cur := h.snapshot(snap.ThreadID)
	body := h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": cur.StateVersion, "user_message": "another"}), http.StatusConflict, chat.CodeRunAlreadyActive)
	if body["run_id"] != ack.RunID {
		t.Errorf("run_already_active names %v, want %s", body["run_id"], ack.RunID)
	}
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": cur.StateVersion}), http.StatusConflict, chat.CodeRunAlreadyActive)
	h.requireOnlyDeltas(cur, s) // (the run streams on meanwhile)

	staleVersion := cur.StateVersion
	cack := h.cancel(ack.RunID, nil)
	cancelled := s.waitType(chat.EventRunCancelled, ack.RunID)
	h.model.setPace(time.Millisecond)
	cur = h.snapshot(snap.ThreadID)
	if cur.StateVersion != cancelled.StateVersion {
		t.Fatalf("version %d after run.cancelled v%d", cur.StateVersion, cancelled.StateVersion)
	}

	// A stale continue is refused with what the server can do.
	cps := h.checkpoints(snap.ThreadID)
	var basedOn string
	for _, cp := range cps.Checkpoints {
		if cp.StateVersion <= staleVersion {
			basedOn = cp.CheckpointID
		}
	}
	body = h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": staleVersion}), http.StatusConflict, chat.CodeStateVersionConflict)
	actions, _ := body["allowed_actions"].([]any)
	if body["current_state_version"] != float64(cur.StateVersion) || body["current_checkpoint_id"] != cur.HeadCheckpointID ||
		!slices.Contains(actions, any("reload")) || !slices.Contains(actions, any("fork_from_"+basedOn)) {
		t.Errorf("conflict body %v; want fork_from_%s", body, basedOn)
	}
	h.requireUnchanged(cur)

	// Continue: a new run from the head, retried with the same
	// client_request_id.
	req := map[string]any{"expected_state_version": cur.StateVersion, "client_request_id": "tab-1:continue-1"}
	var cont chat.RunStartAck
	h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs", req, http.StatusCreated, &cont)
	if cont.RunID == ack.RunID || cont.Status != chat.RunRunning || cont.StateVersion != cur.StateVersion+1 {
		t.Errorf("continue ack %+v", cont)
	}
	started := s.waitType(chat.EventRunStarted, cont.RunID)
	if started.BaseCheckpointID != cack.ResumeCheckpointID {
		t.Errorf("continue starts from %s, want the resume checkpoint %s", started.BaseCheckpointID, cack.ResumeCheckpointID)
	}
	s.waitType(chat.EventRunCompleted, cont.RunID)
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 2 || after.Messages[0].Content != question || after.Messages[1].Role != chat.RoleAssistant ||
		after.Messages[1].RunID == nil || *after.Messages[1].RunID != cont.RunID {
		t.Fatalf("history after continue: %+v", after.Messages)
	}
	resumed := after.Messages[1].Content
	if !strings.HasPrefix(resumed, "Picking up from the saved point") {
		t.Errorf("continued reply does not acknowledge the stop: %q", resumed)
	}

	var retry chat.RunStartAck
	h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs", req, http.StatusCreated, &retry) // now stale
	if retry.RunID != cont.RunID || retry.StateVersion != cont.StateVersion {
		t.Errorf("retry answered %+v, first answer %+v", retry, cont)
	}
	h.requireUnchanged(after)
	// A new client_request_id with the stale version is a conflict.
	req["client_request_id"] = "tab-1:continue-2"
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs", req), http.StatusConflict, chat.CodeStateVersionConflict)
	// Continuing a checkpoint with nothing pending is invalid.
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": after.StateVersion}), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.requireUnchanged(after)

	// The same question without a stop gets a normal reply, which differs.
	other := h.createThread("")
	_, normal := h.runToEnd(other.ThreadID, 1, question)
	if normal.Content == resumed || strings.HasPrefix(normal.Content, "Picking up") {
		t.Errorf("normal reply %q vs continued %q", normal.Content, resumed)
	}
}

// TestConcurrentStarts: of several run.starts on one version exactly one
// wins; the rest are conflicts and change nothing.
func TestConcurrentStarts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	const n = 5
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
				map[string]any{"expected_state_version": 1, "user_message": fmt.Sprintf("short question %d", i)})
		})
	}
	wg.Wait()
	var winner chat.RunStartAck
	wins := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			wins++
			json.Unmarshal(r.body, &winner)
		default:
			h.wantError(t, r, http.StatusConflict, chat.CodeStateVersionConflict)
		}
	}
	if wins != 1 {
		t.Fatalf("%d run.starts won, want 1", wins)
	}
	s.waitType(chat.EventRunCompleted, winner.RunID)
	if after := h.snapshot(snap.ThreadID); len(after.Messages) != 2 {
		t.Errorf("history %+v", after.Messages)
	}
}

// TestCancelQueuedRun: a run no worker holds yet is cancelled by the
// engine itself: cancel_requested, then run.cancelled with nothing
// discarded; the worker never claims it.
func TestCancelQueuedRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond, withWorkers(1))
	a, b := h.createThread("busy"), h.createThread("waiting")
	sa := h.openSSE(a.ThreadID, "after_seq=0", "")
	sb := h.openSSE(b.ThreadID, "after_seq=0", "")
	busy := h.startRun(a.ThreadID, 1, "Explain garbage collection in Go")
	sa.waitDeltas(busy.RunID, 1) // the only worker is taken
	queued := h.startRun(b.ThreadID, 1, "short queued question")
	if run := h.run(queued.RunID); run.Status != chat.RunQueued {
		t.Fatalf("second run is %s, want queued", run.Status)
	}
	before := h.snapshot(b.ThreadID)
	if before.ActiveRun == nil || before.ActiveRun.Status != chat.RunQueued || before.ActiveRun.MessageID != nil || before.ActiveRun.PartialText != "" {
		t.Errorf("snapshot of a queued run: %+v", before.ActiveRun)
	}
	ack := h.cancel(queued.RunID, nil)
	if ack.Status != chat.RunCancelRequested || ack.AlreadyRequested || ack.ResumeCheckpointID != before.HeadCheckpointID ||
		ack.PublishedMessageID == nil || *ack.PublishedMessageID != before.Messages[0].MessageID {
		t.Errorf("cancel of a queued run: %+v", ack)
	}
	done := sb.waitType(chat.EventRunCancelled, queued.RunID)
	if done.DiscardedStreamChars != 0 || len(done.Operations) != 0 || done.ResumeCheckpointID != before.HeadCheckpointID {
		t.Errorf("run.cancelled of a queued run: %s", done.Data)
	}
	for _, e := range sb.events {
		if e.RunID == queued.RunID && (e.Type == chat.EventMessageDelta || e.Type == chat.EventMessagePublished) {
			t.Errorf("a cancelled queued run streamed: %v", e)
		}
	}
	if run := h.run(queued.RunID); run.Status != chat.RunCancelled || run.DiscardedStreamChars != 0 {
		t.Errorf("queued run after cancel: %+v", run)
	}
	h.cancel(busy.RunID, nil)
	sa.waitType(chat.EventRunCancelled, busy.RunID)

	// The worker is free again: continuing the cancelled queued run works.
	h.model.setPace(time.Millisecond)
	cur := h.snapshot(b.ThreadID)
	cont := h.startRun(b.ThreadID, cur.StateVersion, "")
	sb.waitType(chat.EventRunCompleted, cont.RunID)
}
