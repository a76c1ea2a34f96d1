package gateway_test

// WebSocket commands end to end: hello and cancel, fragment/draft/fork,
// checkout of another branch, thread delete.

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// TestWSHelloAndCancel: hello answers the connection id; a cancel over
// the connection records requested_by tab:<tab_id> (tab:<connection_id>
// without hello); its ack precedes its event; a second cancel is
// already_requested and changes nothing.
func TestWSHelloAndCancel(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 20*time.Millisecond)
	snap := h.createThread("")
	th := snap.ThreadID
	a := h.dial(t)
	hello := a.ack(map[string]any{"type": "hello", "tab_id": "tab-7"})
	wsWantKeys(t, "hello ack", hello, "type", "re", "connection_id")
	conn := wsStr(hello, "connection_id")
	if !strings.HasPrefix(conn, "con_") {
		t.Errorf("connection_id %q", conn)
	}
	a.subscribe(th, wsAfter(0))
	runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "Explain backpressure in streaming systems"}), "run_id")
	a.untilDeltas(th, runID, 2)
	before := a.view(th).version
	cancel := a.ack(map[string]any{"type": "run.cancel", "run_id": runID})
	wsWantKeys(t, "run.cancel ack", cancel, "type", "re", "run_id", "status", "accepted_state_version", "resume_checkpoint_id", "published_message_id", "already_requested")
	if cancel["status"] != string(chat.RunCancelRequested) || cancel["already_requested"] != false || cancel["run_id"] != runID ||
		wsNum(cancel, "accepted_state_version") <= before || !strings.HasPrefix(wsStr(cancel, "resume_checkpoint_id"), chat.PrefixCheckpoint) {
		t.Errorf("run.cancel ack %v", cancel)
	}
	done := a.untilEvent(th, chat.EventRunCancelled, runID)
	if n := a.causedAfter(wsStr(cancel, "re"), func(m map[string]any) bool {
		return m["type"] == chat.EventRunCancelRequested && m["run_id"] == runID
	}); n != 1 {
		t.Errorf("%d run.cancel_requested events", n)
	}
	for _, it := range a.view(th).events {
		if it.m["type"] == chat.EventRunCancelRequested {
			if it.m["requested_by"] != "tab:tab-7" || it.m["reason"] != "user_requested" || wsNum(it.m, "state_version") != wsNum(cancel, "accepted_state_version") {
				t.Errorf("run.cancel_requested %s", it.raw)
			}
		}
	}
	if run := h.run(runID); run.RequestedBy == nil || *run.RequestedBy != "tab:tab-7" || run.Status != chat.RunCancelled {
		t.Errorf("run after a cancel over WebSocket: %+v", run)
	}
	cur := h.snapshotBytes(th)
	again := a.cmd(map[string]any{"type": "run.cancel", "run_id": runID, "reason": "clicked twice"})
	if again["type"] != "ack" || again["already_requested"] != true || again["status"] != string(chat.RunCancelled) {
		t.Errorf("second cancel: %v", again)
	}
	if extra := a.sync(); len(extra) != 0 {
		t.Errorf("a second cancel emitted %v", extra)
	}
	if got := h.snapshotBytes(th); got != cur {
		t.Errorf("a second cancel changed the thread")
	}

	// Without hello the connection id names the tab; a stale
	// expected_state_version does not block a cancel.
	b := h.dial(t)
	b.subscribe(th, wsAfter(wsNum(done, "seq")))
	h.model.setPace(10 * time.Millisecond)
	run2 := wsStr(b.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": wsNum(done, "state_version")}), "run_id")
	b.untilDeltas(th, run2, 1)
	c2 := b.ack(map[string]any{"type": "run.cancel", "run_id": run2, "reason": "changed my mind", "expected_state_version": 1})
	if c2["already_requested"] != false {
		t.Errorf("cancel with a stale version: %v", c2)
	}
	ev := b.untilEvent(th, chat.EventRunCancelRequested, run2)
	by := wsStr(ev, "requested_by")
	if !strings.HasPrefix(by, "tab:con_") || by == "tab:"+conn || ev["reason"] != "changed my mind" {
		t.Errorf("cancel without hello: requested_by %q, reason %v", by, ev["reason"])
	}
	b.untilEvent(th, chat.EventRunCancelled, run2)
	if run := h.run(run2); run.RequestedBy == nil || *run.RequestedBy != by {
		t.Errorf("run requested_by %v, event %q", run.RequestedBy, by)
	}
}

// TestWSFragmentDraftFork: fragment.save, draft.delete and thread.fork over
// the connection answer the protocol's fields, before their events.
func TestWSFragmentDraftFork(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 20*time.Millisecond)
	th, runID, tabs := h.tabsMidRun(t, 1, "Explain vector clocks", 3)
	c := tabs[0]
	deltas := c.untilDeltas(th, runID, 3)
	msgID, upTo := wsStr(deltas[0], "message_id"), wsNum(deltas[1], "seq")
	version := c.view(th).version

	saved := c.ack(map[string]any{"type": "fragment.save", "thread_id": th, "message_id": msgID, "last_seq": upTo, "expected_state_version": version})
	wsWantKeys(t, "fragment.save ack", saved, "type", "re", "message_id", "checkpoint_id", "state_version")
	fragID := wsStr(saved, "message_id")
	if !strings.HasPrefix(fragID, chat.PrefixMessage) || fragID == msgID || wsNum(saved, "state_version") <= version {
		t.Errorf("fragment.save ack %v", saved)
	}
	c.until("the fragment's checkpoint", func(m map[string]any) bool {
		return m["type"] == chat.EventCheckpointCreated && m["checkpoint_id"] == saved["checkpoint_id"]
	})
	var frag map[string]any
	if n := c.causedAfter(wsStr(saved, "re"), func(m map[string]any) bool {
		sv := wsNum(m, "state_version")
		if msg, _ := m["message"].(map[string]any); msg != nil && msg["message_id"] == fragID {
			frag = m
		}
		return m["thread_id"] == th && m["type"] != chat.EventMessageDelta && sv > version && sv <= wsNum(saved, "state_version")
	}); n != 2 || frag == nil {
		t.Fatalf("fragment.save caused %d events (published: %v)", n, frag)
	}
	msg := frag["message"].(map[string]any)
	of, _ := msg["fragment_of"].(map[string]any)
	if _, ok := frag["run_id"]; ok || msg["kind"] != string(chat.KindFragment) || msg["run_id"] != nil || msg["content"] != c.text(th, msgID, upTo) ||
		of["run_id"] != runID || of["message_id"] != msgID || wsNum(of, "last_seq") != upTo {
		t.Errorf("fragment published as %v (deltas up to %d: %q)", frag, upTo, c.text(th, msgID, upTo))
	}
	c.ack(map[string]any{"type": "run.cancel", "run_id": runID})
	c.untilEvent(th, chat.EventRunCancelled, runID)

	version = c.view(th).version
	del := c.ack(map[string]any{"type": "draft.delete", "thread_id": th, "message_id": fragID, "expected_state_version": version})
	wsWantKeys(t, "draft.delete ack", del, "type", "re", "checkpoint_id", "state_version")
	if wsNum(del, "state_version") <= version || !strings.HasPrefix(wsStr(del, "checkpoint_id"), chat.PrefixCheckpoint) {
		t.Errorf("draft.delete ack %v", del)
	}
	gone := c.untilEvent(th, chat.EventMessageDeleted, "")
	c.until("the delete's checkpoint", func(m map[string]any) bool {
		return m["type"] == chat.EventCheckpointCreated && m["checkpoint_id"] == del["checkpoint_id"]
	})
	if _, ok := gone["run_id"]; ok || gone["message_id"] != fragID || gone["checkpoint_id"] != del["checkpoint_id"] {
		t.Errorf("message.deleted %v", gone)
	}
	if n := c.causedAfter(wsStr(del, "re"), func(m map[string]any) bool {
		return m["type"] == chat.EventMessageDeleted || (m["type"] == chat.EventCheckpointCreated && m["checkpoint_id"] == del["checkpoint_id"])
	}); n != 2 {
		t.Errorf("draft.delete caused %d events", n)
	}
	after := h.snapshot(th)
	if slices.Contains(messageIDs(after.Messages), fragID) || after.HeadCheckpointID != wsStr(del, "checkpoint_id") {
		t.Errorf("history after draft.delete: %v head %s", messageIDs(after.Messages), after.HeadCheckpointID)
	}

	// Fork from the fragment's checkpoint: the new thread holds the
	// fragment, the original is untouched.
	before := h.snapshotBytes(th)
	fork := c.ack(map[string]any{"type": "thread.fork", "thread_id": th, "from_checkpoint_id": saved["checkpoint_id"]})
	wsWantKeys(t, "thread.fork ack", fork, "type", "re", "new_thread_id", "head_checkpoint_id")
	newTh := wsStr(fork, "new_thread_id")
	if !strings.HasPrefix(newTh, chat.PrefixThread) || newTh == th || !strings.HasPrefix(wsStr(fork, "head_checkpoint_id"), chat.PrefixCheckpoint) {
		t.Fatalf("thread.fork ack %v", fork)
	}
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("the fork emitted on the original thread: %v", extra)
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("the fork changed the original thread")
	}
	c.subscribe(newTh, nil)
	fs := c.untilEvent(newTh, chat.EventThreadSnapshot, "")
	msgs, _ := fs["messages"].([]any)
	if len(msgs) != 2 || fs["head_checkpoint_id"] != fork["head_checkpoint_id"] || msgs[1].(map[string]any)["content"] != msg["content"] {
		t.Errorf("forked thread snapshot %v", fs)
	}
}

// TestWSCheckoutSwitchesBranch: after an edited request, thread.checkout
// moves the head back to the original branch; every tab gets
// thread.head_moved and a snapshot then shows that branch's messages; a
// tab that has not applied the move is refused with the conflict and
// changes nothing; the head itself is a no-op; a running run refuses it.
func TestWSCheckoutSwitchesBranch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	th, root := snap.ThreadID, snap.HeadCheckpointID
	a, b := h.dial(t), h.dial(t)
	a.subscribe(th, wsAfter(0))
	b.subscribe(th, wsAfter(0))

	first := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": snap.StateVersion, "user_message": "short original question"}), "run_id")
	a.untilEvent(th, chat.EventRunCompleted, first)
	original := h.snapshot(th)
	edited := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": original.StateVersion,
		"resume_from_checkpoint_id": root, "user_message": "short edited question"}), "run_id")
	a.untilEvent(th, chat.EventRunCompleted, edited)
	cur := h.snapshot(th)
	if len(cur.Messages) != 2 || cur.Messages[0].Content != "short edited question" {
		t.Fatalf("after the edit the head holds %+v", cur.Messages)
	}
	b.untilSeq(th, cur.LastSeq)

	ack := b.ack(map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": original.HeadCheckpointID, "expected_state_version": cur.StateVersion})
	if ack["head_checkpoint_id"] != original.HeadCheckpointID || wsNum(ack, "state_version") != cur.StateVersion+1 {
		t.Fatalf("checkout ack %v, want head %s at v%d", ack, original.HeadCheckpointID, cur.StateVersion+1)
	}
	for _, c := range []*wsClient{a, b} {
		ev := c.untilEvent(th, chat.EventThreadHeadMoved, "")
		if ev["head_checkpoint_id"] != original.HeadCheckpointID || ev["previous_head_checkpoint_id"] != cur.HeadCheckpointID ||
			wsNum(ev, "seq") != cur.LastSeq+1 || wsNum(ev, "state_version") != cur.StateVersion+1 {
			t.Errorf("%s got %v, want the move from %s to %s at seq %d, v%d", c.name, ev, cur.HeadCheckpointID, original.HeadCheckpointID, cur.LastSeq+1, cur.StateVersion+1)
		}
	}
	moved := h.snapshot(th)
	if moved.HeadCheckpointID != original.HeadCheckpointID || len(moved.Messages) != 2 || moved.Messages[0].Content != "short original question" ||
		moved.Messages[1].MessageID != original.Messages[1].MessageID {
		t.Fatalf("after checkout the snapshot is at %s with %+v, want the original branch", moved.HeadCheckpointID, moved.Messages)
	}

	// A tab that had not applied the move: conflict, nothing changes.
	before := h.snapshotBytes(th)
	e := a.cmd(map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": cur.HeadCheckpointID, "expected_state_version": cur.StateVersion})
	if e["type"] != "error" || e["error"] != chat.CodeStateVersionConflict || wsNum(e, "current_state_version") != moved.StateVersion {
		t.Fatalf("stale checkout: %v", e)
	}
	// The head itself: acknowledged, no event, no new version.
	same := a.ack(map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": moved.HeadCheckpointID, "expected_state_version": moved.StateVersion})
	if wsNum(same, "state_version") != moved.StateVersion {
		t.Errorf("checkout of the head answered %v, want v%d unchanged", same, moved.StateVersion)
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("a refused or empty checkout changed the thread:\n%s\n%s", before, got)
	}

	// While a run streams: run_already_active, nothing changes.
	h.model.setPace(50 * time.Millisecond)
	long := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": moved.StateVersion, "user_message": "What is a write ahead log?"}), "run_id")
	a.untilDeltas(th, long, 1)
	running := h.snapshot(th)
	e = b.cmd(map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": cur.HeadCheckpointID, "expected_state_version": running.StateVersion})
	if e["type"] != "error" || e["error"] != chat.CodeRunAlreadyActive || e["run_id"] != long {
		t.Fatalf("checkout while %s runs: %v", long, e)
	}
	h.model.setPace(time.Millisecond)
	a.untilEvent(th, chat.EventRunCompleted, long)
	after := h.snapshot(th)
	if after.HeadCheckpointID == cur.HeadCheckpointID {
		t.Error("the refused checkout moved the head")
	}
	// Over HTTP, back to the edited branch.
	var back chat.CheckoutAck
	h.call(http.MethodPost, "/api/threads/"+th+"/head", map[string]any{"checkpoint_id": cur.HeadCheckpointID, "expected_state_version": after.StateVersion}, http.StatusOK, &back)
	if back.HeadCheckpointID != cur.HeadCheckpointID || back.StateVersion != after.StateVersion+1 {
		t.Fatalf("POST /head answered %+v", back)
	}
	if got := h.snapshot(th); got.HeadCheckpointID != cur.HeadCheckpointID || got.Messages[0].Content != "short edited question" {
		t.Fatalf("after POST /head the snapshot is at %s with %+v", got.HeadCheckpointID, got.Messages)
	}
}

// TestWSThreadDelete: a tab deletes a conversation whose reply streams;
// every tab on it gets the run's run.cancelled, then thread.deleted, and
// nothing after it; the thread is then not_found everywhere (snapshot,
// subscribe, a second delete) and gone from the list. Over HTTP, DELETE
// deletes another conversation and its event stream ends with
// thread.deleted. A stale version is a conflict that deletes nothing.
func TestWSThreadDelete(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	th, run, a, b := h.twoTabsMidRun(t, "What is a write ahead log?", 1)
	cur := h.snapshot(th)

	e := b.cmd(map[string]any{"type": "thread.delete", "thread_id": th, "expected_state_version": cur.StateVersion - 1})
	if e["type"] != "error" || e["error"] != chat.CodeStateVersionConflict {
		t.Fatalf("delete at a stale version: %v", e)
	}
	ack := b.ack(map[string]any{"type": "thread.delete", "thread_id": th, "expected_state_version": cur.StateVersion})
	if ack["thread_id"] != th {
		t.Fatalf("delete ack %v", ack)
	}
	for _, c := range []*wsClient{a, b} {
		cancelled := c.untilEvent(th, chat.EventRunCancelled, run)
		deleted := c.untilEvent(th, chat.EventThreadDeleted, "")
		if wsNum(deleted, "seq") <= wsNum(cancelled, "seq") || deleted["run_id"] != nil {
			t.Errorf("%s: thread.deleted %v after run.cancelled %v", c.name, deleted, cancelled)
		}
	}
	if r := h.run(run); r.Status != chat.RunCancelled || r.CancelReason == nil || *r.CancelReason != chat.ReasonThreadDeleted {
		t.Fatalf("the run after the delete: %+v", r)
	}
	h.wantError(t, h.do(http.MethodGet, "/api/threads/"+th, nil), http.StatusNotFound, chat.CodeNotFound)
	c := h.dial(t)
	if e := c.cmd(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": 0}); e["error"] != chat.CodeNotFound {
		t.Fatalf("subscribe to the deleted thread: %v", e)
	}
	if e := a.cmd(map[string]any{"type": "thread.delete", "thread_id": th}); e["error"] != chat.CodeNotFound {
		t.Fatalf("second delete: %v", e)
	}
	// Nothing reached the tabs after thread.deleted: a hello's ack is the
	// next frame either reads.
	for _, c := range []*wsClient{a, b} {
		c.ack(map[string]any{"type": "hello", "tab_id": "after-the-delete"})
	}

	// Over HTTP, with an event stream open on it.
	other := h.createThread("")
	h.runToEnd(other.ThreadID, other.StateVersion, "short: hello")
	stream := h.openSSE(other.ThreadID, "after_seq=0", "")
	defer stream.close()
	stream.catchUp(h.snapshot(other.ThreadID).LastSeq)
	var del chat.ThreadDeletedAck
	h.call(http.MethodDelete, "/api/threads/"+other.ThreadID, nil, http.StatusOK, &del)
	if del.ThreadID != other.ThreadID {
		t.Fatalf("DELETE answered %+v", del)
	}
	rest, err := stream.rest()
	if len(rest) != 1 || rest[0].Type != chat.EventThreadDeleted {
		t.Fatalf("after the DELETE the stream sent %v and ended with %v, want thread.deleted alone", rest, err)
	}
	var list struct {
		Threads []chat.Thread `json:"threads"`
	}
	h.call(http.MethodGet, "/api/threads", nil, http.StatusOK, &list)
	for _, got := range list.Threads {
		if got.ThreadID == th || got.ThreadID == other.ThreadID {
			t.Errorf("the list still holds deleted %s", got.ThreadID)
		}
	}
}
