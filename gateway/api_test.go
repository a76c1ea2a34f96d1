package gateway_test

// The JSON API: threads created, listed and read; a run from start to end;
// streamed text; bad input and the limits accepted; a purged stream; a
// shutdown that hands its run back.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// ---- tests ----

// TestThreadsCreateListGet: creation answers a snapshot at version 1 with a
// head; the list is newest first and pages without loss or duplicates.
func TestThreadsCreateListGet(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)

	r := h.call(http.MethodPost, "/api/threads", nil, http.StatusCreated, nil) // no body at all
	raw := rawFields(t, r.body)
	for _, k := range []string{"thread_id", "title", "state_version", "head_checkpoint_id", "last_seq", "messages", "active_run"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("snapshot lacks %q: %s", k, r.body)
		}
	}
	if string(raw["messages"]) != "[]" || string(raw["active_run"]) != "null" {
		t.Errorf("new thread: messages %s active_run %s, want [] and null", raw["messages"], raw["active_run"])
	}
	var first chat.Snapshot
	json.Unmarshal(r.body, &first)
	if !strings.HasPrefix(first.ThreadID, chat.PrefixThread) || first.StateVersion != 1 || first.LastSeq != 1 ||
		!strings.HasPrefix(first.HeadCheckpointID, chat.PrefixCheckpoint) || first.Title == "" {
		t.Errorf("new thread snapshot %s", r.body)
	}
	if got := h.snapshotBytes(first.ThreadID); got != string(r.body) {
		t.Errorf("GET thread = %s, create answered %s", got, r.body)
	}
	titled := h.createThread("Trip to Lisbon")
	if titled.Title != "Trip to Lisbon" || titled.StateVersion != 1 {
		t.Errorf("titled thread: %+v", titled)
	}
	cps := h.checkpoints(first.ThreadID)
	if len(cps.Checkpoints) != 1 || cps.HeadCheckpointID != first.HeadCheckpointID ||
		cps.Checkpoints[0].StateVersion != 1 || cps.Checkpoints[0].ParentCheckpointID != nil || len(cps.Checkpoints[0].MessageIDs) != 0 {
		t.Errorf("checkpoints of a new thread: %+v", cps)
	}

	ids := []string{first.ThreadID, titled.ThreadID}
	for i := range 3 {
		ids = append(ids, h.createThread(fmt.Sprintf("thread %d", i)).ThreadID)
	}
	// Updating the oldest thread moves it to the front.
	h.runToEnd(first.ThreadID, 1, "short hello")

	var all threadPage
	h.call(http.MethodGet, "/api/threads", nil, http.StatusOK, &all)
	if len(all.Threads) != 5 || all.NextCursor != nil {
		t.Fatalf("list: %d threads, next %v", len(all.Threads), all.NextCursor)
	}
	if all.Threads[0].ThreadID != first.ThreadID || all.Threads[0].StateVersion <= 1 {
		t.Errorf("most recently updated thread is not first: %+v", all.Threads[0])
	}
	for i := 1; i < len(all.Threads); i++ {
		a, b := all.Threads[i-1], all.Threads[i]
		if a.UpdatedAt.Before(b.UpdatedAt) || (a.UpdatedAt.Equal(b.UpdatedAt) && a.ThreadID < b.ThreadID) {
			t.Errorf("list not newest first at %d: %v %s then %v %s", i, a.UpdatedAt, a.ThreadID, b.UpdatedAt, b.ThreadID)
		}
	}
	var paged []string
	path := "/api/threads?limit=2"
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		var p threadPage
		h.call(http.MethodGet, path, nil, http.StatusOK, &p)
		if len(p.Threads) > 2 {
			t.Fatalf("limit=2 gave %d threads", len(p.Threads))
		}
		for _, th := range p.Threads {
			paged = append(paged, th.ThreadID)
		}
		if p.NextCursor == nil {
			break
		}
		path = "/api/threads?limit=2&cursor=" + *p.NextCursor
	}
	var want []string
	for _, th := range all.Threads {
		want = append(want, th.ThreadID)
	}
	if !slices.Equal(paged, want) {
		t.Errorf("paged %v, want %v", paged, want)
	}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("listed %v, created %v", want, ids)
	}

	for _, q := range []string{"limit=0", "limit=201", "limit=-1", "limit=abc", "limit=1.5", "cursor=not-a-cursor", "cursor=" + first.ThreadID, "q=two%0Alines", "q=%FF"} {
		h.wantError(t, h.do(http.MethodGet, "/api/threads?"+q, nil), http.StatusBadRequest, chat.CodeInvalidRequest)
	}
	var p threadPage
	h.call(http.MethodGet, "/api/threads?limit=200", nil, http.StatusOK, &p)
	if len(p.Threads) != 5 {
		t.Errorf("limit=200: %d threads", len(p.Threads))
	}
}

// TestRunHappyPath: a run streams deltas whose concatenation is the
// published message, with seqs and versions moving by one; the run, the
// checkpoints and the operations read back consistently.
func TestRunHappyPath(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("happy")
	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	r := h.call(http.MethodPost, "/api/threads/"+snap.ThreadID+"/runs",
		map[string]any{"expected_state_version": 1, "user_message": "How do B-trees keep lookups fast?"}, http.StatusCreated, nil)
	raw := rawFields(t, r.body)
	if len(raw) != 3 || raw["run_id"] == nil || raw["status"] == nil || raw["state_version"] == nil {
		t.Errorf("run.start answer %s, want exactly run_id, status, state_version", r.body)
	}
	var ack chat.RunStartAck
	json.Unmarshal(r.body, &ack)

	s.waitType(chat.EventRunCompleted, ack.RunID)
	all := s.events
	var types []string
	var user, assistant *chat.Message
	var deltas []*wireEvent
	for _, e := range all {
		if e.Type != chat.EventMessageDelta {
			types = append(types, e.Type)
		} else {
			deltas = append(deltas, e)
		}
		if e.Type == chat.EventMessagePublished {
			if e.Message.Role == chat.RoleUser {
				user = e.Message
			} else {
				assistant = e.Message
			}
		}
	}
	wantTypes := []string{
		chat.EventCheckpointCreated, // thread created
		chat.EventMessagePublished, chat.EventCheckpointCreated, chat.EventRunStarted,
		chat.EventMessagePublished, chat.EventCheckpointCreated, chat.EventRunCompleted,
	}
	if !slices.Equal(types, wantTypes) {
		t.Fatalf("durable events %v, want %v", types, wantTypes)
	}
	if len(deltas) == 0 || user == nil || assistant == nil {
		t.Fatalf("deltas %d, user %v, assistant %v", len(deltas), user, assistant)
	}
	if user.Content != "How do B-trees keep lookups fast?" || user.Kind != chat.KindText || user.RunID != nil {
		t.Errorf("user message %+v", user)
	}
	if assistant.Role != chat.RoleAssistant || assistant.Kind != chat.KindText || assistant.RunID == nil || *assistant.RunID != ack.RunID {
		t.Errorf("assistant message %+v", assistant)
	}
	var text strings.Builder
	for _, d := range deltas {
		if d.MessageID != assistant.MessageID || d.RunID != ack.RunID {
			t.Errorf("delta %v does not carry the published message id %s", d, assistant.MessageID)
		}
		text.WriteString(d.Text)
	}
	if text.String() != assistant.Content || len(strings.Fields(assistant.Content)) < 80 {
		t.Errorf("published %q, deltas %q", assistant.Content, text.String())
	}
	started := all[3]
	if started.Type != chat.EventRunStarted || started.StateVersion != ack.StateVersion || started.BaseCheckpointID != all[2].CheckpointID {
		t.Errorf("run.started %s; ack %+v", started.Data, ack)
	}

	after := h.snapshot(snap.ThreadID)
	last := all[len(all)-1]
	if after.StateVersion != last.StateVersion || after.LastSeq != last.Seq || after.ActiveRun != nil ||
		!slices.Equal(messageIDs(after.Messages), []string{user.MessageID, assistant.MessageID}) {
		t.Errorf("snapshot after the run: %+v", after)
	}
	if after.Messages[1].Content != assistant.Content {
		t.Errorf("history holds %q, published %q", after.Messages[1].Content, assistant.Content)
	}

	run := h.run(ack.RunID)
	if run.Status != chat.RunCompleted || run.ThreadID != snap.ThreadID || run.FinishedAt == nil || run.Error != nil ||
		run.CancelRequestedAt != nil || run.DiscardedStreamChars != 0 || run.Attempt != 1 || run.BaseCheckpointID != started.BaseCheckpointID {
		t.Errorf("run %+v", run)
	}

	cps := h.checkpoints(snap.ThreadID)
	if n := len(cps.Checkpoints); n != 3 || cps.HeadCheckpointID != cps.Checkpoints[n-1].CheckpointID || cps.HeadCheckpointID != after.HeadCheckpointID {
		t.Fatalf("checkpoints %+v", cps)
	}
	for i, cp := range cps.Checkpoints {
		if cp.ThreadID != snap.ThreadID {
			t.Errorf("checkpoint %s of thread %s", cp.CheckpointID, cp.ThreadID)
		}
		if i > 0 && (cp.ParentCheckpointID == nil || *cp.ParentCheckpointID != cps.Checkpoints[i-1].CheckpointID ||
			cp.StateVersion <= cps.Checkpoints[i-1].StateVersion) {
			t.Errorf("checkpoint %d not after %d: %+v", i, i-1, cp)
		}
	}
	mid, head := cps.Checkpoints[1], cps.Checkpoints[2]
	if mid.Pending == nil || mid.Pending.Step != chat.StepGenerate || !slices.Equal(mid.MessageIDs, []string{user.MessageID}) {
		t.Errorf("user checkpoint %+v", mid)
	}
	if head.Pending != nil || !slices.Equal(head.MessageIDs, []string{user.MessageID, assistant.MessageID}) ||
		!slices.Equal(head.CompletedSteps, []string{chat.StepGenerate}) {
		t.Errorf("head checkpoint %+v", head)
	}

	// Every object carries the protocol's fields (extra ones are allowed).
	requireKeys := func(what string, raw []byte, keys ...string) {
		t.Helper()
		m := rawFields(t, raw)
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("%s lacks %q: %s", what, k, raw)
			}
		}
	}
	requireKeys("run", h.call(http.MethodGet, "/api/runs/"+ack.RunID, nil, http.StatusOK, nil).body,
		"run_id", "thread_id", "status", "base_checkpoint_id", "resume_checkpoint_id", "cancel_requested_at", "cancel_reason",
		"requested_by", "discarded_stream_chars", "error", "attempt", "created_at", "finished_at")
	var rawCPs struct {
		Checkpoints []json.RawMessage `json:"checkpoints"`
	}
	json.Unmarshal(h.call(http.MethodGet, "/api/threads/"+snap.ThreadID+"/checkpoints", nil, http.StatusOK, nil).body, &rawCPs)
	for _, cp := range rawCPs.Checkpoints {
		requireKeys("checkpoint", cp, "checkpoint_id", "thread_id", "parent_checkpoint_id", "state_version", "message_ids",
			"completed_steps", "tool_results", "pending", "created_at")
	}
	var rawSnap struct {
		Messages []json.RawMessage `json:"messages"`
	}
	json.Unmarshal([]byte(h.snapshotBytes(snap.ThreadID)), &rawSnap)
	for _, m := range rawSnap.Messages {
		requireKeys("message", m, "message_id", "thread_id", "role", "kind", "content", "state_version", "checkpoint_id",
			"run_id", "fragment_of", "created_at")
	}
	var rawList struct {
		Threads []json.RawMessage `json:"threads"`
	}
	json.Unmarshal(h.call(http.MethodGet, "/api/threads", nil, http.StatusOK, nil).body, &rawList)
	for _, th := range rawList.Threads {
		requireKeys("thread", th, "thread_id", "title", "state_version", "head_checkpoint_id", "last_seq", "created_at", "updated_at")
	}

	r = h.call(http.MethodGet, "/api/threads/"+snap.ThreadID+"/operations", nil, http.StatusOK, nil)
	if strings.TrimSpace(string(r.body)) != `{"operations":[]}` {
		t.Errorf("operations %s", r.body)
	}
}

// TestFragments: a saved fragment is exactly the deltas up to last_seq,
// published as kind fragment without a run; deleting it leaves it out of
// history with message.deleted.
// TestStreamedText: GET /api/threads/{id}/streamed/{message_id}?last_seq=N
// answers what fragment.save would keep (the deltas up to N, exactly), or
// its error, and changes nothing.
func TestStreamedText(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	snap, s, ack, deltas := h.runUntilDeltas("Explain vector clocks", 4)
	msgID, upTo := deltas[0].MessageID, deltas[2].Seq
	path := func(threadID, messageID, query string) string {
		return "/api/threads/" + threadID + "/streamed/" + messageID + query
	}
	before := h.snapshot(snap.ThreadID)

	var got chat.StreamedText
	r := h.call(http.MethodGet, path(snap.ThreadID, msgID, fmt.Sprintf("?last_seq=%d", upTo)), nil, http.StatusOK, &got)
	want := s.text(msgID, upTo)
	if want == "" || got.Content != want || got.MessageID != msgID || got.RunID != ack.RunID || got.LastSeq != upTo ||
		got.Chars != int64(len([]rune(want))) || len(rawFields(t, r.body)) != 5 {
		t.Errorf("streamed text %s, want content %q", r.body, want)
	}
	if first := h.call(http.MethodGet, path(snap.ThreadID, msgID, fmt.Sprintf("?last_seq=%d", deltas[0].Seq)), nil, http.StatusOK, &got); got.Content != deltas[0].Text {
		t.Errorf("streamed text up to the first delta: %s, want %q", first.body, deltas[0].Text)
	}

	other := h.createThread("")
	for _, c := range []struct {
		name, path string
		status     int
		code       string
	}{
		{"no last_seq", path(snap.ThreadID, msgID, ""), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"last_seq not a number", path(snap.ThreadID, msgID, "?last_seq=x"), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"last_seq 0", path(snap.ThreadID, msgID, "?last_seq=0"), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"before the message's first delta", path(snap.ThreadID, msgID, fmt.Sprintf("?last_seq=%d", deltas[0].Seq-1)), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"beyond the thread's last event", path(snap.ThreadID, msgID, "?last_seq=99999"), http.StatusBadRequest, chat.CodeInvalidRequest},
		{"a published message", path(snap.ThreadID, before.Messages[0].MessageID, "?last_seq=2"), http.StatusNotFound, chat.CodeNotFound},
		{"an unknown message", path(snap.ThreadID, "msg_00000000000000000000000000", "?last_seq=2"), http.StatusNotFound, chat.CodeNotFound},
		{"a message id of no message", path(snap.ThreadID, "nope", "?last_seq=2"), http.StatusNotFound, chat.CodeNotFound},
		{"another thread", path(other.ThreadID, msgID, fmt.Sprintf("?last_seq=%d", upTo)), http.StatusNotFound, chat.CodeNotFound},
		{"an unknown thread", path("thr_00000000000000000000000000", msgID, fmt.Sprintf("?last_seq=%d", upTo)), http.StatusNotFound, chat.CodeNotFound},
	} {
		if r := h.do(http.MethodGet, c.path, nil); r.status != c.status {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.status, r.body, c.status, c.code)
		} else {
			h.wantError(t, r, c.status, c.code)
		}
	}
	if now := h.snapshot(snap.ThreadID); now.StateVersion != before.StateVersion || len(now.Messages) != len(before.Messages) {
		t.Errorf("asking for streamed text changed the thread: version %d → %d", before.StateVersion, now.StateVersion)
	}
	h.requireUnchanged(other)
	h.cancel(ack.RunID, nil)
	s.waitType(chat.EventRunCancelled, ack.RunID)
}

// TestBadInput: every malformed or wrong request is answered with the right
// code and status, changes nothing, and the server keeps serving.
func TestBadInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("main")
	runAck, reply := h.runToEnd(snap.ThreadID, 1, "short hello")
	other := h.createThread("other")
	cur := h.snapshot(snap.ThreadID)
	v := cur.StateVersion
	userMsg := cur.Messages[0].MessageID
	otherCP := other.HeadCheckpointID
	th := "/api/threads/" + snap.ThreadID
	runs := th + "/runs"
	valid := fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi"}`, v)
	long := strings.Repeat("x", 32769)
	huge := `{"expected_state_version":1,"user_message":"` + strings.Repeat("y", 1<<20) + `"}`

	type tc struct {
		name, method, path string
		body               any
		status             int
		code               string
	}
	const bad, nf = http.StatusBadRequest, http.StatusNotFound
	inv, notFound := chat.CodeInvalidRequest, chat.CodeNotFound
	cases := []tc{
		// run.start bodies
		{"malformed JSON", "POST", runs, `{"expected_state_version":`, bad, inv},
		{"not JSON", "POST", runs, `hello`, bad, inv},
		{"body is an array", "POST", runs, `[]`, bad, inv},
		{"array of objects", "POST", runs, `[` + valid + `]`, bad, inv},
		{"body is a string", "POST", runs, `"hi"`, bad, inv},
		{"body is null", "POST", runs, `null`, bad, inv},
		{"empty body", "POST", runs, ``, bad, inv},
		{"unknown field", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","colour":"red"}`, v), bad, inv},
		{"field in wrong case", "POST", runs, fmt.Sprintf(`{"Expected_State_Version":%d,"user_message":"hi"}`, v), bad, inv},
		{"version as string", "POST", runs, fmt.Sprintf(`{"expected_state_version":"%d","user_message":"hi"}`, v), bad, inv},
		{"version fractional", "POST", runs, `{"expected_state_version":1.5,"user_message":"hi"}`, bad, inv},
		{"version negative", "POST", runs, `{"expected_state_version":-1,"user_message":"hi"}`, bad, inv},
		{"user_message as number", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":5}`, v), bad, inv},
		{"user_message as object", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":{"text":"hi"}}`, v), bad, inv},
		{"missing version", "POST", runs, `{"user_message":"hi"}`, bad, inv},
		{"null version", "POST", runs, `{"expected_state_version":null,"user_message":"hi"}`, bad, inv},
		{"empty user_message", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":""}`, v), bad, inv},
		{"user_message 32769 bytes", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"%s"}`, v, long), bad, inv},
		{"trailing garbage", "POST", runs, valid + ` x`, bad, inv},
		{"trailing brace", "POST", runs, valid + `}`, bad, inv},
		{"trailing bracket", "POST", runs, valid + ` ]`, bad, inv},
		{"two objects", "POST", runs, valid + valid, bad, inv},
		{"body over 1 MiB", "POST", runs, huge, bad, inv},
		{"duplicate key", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","user_message":"other"}`, v), bad, inv},
		{"duplicate version", "POST", runs, fmt.Sprintf(`{"expected_state_version":1,"user_message":"hi","expected_state_version":%d}`, v), bad, inv},
		{"duplicate key, escaped", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","user_m\u0065ssage":"other"}`, v), bad, inv},
		{"empty client_request_id", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","client_request_id":""}`, v), bad, inv},
		{"long client_request_id", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","client_request_id":"%s"}`, v, strings.Repeat("c", 129)), bad, inv},
		{"empty resume checkpoint", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"resume_from_checkpoint_id":""}`, v), bad, inv},
		{"resume from another thread's checkpoint", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"resume_from_checkpoint_id":%q,"user_message":"hi"}`, v, otherCP), nf, chat.CodeCheckpointNotFound},
		{"resume from unknown checkpoint", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"resume_from_checkpoint_id":"cp_00000000000000000000000000"}`, v), nf, chat.CodeCheckpointNotFound},
		{"stale version", "POST", runs, `{"expected_state_version":1,"user_message":"hi"}`, http.StatusConflict, chat.CodeStateVersionConflict},
		{"future version", "POST", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi"}`, v+10), http.StatusConflict, chat.CodeStateVersionConflict},
		{"run.start on unknown thread", "POST", "/api/threads/thr_00000000000000000000000000/runs", valid, nf, notFound},
		{"run.start on a run id", "POST", "/api/threads/" + runAck.RunID + "/runs", valid, nf, notFound},
		{"validation before ids", "POST", "/api/threads/thr_00000000000000000000000000/runs", `{"user_message":"hi"}`, bad, inv},

		// threads
		{"title over 200 bytes", "POST", "/api/threads", `{"title":"` + strings.Repeat("t", 201) + `"}`, bad, inv},
		{"title over 200 bytes in UTF-8", "POST", "/api/threads", `{"title":"` + strings.Repeat("é", 101) + `"}`, bad, inv},
		{"empty title", "POST", "/api/threads", `{"title":""}`, bad, inv},
		{"title as number", "POST", "/api/threads", `{"title":5}`, bad, inv},
		{"title twice", "POST", "/api/threads", `{"title":"a","title":"b"}`, bad, inv},
		{"title with a line break", "POST", "/api/threads", `{"title":"two\nlines"}`, bad, inv},
		{"title with NUL", "POST", "/api/threads", `{"title":"a\u0000b"}`, bad, inv},
		{"title with an escape sequence", "POST", "/api/threads", `{"title":"\u001b[31mred"}`, bad, inv},
		{"title with DEL", "POST", "/api/threads", `{"title":"del\u007f"}`, bad, inv},
		{"title with a bidi override", "POST", "/api/threads", `{"title":"invoice\u202efdp.exe"}`, bad, inv},
		{"title only spaces", "POST", "/api/threads", `{"title":"   "}`, bad, inv},
		{"thread unknown field", "POST", "/api/threads", `{"name":"x"}`, bad, inv},
		{"thread body array", "POST", "/api/threads", `[]`, bad, inv},
		{"thread trailing garbage", "POST", "/api/threads", `{"title":"x"} {`, bad, inv},
		{"unknown thread", "GET", "/api/threads/thr_00000000000000000000000000", nil, nf, notFound},
		{"run id as thread", "GET", "/api/threads/" + runAck.RunID, nil, nf, notFound},
		{"garbage thread id", "GET", "/api/threads/thr_'%20OR%201=1", nil, nf, notFound},
		{"checkpoints of unknown thread", "GET", "/api/threads/thr_00000000000000000000000000/checkpoints", nil, nf, notFound},
		{"operations of unknown thread", "GET", "/api/threads/thr_00000000000000000000000000/operations", nil, nf, notFound},
		{"operations of a message id", "GET", "/api/threads/" + userMsg + "/operations", nil, nf, notFound},

		// runs
		{"unknown run", "GET", "/api/runs/run_00000000000000000000000000", nil, nf, notFound},
		{"thread id as run", "GET", "/api/runs/" + snap.ThreadID, nil, nf, notFound},
		{"cancel unknown run", "POST", "/api/runs/run_00000000000000000000000000/cancel", nil, nf, notFound},
		{"cancel a thread id", "POST", "/api/runs/" + snap.ThreadID + "/cancel", `{}`, nf, notFound},
		{"cancel with empty reason", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"reason":""}`, bad, inv},
		{"cancel with long reason", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"reason":"` + strings.Repeat("r", 201) + `"}`, bad, inv},
		{"cancel with version as string", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"expected_state_version":"3"}`, bad, inv},
		{"cancel with unknown field", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"why":"x"}`, bad, inv},
		{"cancel with array", "POST", "/api/runs/" + runAck.RunID + "/cancel", `[]`, bad, inv},
		{"cancel malformed", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{`, bad, inv},
		{"cancel a completed run", "POST", "/api/runs/" + runAck.RunID + "/cancel", `{"reason":"late"}`, http.StatusConflict, chat.CodeRunNotActive},

		// fragments, drafts, fork
		{"fragment of a published message", "POST", th + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":2,"expected_state_version":%d}`, userMsg, v), nf, notFound},
		{"fragment with last_seq 0", "POST", th + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":0,"expected_state_version":%d}`, reply.MessageID, v), bad, inv},
		{"fragment beyond the last seq", "POST", th + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":%d,"expected_state_version":%d}`, reply.MessageID, cur.LastSeq+1, v), bad, inv},
		{"fragment with last_seq as string", "POST", th + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":"9","expected_state_version":%d}`, reply.MessageID, v), bad, inv},
		{"delete a published text message", "POST", th + "/drafts/" + reply.MessageID + "/delete", fmt.Sprintf(`{"expected_state_version":%d}`, v), bad, inv},
		{"delete without body", "POST", th + "/drafts/" + reply.MessageID + "/delete", nil, bad, inv},
		{"delete unknown message", "POST", th + "/drafts/msg_00000000000000000000000000/delete", fmt.Sprintf(`{"expected_state_version":%d}`, v), nf, notFound},
		{"delete another thread's message", "POST", "/api/threads/" + other.ThreadID + "/drafts/" + reply.MessageID + "/delete", `{"expected_state_version":1}`, nf, notFound},
		{"fork from another thread's checkpoint", "POST", th + "/fork", fmt.Sprintf(`{"from_checkpoint_id":%q}`, otherCP), nf, chat.CodeCheckpointNotFound},
		{"fork with unknown field", "POST", th + "/fork", `{"checkpoint_id":"x"}`, bad, inv},

		// routing
		{"unknown API path", "GET", "/api/nope", nil, nf, notFound},
		{"unknown nested path", "POST", th + "/archive", `{}`, nf, notFound},
		{"wrong method", "PUT", th, nil, nf, notFound},
		{"list with bad limit", "GET", "/api/threads?limit=0", nil, bad, inv},
	}

	nThreads := h.threadCount("")
	mainBefore, otherBefore := h.snapshotBytes(snap.ThreadID), h.snapshotBytes(other.ThreadID)
	runBefore := string(h.call(http.MethodGet, "/api/runs/"+runAck.RunID, nil, http.StatusOK, nil).body)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := h.with(t)
			r := h.do(c.method, c.path, c.body)
			h.wantError(t, r, c.status, c.code)
			if got := h.snapshotBytes(snap.ThreadID); got != mainBefore {
				t.Errorf("the main thread changed: now %.200s", got)
				mainBefore = got // report each change once
			}
			if got := h.snapshotBytes(other.ThreadID); got != otherBefore {
				t.Errorf("the other thread changed")
			}
			if got := string(h.call(http.MethodGet, "/api/runs/"+runAck.RunID, nil, http.StatusOK, nil).body); got != runBefore {
				t.Errorf("the run changed:\n%s\n%s", runBefore, got)
			}
			if n := h.threadCount(""); n != nThreads {
				t.Errorf("%d threads, want %d", n, nThreads)
			}
		})
	}
	// The conflict names what the refused command was based on.
	body := h.wantError(t, h.do(http.MethodPost, runs, `{"expected_state_version":1,"user_message":"hi"}`), http.StatusConflict, chat.CodeStateVersionConflict)
	if body["current_state_version"] != float64(v) || body["current_checkpoint_id"] != cur.HeadCheckpointID {
		t.Errorf("conflict body %v", body)
	}
	if acts, _ := body["allowed_actions"].([]any); !slices.Equal(acts, []any{"reload", "fork_from_" + h.checkpoints(snap.ThreadID).Checkpoints[0].CheckpointID}) {
		t.Errorf("allowed_actions %v", body["allowed_actions"])
	}
}

// TestLimitsAccepted: the largest accepted user message and title pass.
func TestLimitsAccepted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	titled := h.createThread(strings.Repeat("t", 200))
	if len(titled.Title) != 200 {
		t.Errorf("title of 200 bytes stored as %d", len(titled.Title))
	}
	msg := strings.Repeat("word ", 32768/5) + strings.Repeat("z", 32768%5)
	if len(msg) != 32768 {
		t.Fatalf("message is %d bytes", len(msg))
	}
	h.runToEnd(titled.ThreadID, 1, msg)
	if got := h.snapshot(titled.ThreadID); len(got.Messages) != 2 || got.Messages[0].Content != msg {
		t.Errorf("32768-byte message not kept intact")
	}
	// Cancelling with an empty body and with {} is fine.
	h.model.setPace(50 * time.Millisecond)
	cur := h.snapshot(titled.ThreadID)
	s := h.openSSE(titled.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	ack := h.startRun(titled.ThreadID, cur.StateVersion, "again please")
	s.waitDeltas(ack.RunID, 1)
	if a := h.cancel(ack.RunID, `{}`); a.AlreadyRequested || a.Status != chat.RunCancelRequested {
		t.Errorf("cancel with {}: %+v", a)
	}
	if a := h.cancel(ack.RunID, nil); !a.AlreadyRequested {
		t.Errorf("second cancel without body: %+v", a)
	}
	s.waitType(chat.EventRunCancelled, ack.RunID)
}

// TestPurgedStream: once the deltas are gone from the stream buffer a
// fragment cannot be cut (410) and a replay that needs them starts from a
// snapshot; durable-only ranges still replay.
func TestPurgedStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	_, msg := h.runToEnd(snap.ThreadID, 1, "short question")
	cur := h.snapshot(snap.ThreadID)
	n, err := h.st.Retention().PurgeStream(context.Background(), time.Now().Add(time.Hour))
	if err != nil || n == 0 {
		t.Fatalf("purge: %d deltas, %v", n, err)
	}

	r := h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/fragments",
		map[string]any{"message_id": msg.MessageID, "last_seq": cur.LastSeq - 3, "expected_state_version": cur.StateVersion})
	h.wantError(t, r, http.StatusGone, chat.CodeFragmentUnavailable)
	h.requireUnchanged(cur)

	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	s.lastSeq = -1 // the gap cannot be filled: a snapshot comes first
	if first := s.next(); first.Type != chat.EventThreadSnapshot || first.Seq != cur.LastSeq || len(first.Messages) != 2 {
		t.Errorf("replay over purged deltas began with %v", first)
	}
	// The last three events are durable: they still replay exactly.
	s = h.openSSE(snap.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq-3, 10), "")
	got := s.waitSeq(cur.LastSeq)
	if len(got) != 3 || got[0].Type != chat.EventMessagePublished || got[2].Type != chat.EventRunCompleted {
		t.Errorf("durable replay: %v", got)
	}
}

// TestShutdownHandsRunBack: closing the engine mid-stream publishes nothing
// and leaves the run queued for the next process; the database audit holds.
func TestShutdownHandsRunBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 50*time.Millisecond)
	snap, s, ack, _ := h.runUntilDeltas("Explain consistent hashing", 2)
	h.eng.Close() // the harness closes it again, which is harmless
	run := h.run(ack.RunID)
	if run.Status != chat.RunQueued || run.FinishedAt != nil || run.CancelRequestedAt != nil {
		t.Errorf("run after shutdown: %+v", run)
	}
	after := h.snapshot(snap.ThreadID)
	if len(after.Messages) != 1 || after.ActiveRun == nil || after.ActiveRun.RunID != ack.RunID {
		t.Errorf("snapshot after shutdown: %+v", after)
	}
	for _, e := range s.events {
		if e.Type == chat.EventMessagePublished && e.RunID == ack.RunID {
			t.Errorf("shutdown published %v", e)
		}
	}
}
