package gateway_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// GET /api/threads/{id}/checkpoints?lists=delta tells each checkpoint's
// lists as what they change from its parent's: rebuilt oldest first they
// are the whole form's, on every branch; the answer stays a few hundred
// bytes per checkpoint however long the conversation, where the whole
// form grows with its length. Any other lists value is invalid_request.
func TestCheckpointDeltasOverHTTP(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	th := h.createThread("")
	for range 12 {
		h.runToEnd(th.ThreadID, h.snapshot(th.ThreadID).StateVersion, "short hello")
	}
	// Another branch: a new request from the point after the third reply.
	from := h.checkpoints(th.ThreadID).Checkpoints[6]
	cur := h.snapshot(th.ThreadID)
	s := h.openSSE(th.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	var ack chat.RunStartAck
	h.call(http.MethodPost, "/api/threads/"+th.ThreadID+"/runs", map[string]any{
		"expected_state_version": cur.StateVersion, "resume_from_checkpoint_id": from.CheckpointID, "user_message": "short another way",
	}, http.StatusCreated, &ack)
	s.waitType(chat.EventRunCompleted, ack.RunID)
	s.close()

	path := "/api/threads/" + th.ThreadID + "/checkpoints"
	var whole checkpointList
	wholeReply := h.call(http.MethodGet, path, nil, http.StatusOK, &whole)
	var delta struct {
		HeadCheckpointID string                 `json:"head_checkpoint_id"`
		Checkpoints      []chat.CheckpointDelta `json:"checkpoints"`
	}
	deltaReply := h.call(http.MethodGet, path+"?lists=delta", nil, http.StatusOK, &delta)
	if delta.HeadCheckpointID != whole.HeadCheckpointID || len(delta.Checkpoints) != len(whole.Checkpoints) {
		t.Fatalf("delta: head %s, %d checkpoints; whole: head %s, %d", delta.HeadCheckpointID, len(delta.Checkpoints), whole.HeadCheckpointID, len(whole.Checkpoints))
	}
	var raw struct {
		Checkpoints []map[string]json.RawMessage `json:"checkpoints"`
	}
	if err := json.Unmarshal(deltaReply.body, &raw); err != nil {
		t.Fatal(err)
	}
	keys := []string{"checkpoint_id", "thread_id", "parent_checkpoint_id", "state_version", "message_ids_kept", "message_ids_added",
		"completed_steps_kept", "completed_steps_added", "tool_results_kept", "tool_results_added", "pending", "run_id", "created_at"}
	for _, cp := range raw.Checkpoints {
		if len(cp) != len(keys) {
			t.Fatalf("a delta checkpoint has %d fields, want %v: %v", len(cp), keys, cp)
		}
		for _, k := range keys {
			if v, ok := cp[k]; !ok || (k[len(k)-6:] == "_added" && string(v) == "null") {
				t.Fatalf("a delta checkpoint lacks %q (or it is null): %v", k, cp)
			}
		}
	}
	rebuilt := map[string]chat.Checkpoint{}
	for i, d := range delta.Checkpoints {
		c := chat.Checkpoint{CheckpointID: d.CheckpointID, ThreadID: d.ThreadID, ParentCheckpointID: d.ParentCheckpointID, StateVersion: d.StateVersion,
			Pending: d.Pending, RunID: d.RunID, CreatedAt: d.CreatedAt}
		var p chat.Checkpoint
		if d.ParentCheckpointID != nil {
			p = rebuilt[*d.ParentCheckpointID]
		}
		c.MessageIDs = append(append([]string{}, p.MessageIDs[:d.MessageIDsKept]...), d.MessageIDsAdded...)
		c.CompletedSteps = append(append([]string{}, p.CompletedSteps[:d.CompletedStepsKept]...), d.CompletedStepsAdded...)
		c.ToolResults = append(append([]chat.ToolResult{}, p.ToolResults[:d.ToolResultsKept]...), d.ToolResultsAdded...)
		rebuilt[c.CheckpointID] = c
		got, _ := json.Marshal(c)
		want, _ := json.Marshal(whole.Checkpoints[i])
		if string(got) != string(want) {
			t.Fatalf("checkpoint %d rebuilt from its delta:\n%s\nwhole:\n%s", i, got, want)
		}
	}
	// About 300 bytes per checkpoint, whatever the conversation's length.
	if per := len(deltaReply.body) / len(delta.Checkpoints); per > 500 || len(deltaReply.body) >= len(wholeReply.body) {
		t.Errorf("the delta answer is %d bytes (%d per checkpoint), the whole one %d", len(deltaReply.body), per, len(wholeReply.body))
	}
	h.wantError(t, h.do(http.MethodGet, path+"?lists=whole", nil), http.StatusBadRequest, chat.CodeInvalidRequest)
	h.wantError(t, h.do(http.MethodGet, "/api/threads/thr_nonexistent/checkpoints?lists=delta", nil), http.StatusNotFound, chat.CodeNotFound)
}
