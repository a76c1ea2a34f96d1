package gateway_test

// Tool flows end to end through the gateway: the demo model with the real
// tools (catalog_search, send_email over the embedded outbox sharing the
// SQLite file), driven over HTTP, Server-Sent Events and WebSocket.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/catalog"
	"github.com/honestcancel/gateway/tools/email"
)

// ---- tests ----

// TestToolsEmailConfirm: an email is drafted, shown and held for a
// decision; confirmed over HTTP it is sent once under its business key,
// the result is published as a tool message and the model answers it.
func TestToolsEmailConfirm(t *testing.T) {
	t.Parallel()
	h := newToolHarness(t, time.Millisecond, email.OutboxConfig{})
	th, s := h.threadWithStream("email")
	ack, op, evs := h.askEmail(s, th, "ann@example.com", "Please send an email to ann@example.com about the delivery schedule for next week")
	key := *op.IdempotencyKey

	// Before the decision: the request and the draft's words, nothing sent.
	if got := roles(published(evs)); got != "user assistant" {
		t.Fatalf("published before the decision: %q, want user assistant", got)
	}
	if draft := published(evs)[1]; !strings.Contains(draft.Content, "confirm") || draft.Kind != chat.KindText {
		t.Errorf("the model's words before the call: %+v", draft)
	}
	listed := h.onlyOp(th)
	if listed.OperationID != op.OperationID || listed.Phase != chat.PhasePrepared || *listed.IdempotencyKey != key ||
		string(listed.Preview) != string(op.Preview) || listed.Outcome != nil || listed.ResultRef != nil {
		t.Errorf("GET operations: %+v, want the prepared %+v", listed, op)
	}
	snap := h.snapshot(th)
	if snap.ActiveRun == nil || snap.ActiveRun.RunID != ack.RunID || snap.ActiveRun.Status != chat.RunWaitingConfirmation {
		t.Errorf("active_run while waiting: %+v", snap.ActiveRun)
	}
	if r := h.run(ack.RunID); r.Status != chat.RunWaitingConfirmation {
		t.Errorf("run while waiting: %s", r.Status)
	}
	h.wantNothingSent(t, key)
	if n := len(h.attempts("")); n != 0 {
		t.Errorf("the provider saw %d calls before the confirmation", n)
	}

	ca := h.decideOK(th, op.OperationID, true)
	evs = waitRunEnd(t, s, ack.RunID, chat.EventRunCompleted)
	if got := opPhases(t, evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseConfirmed, chat.PhaseCommitting, chat.PhaseCommitted}) {
		t.Fatalf("tool.updated phases %v, want confirmed committing committed", got)
	}
	if i := indexOf(evs, func(e *wireEvent) bool { return e.Type == chat.EventToolUpdated }); i < 0 || evs[i].StateVersion != ca.StateVersion {
		t.Errorf("the confirm's tool.updated does not carry the ack's state_version %d", ca.StateVersion)
	}
	msgs := published(evs)
	if got := roles(msgs); got != "tool assistant" {
		t.Fatalf("published after the confirmation: %q, want tool assistant", got)
	}
	committed := eventOp(t, filter(evs, func(e *wireEvent) bool { return e.Type == chat.EventToolUpdated })[2])
	if committed.Outcome == nil || *committed.Outcome != chat.OutcomeCommitted || committed.ResultRef == nil || *committed.ResultRef != msgs[0].MessageID {
		t.Errorf("committed operation %+v, want outcome committed and result_ref %s", committed, msgs[0].MessageID)
	}
	rec := decodeToolMessage(t, msgs[0])
	var res email.EmailResult
	if err := json.Unmarshal(rec.Result, &res); err != nil || res.Status != "committed" || res.Key != key || !strings.HasPrefix(res.ProviderID, "prov_") {
		t.Errorf("tool result %s (%v)", rec.Result, err)
	}
	if rec.Tool != "send_email" || rec.OperationID != op.OperationID || msgs[0].RunID == nil || *msgs[0].RunID != ack.RunID {
		t.Errorf("tool message %+v", msgs[0])
	}
	if answer := msgs[1]; !strings.Contains(answer.Content, "handed to the provider") || !strings.Contains(answer.Content, res.ProviderID) {
		t.Errorf("the model's answer %q does not say the email was sent", answer.Content)
	}
	isMsg := func(id string) func(*wireEvent) bool {
		return func(e *wireEvent) bool { return e.Type == chat.EventMessagePublished && e.Message.MessageID == id }
	}
	iCommitted := indexOf(evs, func(e *wireEvent) bool {
		return e.Type == chat.EventToolUpdated && eventOp(t, e).Phase == chat.PhaseCommitted
	})
	if iTool, iAnswer := indexOf(evs, isMsg(msgs[0].MessageID)), indexOf(evs, isMsg(msgs[1].MessageID)); !(iCommitted < iTool && iTool < iAnswer && iAnswer < len(evs)-1) {
		t.Errorf("order: committed #%d, tool message #%d, answer #%d, run.completed #%d", iCommitted, iTool, iAnswer, len(evs)-1)
	}

	final := h.snapshot(th)
	if got := roles(final.Messages); got != "user assistant tool assistant" || final.ActiveRun != nil {
		t.Errorf("history %q, active_run %+v", got, final.ActiveRun)
	}
	if got := h.onlyOp(th); got.Phase != chat.PhaseCommitted || got.Outcome == nil || *got.Outcome != chat.OutcomeCommitted ||
		got.ResultRef == nil || *got.ResultRef != msgs[0].MessageID {
		t.Errorf("operation after the commit: %+v", got)
	}
	if r := h.run(ack.RunID); r.Status != chat.RunCompleted {
		t.Errorf("run %s, want completed", r.Status)
	}
	h.wantSentOnce(t, key)
	if acc := h.accepted(); len(acc) != 1 {
		t.Errorf("accepted keys %v, want only %s", acc, key)
	}
}

// TestToolsDecisionErrors: refused decisions over HTTP answer the protocol's
// code and status and change nothing; a reject sends nothing; a cancel
// while waiting voids the intent.
func TestToolsDecisionErrors(t *testing.T) {
	t.Parallel()
	h := newToolHarness(t, time.Millisecond, email.OutboxConfig{})
	a, sA := h.threadWithStream("a")
	ackA, opA, _ := h.askEmail(sA, a, "ann@example.com", "Send an email to ann@example.com about the invoice")
	b, sB := h.threadWithStream("b")
	ackB, opB, evsB := h.askEmail(sB, b, "bob@example.com", "Write an email to bob@example.com about the meeting agenda")

	// B moves on while its email waits (a saved fragment of the draft's
	// words): a tab still at the old version is stale.
	staleB := h.snapshot(b).StateVersion
	draft := published(evsB)[1]
	firstDelta := filter(evsB, func(e *wireEvent) bool { return e.Type == chat.EventMessageDelta && e.MessageID == draft.MessageID })[0]
	h.call(http.MethodPost, "/api/threads/"+b+"/fragments", map[string]any{
		"message_id": draft.MessageID, "last_seq": firstDelta.Seq, "expected_state_version": staleB,
	}, http.StatusCreated, nil)
	snapA, snapB := h.snapshot(a), h.snapshot(b)
	sB.catchUp(snapB.LastSeq)
	curA, curB := snapA.StateVersion, snapB.StateVersion
	if curA == curB || curB <= staleB {
		t.Fatalf("versions A %d, B %d (stale %d): the test needs them apart", curA, curB, staleB)
	}

	const inv, nf, conflict = chat.CodeInvalidRequest, chat.CodeNotFound, chat.CodeStateVersionConflict
	q := fmt.Sprintf
	cases := []struct {
		name    string
		op      string
		confirm bool
		body    any
		status  int
		code    string
	}{
		{"no body", opA.OperationID, true, nil, 400, inv},
		{"empty object", opA.OperationID, true, `{}`, 400, inv},
		{"null version", opA.OperationID, true, `{"expected_state_version":null}`, 400, inv},
		{"version as string", opA.OperationID, true, q(`{"expected_state_version":"%d"}`, curA), 400, inv},
		{"fractional version", opA.OperationID, true, `{"expected_state_version":1.5}`, 400, inv},
		{"negative version", opA.OperationID, true, `{"expected_state_version":-1}`, 400, inv},
		{"version as bool", opA.OperationID, false, `{"expected_state_version":true}`, 400, inv},
		{"unknown field", opA.OperationID, true, q(`{"expected_state_version":%d,"confirm":true}`, curA), 400, inv},
		{"field name in another case", opA.OperationID, true, q(`{"Expected_State_Version":%d}`, curA), 400, inv},
		{"malformed JSON", opA.OperationID, true, `{"expected_state_version":`, 400, inv},
		{"JSON array", opA.OperationID, false, q(`[{"expected_state_version":%d}]`, curA), 400, inv},
		{"two objects", opA.OperationID, true, q(`{"expected_state_version":%d} {}`, curA), 400, inv},
		{"reject without a version", opA.OperationID, false, `{}`, 400, inv},
		{"unknown operation without a version (validation first)", unknownOp, true, `{}`, 400, inv},
		{"unknown operation", unknownOp, true, map[string]any{"expected_state_version": curA}, 404, nf},
		{"unknown operation, reject", unknownOp, false, map[string]any{"expected_state_version": curA}, 404, nf},
		{"a run id as operation", ackA.RunID, true, map[string]any{"expected_state_version": curA}, 404, nf},
		{"a thread id as operation", a, false, map[string]any{"expected_state_version": curA}, 404, nf},
		{"B's op at B's old version", opB.OperationID, true, map[string]any{"expected_state_version": staleB}, 409, conflict},
		{"B's op at B's old version, reject", opB.OperationID, false, map[string]any{"expected_state_version": staleB}, 409, conflict},
		{"B's op at A's version", opB.OperationID, true, map[string]any{"expected_state_version": curA}, 409, conflict},
		{"B's op at a future version", opB.OperationID, true, map[string]any{"expected_state_version": curB + 5}, 409, conflict},
		{"A's op at B's version", opA.OperationID, false, map[string]any{"expected_state_version": curB}, 409, conflict},
	}
	qt := h.quiet(a, b)
	for _, tc := range cases {
		body := h.wantError(t, h.decide(tc.op, tc.confirm, tc.body), tc.status, tc.code)
		if tc.code == conflict {
			owner := snapB
			if tc.op == opA.OperationID {
				owner = snapA
			}
			acts, _ := body["allowed_actions"].([]any)
			if body["current_state_version"] != float64(owner.StateVersion) || body["current_checkpoint_id"] != owner.HeadCheckpointID ||
				!slices.Contains(acts, any("reload")) {
				t.Errorf("%s: conflict body %v, want the operation's thread at %d / %s and reload", tc.name, body, owner.StateVersion, owner.HeadCheckpointID)
			}
		}
		if tc.code == nf && strings.Contains(fmt.Sprint(body), opA.OperationID) {
			t.Errorf("%s: not_found reveals another operation: %v", tc.name, body)
		}
		qt.check(t, tc.name)
	}
	if r := h.run(ackA.RunID); r.Status != chat.RunWaitingConfirmation {
		t.Errorf("run A after refused decisions: %s", r.Status)
	}

	// Reject A: nothing is sent, the result says so, the model says so.
	h.decideOK(a, opA.OperationID, false)
	evs := waitRunEnd(t, sA, ackA.RunID, chat.EventRunCompleted)
	if got := opPhases(t, evs, opA.OperationID); !slices.Equal(got, []string{chat.PhaseRejected}) {
		t.Errorf("tool.updated phases after the reject %v, want rejected", got)
	}
	msgs := published(evs)
	if got := roles(msgs); got != "tool assistant" {
		t.Fatalf("published after the reject: %q", got)
	}
	if rec := decodeToolMessage(t, msgs[0]); string(rec.Result) != `{"status":"rejected"}` {
		t.Errorf("tool result after the reject: %s", rec.Result)
	}
	if !strings.Contains(msgs[1].Content, "did not send") {
		t.Errorf("the model's answer after the reject: %q", msgs[1].Content)
	}
	if op := h.onlyOp(a); op.Phase != chat.PhaseRejected || op.Outcome == nil || *op.Outcome != chat.OutcomeNotStarted {
		t.Errorf("rejected operation %+v", op)
	}
	h.wantNothingSent(t, *opA.IdempotencyKey)
	h.wantDecided(t, opA.OperationID, a, chat.PhaseRejected, "after the reject", a, b)

	// Confirm B at its current version; a second click at once is refused
	// (by version while the commit moves the thread, then as not pending),
	// never accepted.
	h.decideOK(b, opB.OperationID, true)
	for try, v := 0, h.snapshot(b).StateVersion; ; try++ {
		r := h.decide(opB.OperationID, true, map[string]any{"expected_state_version": v})
		body := rawFields(t, r.body)
		if r.status == http.StatusConflict && strings.Contains(string(body["error"]), conflict) && try < 50 {
			json.Unmarshal(body["current_state_version"], &v)
			continue
		}
		var phase string
		json.Unmarshal(body["phase"], &phase)
		h.wantNotPending(t, r, opB.OperationID, phase)
		if phase == chat.PhasePrepared {
			t.Errorf("a second confirm found the operation still prepared")
		}
		break
	}
	evs = waitRunEnd(t, sB, ackB.RunID, chat.EventRunCompleted)
	if got := opPhases(t, evs, opB.OperationID); !slices.Equal(got, []string{chat.PhaseConfirmed, chat.PhaseCommitting, chat.PhaseCommitted}) {
		t.Errorf("tool.updated phases of B %v", got)
	}
	h.wantSentOnce(t, *opB.IdempotencyKey)
	h.wantDecided(t, opB.OperationID, b, chat.PhaseCommitted, "after the commit", a, b)
	h.wantSentOnce(t, *opB.IdempotencyKey)

	// Cancel while waiting: the intent is voided; a late decision finds
	// nothing to decide.
	c, sC := h.threadWithStream("c")
	ackC, opC, _ := h.askEmail(sC, c, "cy@example.com", "Draft an email to cy@example.com about the refund")
	h.cancel(ackC.RunID, nil)
	evs = waitRunEnd(t, sC, ackC.RunID, chat.EventRunCancelled)
	if got := opPhases(t, evs, opC.OperationID); !slices.Equal(got, []string{chat.PhaseVoided}) {
		t.Errorf("tool.updated phases after the cancel %v, want voided", got)
	}
	receipt := evs[len(evs)-1]
	if want := []chat.OperationOutcome{{OperationID: opC.OperationID, Tool: "send_email", Phase: chat.PhaseVoided, Outcome: chat.OutcomeNotStarted}}; !slices.Equal(receipt.Operations, want) {
		t.Errorf("run.cancelled operations %+v, want %+v", receipt.Operations, want)
	}
	if n := len(published(evs)); n != 0 {
		t.Errorf("the cancel published %d messages", n)
	}
	h.wantDecided(t, opC.OperationID, c, chat.PhaseVoided, "after the cancel", a, b, c)
	if r := h.run(ackC.RunID); r.Status != chat.RunCancelled {
		t.Errorf("run C %s, want cancelled", r.Status)
	}
	h.wantNothingSent(t, *opC.IdempotencyKey)
	if acc := h.accepted(); len(acc) != 1 {
		t.Errorf("accepted keys %v, want only B's", acc)
	}
}

// wsOp decodes the operation of a tool.* WebSocket event.
func wsOp(t *testing.T, m map[string]any) chat.Operation {
	t.Helper()
	b, _ := json.Marshal(m["operation"])
	var op chat.Operation
	if err := json.Unmarshal(b, &op); err != nil || op.OperationID == "" {
		t.Fatalf("event without an operation: %v", m)
	}
	return op
}

// wsAskEmail starts a run over the WebSocket and waits until it waits for
// the decision.
func (h *toolHarness) wsAskEmail(c *wsClient, threadID, to, text string) (string, chat.Operation) {
	h.t.Helper()
	ack := c.ack(map[string]any{"type": "run.start", "thread_id": threadID, "expected_state_version": h.snapshot(threadID).StateVersion, "user_message": text})
	runID := wsStr(ack, "run_id")
	op := wsOp(h.t, c.untilEvent(threadID, chat.EventToolPrepared, runID))
	wantEmailOp(h.t, op, threadID, runID, to)
	if w := c.untilEvent(threadID, chat.EventRunWaitingConfirmation, runID); w["operation_id"] != op.OperationID {
		h.t.Errorf("run.waiting_confirmation %v, want operation %s", w, op.OperationID)
	}
	return runID, op
}

// wsPhases lists the phases of the tool.updated events of opID applied on
// the connection.
func wsPhases(t *testing.T, c *wsClient, threadID, opID string) []string {
	t.Helper()
	var out []string
	for _, it := range c.view(threadID).events {
		if it.m["type"] == chat.EventToolUpdated {
			if op := wsOp(t, it.m); op.OperationID == opID {
				out = append(out, op.Phase)
			}
		}
	}
	return out
}

// TestToolsDecisionsWS: tool.confirm and tool.reject over the WebSocket:
// refusals carry re and the protocol code and change nothing; a confirm's
// ack comes before the events it caused; a reject and a cancel send
// nothing.
func TestToolsDecisionsWS(t *testing.T) {
	t.Parallel()
	h := newToolHarness(t, time.Millisecond, email.OutboxConfig{}, withWS(gateway.WSConfig{CommandRate: 1000, CommandBurst: 1000}))
	c := h.dial(t)
	th := h.createThread("ws email").ThreadID
	c.subscribe(th, wsAfter(0))
	runID, op := h.wsAskEmail(c, th, "ann@example.com", "Send an email to ann@example.com about the quote")
	snap := h.snapshot(th)
	v := snap.StateVersion
	qf := fmt.Sprintf
	const inv, nf, conflict = chat.CodeInvalidRequest, chat.CodeNotFound, chat.CodeStateVersionConflict
	cases := []struct{ name, frame, re, code string }{
		{"confirm without operation_id", qf(`{"type":"tool.confirm","id":"d1","expected_state_version":%d}`, v), "d1", inv},
		{"confirm with an empty operation_id", qf(`{"type":"tool.confirm","id":"d2","operation_id":"","expected_state_version":%d}`, v), "d2", inv},
		{"confirm with operation_id as number", qf(`{"type":"tool.confirm","id":"d3","operation_id":7,"expected_state_version":%d}`, v), "d3", inv},
		{"confirm without expected_state_version", qf(`{"type":"tool.confirm","id":"d4","operation_id":%q}`, op.OperationID), "d4", inv},
		{"confirm with version as string", qf(`{"type":"tool.confirm","id":"d5","operation_id":%q,"expected_state_version":"%d"}`, op.OperationID, v), "d5", inv},
		{"confirm with a fractional version", qf(`{"type":"tool.confirm","id":"d6","operation_id":%q,"expected_state_version":1.5}`, op.OperationID), "d6", inv},
		{"confirm with a negative version", qf(`{"type":"tool.confirm","id":"d7","operation_id":%q,"expected_state_version":-3}`, op.OperationID), "d7", inv},
		{"confirm with a null version", qf(`{"type":"tool.confirm","id":"d8","operation_id":%q,"expected_state_version":null}`, op.OperationID), "d8", inv},
		{"confirm with an unknown field", qf(`{"type":"tool.confirm","id":"d9","operation_id":%q,"expected_state_version":%d,"force":true}`, op.OperationID, v), "d9", inv},
		{"reject without expected_state_version", qf(`{"type":"tool.reject","id":"d10","operation_id":%q}`, op.OperationID), "d10", inv},
		{"reject with version as string", qf(`{"type":"tool.reject","id":"d11","operation_id":%q,"expected_state_version":"x"}`, op.OperationID), "d11", inv},
		{"type in another case", qf(`{"type":"Tool.Confirm","id":"d12","operation_id":%q,"expected_state_version":%d}`, op.OperationID, v), "d12", inv},
		{"confirm of an unknown operation", qf(`{"type":"tool.confirm","id":"d13","operation_id":%q,"expected_state_version":%d}`, unknownOp, v), "d13", nf},
		{"reject of an unknown operation", qf(`{"type":"tool.reject","id":"d14","operation_id":%q,"expected_state_version":%d}`, unknownOp, v), "d14", nf},
		{"confirm of a run id", qf(`{"type":"tool.confirm","id":"d15","operation_id":%q,"expected_state_version":%d}`, runID, v), "d15", nf},
		{"confirm at a stale version", qf(`{"type":"tool.confirm","id":"d16","operation_id":%q,"expected_state_version":%d}`, op.OperationID, v-1), "d16", conflict},
		{"reject at a stale version", qf(`{"type":"tool.reject","id":"d17","operation_id":%q,"expected_state_version":%d}`, op.OperationID, v-1), "d17", conflict},
		{"confirm at a future version", qf(`{"type":"tool.confirm","id":"d18","operation_id":%q,"expected_state_version":%d}`, op.OperationID, v+1), "d18", conflict},
	}
	qt := h.quiet(th)
	for _, tc := range cases {
		c.sendRaw(websocket.MessageText, []byte(tc.frame))
		m := c.answer(tc.re)
		if m["type"] != "error" || m["error"] != tc.code || m["re"] != tc.re {
			t.Errorf("%s: answered %v, want error %s with re %s", tc.name, m, tc.code, tc.re)
		}
		if tc.code == conflict && (wsNum(m, "current_state_version") != v || m["current_checkpoint_id"] != snap.HeadCheckpointID) {
			t.Errorf("%s: conflict %v, want current %d / %s", tc.name, m, v, snap.HeadCheckpointID)
		}
		qt.check(t, tc.name)
	}
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("refused decisions emitted %v", extra)
	}

	// Confirm: the ack first, then what it caused.
	id := c.post(map[string]any{"type": "tool.confirm", "operation_id": op.OperationID, "expected_state_version": v})
	a := c.answer(id)
	wsWantKeys(t, "tool.confirm ack", a, "type", "re", "operation_id", "phase", "state_version")
	if a["type"] != "ack" || a["operation_id"] != op.OperationID || a["phase"] != chat.PhaseConfirmed || wsNum(a, "state_version") != v+1 {
		t.Fatalf("tool.confirm answered %v", a)
	}
	c.untilEvent(th, chat.EventRunCompleted, runID)
	if n := c.causedAfter(id, func(m map[string]any) bool { return m["run_id"] == runID && m["type"] == chat.EventToolUpdated }); n != 3 {
		t.Errorf("%d tool.updated events after the confirm, want 3", n)
	}
	if got := wsPhases(t, c, th, op.OperationID); !slices.Equal(got, []string{chat.PhaseConfirmed, chat.PhaseCommitting, chat.PhaseCommitted}) {
		t.Errorf("tool.updated phases %v", got)
	}
	h.wantSentOnce(t, *op.IdempotencyKey)

	// Decisions after the commit: operation_not_pending, with re.
	h.wsWantDecided(t, c, op.OperationID, th, chat.PhaseCommitted, "after the commit")
	h.wantSentOnce(t, *op.IdempotencyKey)

	// Reject over the WebSocket: nothing sent, the model says so.
	th2 := h.createThread("ws reject").ThreadID
	c.subscribe(th2, wsAfter(0))
	run2, op2 := h.wsAskEmail(c, th2, "bob@example.com", "Write an email to bob@example.com about the delay")
	a = c.ack(map[string]any{"type": "tool.reject", "operation_id": op2.OperationID, "expected_state_version": h.snapshot(th2).StateVersion})
	if a["phase"] != chat.PhaseRejected || a["operation_id"] != op2.OperationID {
		t.Errorf("tool.reject ack %v", a)
	}
	c.untilEvent(th2, chat.EventRunCompleted, run2)
	if got := wsPhases(t, c, th2, op2.OperationID); !slices.Equal(got, []string{chat.PhaseRejected}) {
		t.Errorf("phases after the reject %v", got)
	}
	hist := h.snapshot(th2).Messages
	if got := roles(hist); got != "user assistant tool assistant" || !strings.Contains(hist[3].Content, "did not send") {
		t.Errorf("history after the reject: %q, answer %q", got, hist[len(hist)-1].Content)
	}
	h.wantNothingSent(t, *op2.IdempotencyKey)
	h.wsWantDecided(t, c, op2.OperationID, th2, chat.PhaseRejected, "after the reject")

	// Cancel while waiting, then decide: voided, not pending.
	th3 := h.createThread("ws cancel").ThreadID
	c.subscribe(th3, wsAfter(0))
	run3, op3 := h.wsAskEmail(c, th3, "cy@example.com", "Send an email to cy@example.com about the contract")
	c.ack(map[string]any{"type": "run.cancel", "run_id": run3})
	done := c.untilEvent(th3, chat.EventRunCancelled, run3)
	ops, _ := done["operations"].([]any)
	if len(ops) != 1 || fmt.Sprint(ops[0]) != fmt.Sprint(map[string]any{"operation_id": op3.OperationID, "tool": "send_email", "phase": chat.PhaseVoided, "outcome": chat.OutcomeNotStarted}) {
		t.Errorf("run.cancelled operations %v", done["operations"])
	}
	h.wsWantDecided(t, c, op3.OperationID, th3, chat.PhaseVoided, "after the cancel")
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("refused decisions emitted %v", extra)
	}
	h.wantNothingSent(t, *op3.IdempotencyKey)
}

// TestToolsOrderCard: an order request is answered with exactly one card
// message: one valid JSON document, equal to its deltas, never valid
// before the last one.
func TestToolsOrderCard(t *testing.T) {
	t.Parallel()
	h := newToolHarness(t, time.Millisecond, email.OutboxConfig{})
	th, ack, evs := h.completedRun(t, "order", "Order two coffee mugs and three notebooks")
	var cards []chat.Message
	for _, m := range published(evs) {
		if m.RunID != nil && *m.RunID == ack.RunID {
			cards = append(cards, m)
		}
	}
	if len(cards) != 1 || cards[0].Kind != chat.KindCard || cards[0].Role != chat.RoleAssistant {
		t.Fatalf("the run published %+v, want one assistant card", cards)
	}
	card := cards[0]
	if !json.Valid([]byte(card.Content)) {
		t.Fatalf("card content is not valid JSON: %s", card.Content)
	}
	var doc struct {
		Type  string `json:"type"`
		Items []struct {
			Name     string `json:"name"`
			Quantity int    `json:"quantity"`
		} `json:"items"`
		Currency string      `json:"currency"`
		Total    json.Number `json:"total"`
	}
	if err := json.Unmarshal([]byte(card.Content), &doc); err != nil || doc.Type != "order" || len(doc.Items) != 2 ||
		doc.Items[0].Quantity != 2 || doc.Items[1].Quantity != 3 || doc.Total == "" {
		t.Errorf("order card %s (%v)", card.Content, err)
	}
	deltas := filter(evs, func(e *wireEvent) bool { return e.Type == chat.EventMessageDelta && e.MessageID == card.MessageID })
	var b strings.Builder
	for i, d := range deltas {
		b.WriteString(d.Text)
		if i < len(deltas)-1 && json.Valid([]byte(b.String())) {
			t.Errorf("the card's deltas are valid JSON after %d of %d: %q", i+1, len(deltas), b.String())
		}
	}
	if len(deltas) < 2 || b.String() != card.Content {
		t.Errorf("card content %q, its %d deltas %q", card.Content, len(deltas), b.String())
	}
	if n := len(filter(evs, func(e *wireEvent) bool { return strings.HasPrefix(e.Type, "tool.") })); n != 0 {
		t.Errorf("%d tool events for an order card", n)
	}
	snap := h.snapshot(th)
	if got := roles(snap.Messages); got != "user assistant" || snap.Messages[1].Kind != chat.KindCard || snap.Messages[1].Content != card.Content {
		t.Errorf("history %+v", snap.Messages)
	}
	if ops := h.operations(th); len(ops) != 0 {
		t.Errorf("operations %+v", ops)
	}
}

// TestToolsOrderCardCancelled: a cancel mid-card publishes nothing of it.
func TestToolsOrderCardCancelled(t *testing.T) {
	t.Parallel()
	h := newToolHarness(t, 40*time.Millisecond, email.OutboxConfig{})
	th, s := h.threadWithStream("order cancelled")
	ack := h.startRun(th, 1, "Order four espresso cups, two milk jugs and one tamper")
	streamed := s.waitDeltas(ack.RunID, 3)
	partial := s.text(streamed[0].MessageID, streamed[len(streamed)-1].Seq)
	if json.Valid([]byte(partial)) {
		t.Fatalf("three deltas already make a complete card %q: slow the pace", partial)
	}
	h.cancel(ack.RunID, nil)
	evs := waitRunEnd(t, s, ack.RunID, chat.EventRunCancelled)
	all := s.events
	for _, e := range all {
		if e.Type == chat.EventMessagePublished && e.RunID == ack.RunID {
			t.Errorf("the cancelled run published %v", e)
		}
	}
	done := evs[len(evs)-1]
	sent := runeCount(filter(all, func(e *wireEvent) bool { return e.Type == chat.EventMessageDelta && e.RunID == ack.RunID }))
	if done.DiscardedStreamChars <= 0 || done.DiscardedStreamChars < sent || sent < int64(utf8.RuneCountInString(partial)) {
		t.Errorf("discarded_stream_chars %d, streamed %d", done.DiscardedStreamChars, sent)
	}
	if len(done.Operations) != 0 {
		t.Errorf("run.cancelled operations %+v", done.Operations)
	}
	snap := h.snapshot(th)
	if got := roles(snap.Messages); got != "user" {
		t.Errorf("history after the cancel %q, want only the request", got)
	}
	for _, m := range snap.Messages {
		if m.Kind == chat.KindCard {
			t.Errorf("a card is in the history: %+v", m)
		}
	}
}

// TestToolsCatalogSearch: the search result is published as a tool
// message, then the model's answer about it.
func TestToolsCatalogSearch(t *testing.T) {
	t.Parallel()
	h := newToolHarness(t, time.Millisecond, email.OutboxConfig{})
	th, ack, evs := h.completedRun(t, "search", "Search the catalog for a coffee grinder")
	if n := len(filter(evs, func(e *wireEvent) bool {
		return e.Type == chat.EventToolPrepared || e.Type == chat.EventRunWaitingConfirmation
	})); n != 0 {
		t.Errorf("a search asked for a confirmation (%d events)", n)
	}
	msgs := published(evs)
	if got := roles(msgs); got != "user assistant tool assistant" {
		t.Fatalf("published %q, want user assistant tool assistant", got)
	}
	if !strings.Contains(msgs[1].Content, "coffee grinder") {
		t.Errorf("the model's words before the call: %q", msgs[1].Content)
	}
	op := h.onlyOp(th)
	if op.Tool != "catalog_search" || op.Contract != tools.Idempotent || op.Phase != chat.PhaseCompleted ||
		op.Outcome == nil || *op.Outcome != chat.OutcomeCompleted || op.ResultRef == nil || *op.ResultRef != msgs[2].MessageID || op.RunID != ack.RunID {
		t.Errorf("search operation %+v", op)
	}
	if got := opPhases(t, evs, op.OperationID); !slices.Equal(got, []string{chat.PhaseRunning, chat.PhaseCompleted}) {
		t.Errorf("tool.updated phases %v, want running completed", got)
	}
	tool := msgs[2]
	rec := decodeToolMessage(t, tool)
	if rec.Tool != "catalog_search" || rec.OperationID != op.OperationID || tool.RunID == nil || *tool.RunID != ack.RunID {
		t.Errorf("tool message %+v", tool)
	}
	var args struct {
		Query string `json:"query"`
	}
	var res catalog.Result
	if err := json.Unmarshal(rec.Arguments, &args); err != nil || args.Query != "coffee grinder" {
		t.Errorf("search arguments %s", rec.Arguments)
	}
	want, err := catalog.Search(args.Query, catalog.DefaultLimit)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(rec.Result, &res); err != nil || res.Query != args.Query || len(res.Matches) == 0 || fmt.Sprint(res) != fmt.Sprint(want) {
		t.Errorf("search result %s, want %+v", rec.Result, want)
	}
	answer := msgs[3]
	if answer.Role != chat.RoleAssistant || !strings.HasPrefix(answer.Content, "I found") || len(res.Matches) > 0 && !strings.Contains(answer.Content, res.Matches[0].Name) {
		t.Errorf("the model's answer %q", answer.Content)
	}
	iTool := indexOf(evs, func(e *wireEvent) bool {
		return e.Type == chat.EventMessagePublished && e.Message.MessageID == tool.MessageID
	})
	iFirstAnswerDelta := indexOf(evs, func(e *wireEvent) bool { return e.Type == chat.EventMessageDelta && e.MessageID == answer.MessageID })
	if iTool < 0 || iFirstAnswerDelta < iTool {
		t.Errorf("the answer streamed (#%d) before the result was published (#%d)", iFirstAnswerDelta, iTool)
	}
	if got := roles(h.snapshot(th).Messages); got != "user assistant tool assistant" {
		t.Errorf("history %q", got)
	}
	if n := len(h.attempts("")); n != 0 {
		t.Errorf("a search called the email provider %d times", n)
	}
}
