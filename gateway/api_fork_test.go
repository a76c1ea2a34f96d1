package gateway_test

// Fragments of a streamed reply saved as drafts, forks, and runs resumed
// from an older checkpoint, over the API.

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
)

func TestFragments(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	snap, s, ack, deltas := h.runUntilDeltas("Explain vector clocks", 4)
	msgID, upTo := deltas[0].MessageID, deltas[2].Seq
	version := s.lastVersion
	fragPath := "/api/threads/" + snap.ThreadID + "/fragments"

	// Refusals first; none changes anything.
	cur := h.snapshot(snap.ThreadID)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": upTo, "expected_state_version": version - 1}),
		http.StatusConflict, chat.CodeStateVersionConflict)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": "msg_00000000000000000000000000", "last_seq": upTo, "expected_state_version": version}),
		http.StatusNotFound, chat.CodeNotFound)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": deltas[0].Seq - 1, "expected_state_version": version}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "expected_state_version": version}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"last_seq": upTo, "expected_state_version": version}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": upTo}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, "/api/threads/thr_00000000000000000000000000/fragments",
		map[string]any{"message_id": msgID, "last_seq": upTo, "expected_state_version": version}), http.StatusNotFound, chat.CodeNotFound)
	other := h.createThread("")
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+other.ThreadID+"/fragments",
		map[string]any{"message_id": msgID, "last_seq": upTo, "expected_state_version": 1}), http.StatusNotFound, chat.CodeNotFound)
	if now := h.snapshot(snap.ThreadID); now.StateVersion != cur.StateVersion || len(now.Messages) != 1 {
		t.Errorf("a refused fragment.save changed the thread: %+v", now)
	}
	h.requireUnchanged(other)

	r := h.call(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": upTo, "expected_state_version": version}, http.StatusCreated, nil)
	var saved chat.FragmentSaved
	json.Unmarshal(r.body, &saved)
	if len(rawFields(t, r.body)) != 3 || !strings.HasPrefix(saved.MessageID, chat.PrefixMessage) || saved.MessageID == msgID ||
		saved.StateVersion != version+2 || !strings.HasPrefix(saved.CheckpointID, chat.PrefixCheckpoint) {
		t.Errorf("fragment.save answer %s (version was %d)", r.body, version)
	}
	pub := s.waitFor("fragment published", func(e *wireEvent) bool {
		return e.Type == chat.EventMessagePublished && e.Message.MessageID == saved.MessageID
	})
	pubEv := pub[len(pub)-1]
	cpEv := s.next()
	if pubEv.RunID != "" || hasField(pubEv.Data, "run_id") || cpEv.Type != chat.EventCheckpointCreated || cpEv.CheckpointID != saved.CheckpointID || cpEv.RunID != "" {
		t.Errorf("fragment events %s / %s", pubEv.Data, cpEv.Data)
	}
	wantText := s.text(msgID, upTo)
	if wantText == "" {
		t.Fatal("no delta text")
	}

	snapRaw := h.snapshotBytes(snap.ThreadID)
	var after chat.Snapshot
	json.Unmarshal([]byte(snapRaw), &after)
	if len(after.Messages) != 2 || after.HeadCheckpointID != saved.CheckpointID || after.ActiveRun == nil || after.ActiveRun.RunID != ack.RunID {
		t.Fatalf("snapshot after fragment.save: %s", snapRaw)
	}
	frag := after.Messages[1]
	if frag.MessageID != saved.MessageID || frag.Kind != chat.KindFragment || frag.Role != chat.RoleAssistant || frag.Content != wantText ||
		frag.RunID != nil || frag.FragmentOf == nil || *frag.FragmentOf != (chat.FragmentOf{RunID: ack.RunID, MessageID: msgID, LastSeq: upTo}) ||
		frag.CheckpointID != saved.CheckpointID || frag.StateVersion != pubEv.StateVersion {
		t.Errorf("fragment %+v, want content %q", frag, wantText)
	}
	var rawSnap struct {
		Messages []map[string]json.RawMessage `json:"messages"`
	}
	json.Unmarshal([]byte(snapRaw), &rawSnap)
	if string(rawSnap.Messages[1]["run_id"]) != "null" {
		t.Errorf("fragment run_id = %s, want null", rawSnap.Messages[1]["run_id"])
	}
	head := h.checkpoints(snap.ThreadID).Checkpoints
	if hc := head[len(head)-1]; hc.Pending == nil || hc.Pending.Step != chat.StepGenerate {
		t.Errorf("the fragment's checkpoint lost the pending step: %+v", hc)
	}

	// A second fragment of the same message, cut elsewhere.
	var saved2 chat.FragmentSaved
	h.call(http.MethodPost, fragPath, map[string]any{"message_id": msgID, "last_seq": deltas[0].Seq, "expected_state_version": saved.StateVersion}, http.StatusCreated, &saved2)
	if got := h.snapshot(snap.ThreadID); len(got.Messages) != 3 || got.Messages[2].Content != deltas[0].Text {
		t.Errorf("second fragment: %+v", got.Messages)
	}

	// Stop the run: the last published message is now the second fragment.
	cack := h.cancel(ack.RunID, nil)
	if cack.PublishedMessageID == nil || *cack.PublishedMessageID != saved2.MessageID || cack.ResumeCheckpointID != saved2.CheckpointID {
		t.Errorf("cancel after fragments: %+v, want published %s at %s", cack, saved2.MessageID, saved2.CheckpointID)
	}
	s.waitType(chat.EventRunCancelled, ack.RunID)
	cur = h.snapshot(snap.ThreadID)
	delPath := func(id string) string { return "/api/threads/" + snap.ThreadID + "/drafts/" + id + "/delete" }
	h.wantError(t, h.do(http.MethodPost, delPath(cur.Messages[0].MessageID), map[string]any{"expected_state_version": cur.StateVersion}),
		http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, delPath("msg_00000000000000000000000000"), map[string]any{"expected_state_version": cur.StateVersion}),
		http.StatusNotFound, chat.CodeNotFound)
	h.wantError(t, h.do(http.MethodPost, delPath(msgID), map[string]any{"expected_state_version": cur.StateVersion}),
		http.StatusNotFound, chat.CodeNotFound) // the streamed message was never published
	h.wantError(t, h.do(http.MethodPost, delPath(saved.MessageID), map[string]any{"expected_state_version": cur.StateVersion - 1}),
		http.StatusConflict, chat.CodeStateVersionConflict)
	h.wantError(t, h.do(http.MethodPost, delPath(saved.MessageID), map[string]any{}), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+other.ThreadID+"/drafts/"+saved.MessageID+"/delete",
		map[string]any{"expected_state_version": 1}), http.StatusNotFound, chat.CodeNotFound)
	h.requireUnchanged(cur)
	h.requireUnchanged(other)

	r = h.call(http.MethodPost, delPath(saved.MessageID), map[string]any{"expected_state_version": cur.StateVersion}, http.StatusOK, nil)
	var del chat.DraftDeleted
	json.Unmarshal(r.body, &del)
	if len(rawFields(t, r.body)) != 2 || del.StateVersion <= cur.StateVersion || !strings.HasPrefix(del.CheckpointID, chat.PrefixCheckpoint) {
		t.Errorf("draft.delete answer %s", r.body)
	}
	s.catchUp(cur.LastSeq)
	evs := s.waitSeq(cur.LastSeq + 2)
	if evs[0].Type != chat.EventMessageDeleted || evs[0].MessageID != saved.MessageID || evs[0].CheckpointID != del.CheckpointID || evs[0].RunID != "" ||
		evs[1].Type != chat.EventCheckpointCreated || evs[1].CheckpointID != del.CheckpointID || evs[1].StateVersion != del.StateVersion {
		t.Errorf("draft.delete events %v %v", evs[0], evs[1])
	}
	final := h.snapshot(snap.ThreadID)
	if !slices.Equal(messageIDs(final.Messages), []string{cur.Messages[0].MessageID, saved2.MessageID}) || final.HeadCheckpointID != del.CheckpointID {
		t.Errorf("history after delete %v", messageIDs(final.Messages))
	}
	// Deleting it again: it is no longer in history.
	h.wantError(t, h.do(http.MethodPost, delPath(saved.MessageID), map[string]any{"expected_state_version": final.StateVersion}),
		http.StatusNotFound, chat.CodeNotFound)
	h.requireUnchanged(final)

	// Continuing hands the remaining fragment to the model as a fragment.
	h.model.setPace(time.Millisecond)
	cont := h.startRun(snap.ThreadID, final.StateVersion, "")
	s.waitType(chat.EventRunCompleted, cont.RunID)
	end := h.snapshot(snap.ThreadID)
	if len(end.Messages) != 3 || end.Messages[1].MessageID != saved2.MessageID || !strings.Contains(end.Messages[2].Content, "saved fragment") {
		t.Errorf("history after continuing with a fragment: %+v", end.Messages)
	}
}

// TestFork: a fork copies the state at a checkpoint into a new thread and
// leaves the original untouched; checkpoints of other threads are not found.
func TestFork(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("origin")
	h.runToEnd(snap.ThreadID, 1, "short first")
	cur := h.snapshot(snap.ThreadID)
	_, second := h.runToEnd(snap.ThreadID, cur.StateVersion, "short second")
	orig := h.snapshotBytes(snap.ThreadID)
	var origSnap chat.Snapshot
	json.Unmarshal([]byte(orig), &origSnap)
	cps := h.checkpoints(snap.ThreadID)
	if len(origSnap.Messages) != 4 || second.MessageID != origSnap.Messages[3].MessageID {
		t.Fatalf("origin history %+v", origSnap.Messages)
	}
	// The checkpoint after the first answer: two messages, nothing pending.
	var from chat.Checkpoint
	for _, cp := range cps.Checkpoints {
		if len(cp.MessageIDs) == 2 && cp.Pending == nil {
			from = cp
		}
	}
	r := h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/fork", map[string]any{"from_checkpoint_id": from.CheckpointID}, http.StatusCreated, nil)
	var fork chat.ForkAck
	json.Unmarshal(r.body, &fork)
	if len(rawFields(t, r.body)) != 2 || !strings.HasPrefix(fork.NewThreadID, chat.PrefixThread) || fork.NewThreadID == snap.ThreadID {
		t.Fatalf("fork answer %s", r.body)
	}
	fs := h.snapshot(fork.NewThreadID)
	if fs.HeadCheckpointID != fork.HeadCheckpointID || fs.StateVersion != 1 || fs.LastSeq != 1 || fs.ActiveRun != nil ||
		!slices.Equal(messageIDs(fs.Messages), from.MessageIDs) {
		t.Errorf("forked thread %+v, want the history of %s", fs, from.CheckpointID)
	}
	for i, m := range fs.Messages {
		if m.Content != origSnap.Messages[i].Content {
			t.Errorf("forked message %d = %q, want %q", i, m.Content, origSnap.Messages[i].Content)
		}
	}
	if got := h.snapshotBytes(snap.ThreadID); got != orig {
		t.Errorf("fork changed the original:\n%s\n%s", orig, got)
	}
	fcps := h.checkpoints(fork.NewThreadID)
	if len(fcps.Checkpoints) != 1 || fcps.Checkpoints[0].CheckpointID != fork.HeadCheckpointID || fcps.Checkpoints[0].ParentCheckpointID != nil {
		t.Errorf("forked checkpoints %+v", fcps)
	}
	var list threadPage
	h.call(http.MethodGet, "/api/threads", nil, http.StatusOK, &list)
	found := false
	for _, th := range list.Threads {
		if th.ThreadID == fork.NewThreadID {
			found = true
			if th.ForkedFrom == nil || th.ForkedFrom.ThreadID != snap.ThreadID || th.ForkedFrom.CheckpointID != from.CheckpointID {
				t.Errorf("forked thread in list: %+v", th)
			}
		}
	}
	if !found {
		t.Errorf("forked thread not listed")
	}

	// The fork lives on by itself.
	_, reply := h.runToEnd(fork.NewThreadID, 1, "short on the branch")
	if got := h.snapshot(fork.NewThreadID); len(got.Messages) != 4 || got.Messages[3].MessageID != reply.MessageID {
		t.Errorf("fork history after a run: %+v", got.Messages)
	}
	if got := h.snapshotBytes(snap.ThreadID); got != orig {
		t.Errorf("a run on the fork changed the original")
	}

	// Refusals.
	forkPath := "/api/threads/" + snap.ThreadID + "/fork"
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{"from_checkpoint_id": "cp_00000000000000000000000000"}), http.StatusNotFound, chat.CodeCheckpointNotFound)
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{"from_checkpoint_id": fork.HeadCheckpointID}), http.StatusNotFound, chat.CodeCheckpointNotFound)
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+fork.NewThreadID+"/fork", map[string]any{"from_checkpoint_id": from.CheckpointID}), http.StatusNotFound, chat.CodeCheckpointNotFound)
	h.wantError(t, h.do(http.MethodPost, "/api/threads/thr_00000000000000000000000000/fork", map[string]any{"from_checkpoint_id": from.CheckpointID}), http.StatusNotFound, chat.CodeNotFound)
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{}), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{"from_checkpoint_id": ""}), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodPost, forkPath, map[string]any{"from_checkpoint_id": 7}), http.StatusBadRequest, chat.CodeInvalidRequest)
	if got := h.snapshotBytes(snap.ThreadID); got != orig {
		t.Errorf("a refused fork changed the original")
	}
	if n := h.threadCount(""); n != 2 {
		t.Errorf("%d threads after refused forks, want 2", n)
	}
}

// TestResumeFromOlderCheckpoint: run.start from a checkpoint that is not the
// head makes it the head again through a new checkpoint; a stale request
// based on it offers a fork from it.
func TestResumeFromOlderCheckpoint(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	h.runToEnd(snap.ThreadID, 1, "short first question")
	cps := h.checkpoints(snap.ThreadID)
	userCP := cps.Checkpoints[1] // the user message, pending generate
	if userCP.Pending == nil || len(userCP.MessageIDs) != 1 {
		t.Fatalf("checkpoint 1 is %+v", userCP)
	}
	cur := h.snapshot(snap.ThreadID)

	// Stale, based on the older checkpoint: fork from it is offered.
	body := h.wantError(t, h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": 2, "resume_from_checkpoint_id": userCP.CheckpointID}), http.StatusConflict, chat.CodeStateVersionConflict)
	if acts, _ := body["allowed_actions"].([]any); !slices.Contains(acts, any("fork_from_"+userCP.CheckpointID)) {
		t.Errorf("allowed_actions %v, want fork_from_%s", body["allowed_actions"], userCP.CheckpointID)
	}
	h.requireUnchanged(cur)

	// Regenerate the answer from the older point.
	s := h.openSSE(snap.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	var ack chat.RunStartAck
	h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": cur.StateVersion, "resume_from_checkpoint_id": userCP.CheckpointID}, http.StatusCreated, &ack)
	cpEv := s.next()
	started := s.next()
	if cpEv.Type != chat.EventCheckpointCreated || cpEv.ParentCheckpointID == nil || *cpEv.ParentCheckpointID != userCP.CheckpointID ||
		started.Type != chat.EventRunStarted || started.BaseCheckpointID != cpEv.CheckpointID || ack.StateVersion != started.StateVersion {
		t.Fatalf("resume from %s: %v then %v", userCP.CheckpointID, cpEv, started)
	}
	s.waitType(chat.EventRunCompleted, ack.RunID)
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 2 || after.Messages[0].MessageID != userCP.MessageIDs[0] || after.Messages[1].RunID == nil || *after.Messages[1].RunID != ack.RunID {
		t.Errorf("history after regenerating: %+v", after.Messages)
	}

	// A new question asked from the older point branches from there.
	h.runToEnd(snap.ThreadID, after.StateVersion, "short edited question")
	var edit chat.RunStartAck
	cur = h.snapshot(snap.ThreadID)
	s2 := h.openSSE(snap.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs", map[string]any{
		"expected_state_version": cur.StateVersion, "resume_from_checkpoint_id": cps.Checkpoints[0].CheckpointID, "user_message": "short a different start",
	}, http.StatusCreated, &edit)
	s2.waitType(chat.EventRunCompleted, edit.RunID)
	final := h.snapshot(snap.ThreadID)
	if len(final.Messages) != 2 || final.Messages[0].Content != "short a different start" {
		t.Errorf("history after editing from the root: %+v", final.Messages)
	}
}
