package gateway_test

// The harness of the tool-flow tests (toolHarness: the stack with the real
// tools and the embedded email outbox) and its helpers: operations read
// from events and the API, confirm/reject decisions, what the outbox sent.

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/catalog"
	"github.com/honestcancel/gateway/tools/email"
)

// toolLatency is the simulated latency of the search and of the email
// provider: small, but long enough that a commit is really in flight.
const toolLatency = 20 * time.Millisecond

// unknownOp is a well-formed operation id nobody has.
const unknownOp = "op_00000000000000000000000000"

// toolHarness is the harness with the real tools; the outbox is the email
// provider, in the same SQLite file as the store (as main.go wires it), so
// the harness's final check also audits its acceptances.
type toolHarness struct {
	*harness
	outbox *email.Outbox
}

var emailKey = regexp.MustCompile(`^email:step-[0-9a-f]{24}:[0-9a-f]{16}:send$`)

func newToolHarness(t *testing.T, pace time.Duration, cfg email.OutboxConfig, opts ...option) *toolHarness {
	t.Helper()
	if cfg.Latency == 0 {
		cfg.Latency = toolLatency
	}
	var outbox *email.Outbox
	h := newHarness(t, pace, append([]option{withToolsOn(func(st *store.Store) *tools.Registry {
		var err error
		if outbox, err = email.NewOutbox(st.ServiceDB(), cfg); err != nil {
			t.Fatalf("email provider: %v", err)
		}
		reg, err := tools.NewRegistry(catalog.New(toolLatency), email.NewSendEmail(outbox))
		if err != nil {
			t.Fatal(err)
		}
		return reg
	})}, opts...)...)
	return &toolHarness{harness: h, outbox: outbox}
}

// ---- helpers ----

// eventOp decodes the operation of a tool.prepared or tool.updated event.
func eventOp(t *testing.T, e *wireEvent) chat.Operation {
	t.Helper()
	var b struct {
		Operation *chat.Operation `json:"operation"`
	}
	if err := json.Unmarshal(e.Data, &b); err != nil || b.Operation == nil {
		t.Fatalf("%v: no operation (%v)", e, err)
	}
	return *b.Operation
}

// eventOpID is the operation_id of a run.waiting_confirmation event.
func eventOpID(e *wireEvent) string {
	var b struct {
		OperationID string `json:"operation_id"`
	}
	json.Unmarshal(e.Data, &b)
	return b.OperationID
}

// opPhases lists the phases the tool.updated events report for opID.
func opPhases(t *testing.T, evs []*wireEvent, opID string) []string {
	t.Helper()
	var out []string
	for _, e := range evs {
		if e.Type == chat.EventToolUpdated {
			if op := eventOp(t, e); op.OperationID == opID {
				out = append(out, op.Phase)
			}
		}
	}
	return out
}

// published lists the messages the events published, in order.
func published(evs []*wireEvent) []chat.Message {
	var out []chat.Message
	for _, e := range evs {
		if e.Type == chat.EventMessagePublished && e.Message != nil {
			out = append(out, *e.Message)
		}
	}
	return out
}

func roles(ms []chat.Message) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Role
	}
	return strings.Join(out, " ")
}

func indexOf(evs []*wireEvent, pred func(*wireEvent) bool) int {
	return slices.IndexFunc(evs, pred)
}

// toolRecord is the content of a tool message.
type toolRecord struct {
	Tool        string          `json:"tool"`
	OperationID string          `json:"operation_id"`
	Arguments   json.RawMessage `json:"arguments"`
	Result      json.RawMessage `json:"result"`
}

func decodeToolMessage(t *testing.T, m chat.Message) toolRecord {
	t.Helper()
	if m.Role != chat.RoleTool || m.Kind != chat.KindText {
		t.Fatalf("message %s is %s/%s, want a tool text message", m.MessageID, m.Role, m.Kind)
	}
	var r toolRecord
	if err := json.Unmarshal([]byte(m.Content), &r); err != nil {
		t.Fatalf("tool message content is not the tool record: %v: %s", err, m.Content)
	}
	return r
}

func (h *toolHarness) operations(threadID string) []chat.Operation {
	h.t.Helper()
	var out struct {
		Operations []chat.Operation `json:"operations"`
	}
	h.call(http.MethodGet, "/api/threads/"+threadID+"/operations", nil, http.StatusOK, &out)
	return out.Operations
}

func (h *toolHarness) operationsBytes(threadID string) string {
	h.t.Helper()
	return string(h.call(http.MethodGet, "/api/threads/"+threadID+"/operations", nil, http.StatusOK, nil).body)
}

// onlyOp is the thread's one operation.
func (h *toolHarness) onlyOp(threadID string) chat.Operation {
	h.t.Helper()
	ops := h.operations(threadID)
	if len(ops) != 1 {
		h.t.Fatalf("thread %s has %d operations, want 1: %+v", threadID, len(ops), ops)
	}
	return ops[0]
}

// decide posts /api/operations/{id}/confirm (confirm) or /reject; body as
// for h.do.
func (h *toolHarness) decide(opID string, confirm bool, body any) reply {
	h.t.Helper()
	verb := "reject"
	if confirm {
		verb = "confirm"
	}
	return h.do(http.MethodPost, "/api/operations/"+opID+"/"+verb, body)
}

// decideOK decides with the thread's current version and checks the
// answer: 200, exactly {operation_id, phase, state_version}.
func (h *toolHarness) decideOK(threadID, opID string, confirm bool) chat.ConfirmAck {
	h.t.Helper()
	cur := h.snapshot(threadID).StateVersion
	r := h.decide(opID, confirm, map[string]any{"expected_state_version": cur})
	if r.status != http.StatusOK {
		h.t.Fatalf("%v: want 200", r)
	}
	raw := rawFields(h.t, r.body)
	if keys := slices.Sorted(maps.Keys(raw)); !slices.Equal(keys, []string{"operation_id", "phase", "state_version"}) {
		h.t.Errorf("%v: want exactly operation_id, phase, state_version", r)
	}
	var ack chat.ConfirmAck
	json.Unmarshal(r.body, &ack)
	// A confirm moves the operation (one event); a reject also records the
	// refusal as the tool's result (its message and checkpoint): the ack
	// carries the version after all of them.
	want, version := chat.PhaseRejected, cur+3
	if confirm {
		want, version = chat.PhaseConfirmed, cur+1
	}
	if ack.OperationID != opID || ack.Phase != want || ack.StateVersion != version {
		h.t.Fatalf("%v: want operation %s, phase %s, state_version %d", r, opID, want, version)
	}
	return ack
}

// wantNotPending checks a 409 operation_not_pending naming the operation
// and its phase.
func (h *toolHarness) wantNotPending(t *testing.T, r reply, opID, phase string) {
	t.Helper()
	body := h.wantError(t, r, http.StatusConflict, chat.CodeOperationNotPending)
	if body["operation_id"] != opID || body["phase"] != phase {
		t.Errorf("%v: want operation_id %s and phase %s", r, opID, phase)
	}
}

// quiet is what must not change when a decision is refused: the snapshot
// and the operations of each thread, byte for byte, and the outbox.
type quiet struct {
	h        *toolHarness
	snaps    map[string]string
	ops      map[string]string
	attempts int
	accepted map[string]bool
}

// wantDecided checks that a decision on the operation, confirm and reject,
// at the thread's current version, is refused as not pending in phase and
// changes nothing on the watched threads.
func (h *toolHarness) wantDecided(t *testing.T, opID, thread, phase, when string, watched ...string) {
	t.Helper()
	qt := h.quiet(watched...)
	for _, confirm := range []bool{true, false} {
		r := h.decide(opID, confirm, map[string]any{"expected_state_version": h.snapshot(thread).StateVersion})
		h.wantNotPending(t, r, opID, phase)
		qt.check(t, fmt.Sprintf("decision (confirm %v) %s", confirm, when))
	}
}

// wsWantDecided is wantDecided over the WebSocket connection c: tool.confirm
// and tool.reject of the operation, at the thread's current version, are
// each answered with an operation_not_pending error naming the operation
// and phase, and change nothing on the thread.
func (h *toolHarness) wsWantDecided(t *testing.T, c *wsClient, opID, thread, phase, when string) {
	t.Helper()
	qt := h.quiet(thread)
	for _, typ := range []string{"tool.confirm", "tool.reject"} {
		m := c.cmd(map[string]any{"type": typ, "operation_id": opID, "expected_state_version": h.snapshot(thread).StateVersion})
		if m["type"] != "error" || m["error"] != chat.CodeOperationNotPending || m["operation_id"] != opID || m["phase"] != phase {
			t.Errorf("%s %s answered %v", typ, when, m)
		}
		qt.check(t, typ+" "+when)
	}
}

func (h *toolHarness) quiet(threadIDs ...string) *quiet {
	h.t.Helper()
	q := &quiet{h: h, snaps: map[string]string{}, ops: map[string]string{}}
	for _, th := range threadIDs {
		q.snaps[th] = h.snapshotBytes(th)
		q.ops[th] = h.operationsBytes(th)
	}
	q.attempts = len(h.attempts(""))
	q.accepted = h.accepted()
	return q
}

// check fails when anything moved since quiet (and re-bases, so one
// change is reported once).
func (q *quiet) check(t *testing.T, what string) {
	t.Helper()
	for th, before := range q.snaps {
		if now := q.h.snapshotBytes(th); now != before {
			t.Errorf("%s: thread %s changed:\n%s\n%s", what, th, before, now)
			q.snaps[th] = now
		}
		if now := q.h.operationsBytes(th); now != q.ops[th] {
			t.Errorf("%s: operations of %s changed:\n%s\n%s", what, th, q.ops[th], now)
			q.ops[th] = now
		}
	}
	if n := len(q.h.attempts("")); n != q.attempts {
		t.Errorf("%s: the email provider saw %d calls, before %d", what, n, q.attempts)
		q.attempts = n
	}
	if acc := q.h.accepted(); !maps.Equal(acc, q.accepted) {
		t.Errorf("%s: accepted keys %v, before %v", what, acc, q.accepted)
		q.accepted = acc
	}
}

// accepted is the set of keys the outbox holds as accepted.
func (h *toolHarness) accepted() map[string]bool {
	h.t.Helper()
	m, err := h.outbox.Accepted(h.t.Context())
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

// attempts lists the provider's calls for key ("" = all).
func (h *toolHarness) attempts(key string) []email.Attempt {
	h.t.Helper()
	all, err := h.outbox.Attempts(h.t.Context())
	if err != nil {
		h.t.Fatal(err)
	}
	var out []email.Attempt
	for _, a := range all {
		if key == "" || a.Key == key {
			out = append(out, a)
		}
	}
	return out
}

// wantSentOnce requires exactly one acceptance of key, from one call.
func (h *toolHarness) wantSentOnce(t *testing.T, key string) {
	t.Helper()
	if !h.accepted()[key] {
		t.Errorf("key %s was not accepted, want it accepted once", key)
	}
	if as := h.attempts(key); len(as) != 1 || as[0].Result != email.AttemptAccepted {
		t.Errorf("provider calls for %s: %+v, want one accepted", key, as)
	}
}

// wantNothingSent requires that the provider never saw key.
func (h *toolHarness) wantNothingSent(t *testing.T, key string) {
	t.Helper()
	if h.accepted()[key] {
		t.Errorf("key %s was accepted, want never", key)
	}
	if as := h.attempts(key); len(as) != 0 {
		t.Errorf("provider calls for %s: %+v, want none", key, as)
	}
}

// wantEmailOp checks a freshly prepared send_email operation.
func wantEmailOp(t *testing.T, op chat.Operation, threadID, runID, to string) {
	t.Helper()
	if !strings.HasPrefix(op.OperationID, chat.PrefixOperation) || op.RunID != runID || op.ThreadID != threadID ||
		op.Tool != "send_email" || op.Contract != tools.Consequential || op.Phase != chat.PhasePrepared ||
		op.Outcome != nil || op.ResultRef != nil {
		t.Fatalf("prepared operation %+v", op)
	}
	if op.IdempotencyKey == nil {
		t.Fatalf("prepared operation %s has no idempotency_key", op.OperationID)
	}
	key := *op.IdempotencyKey
	// The key names the step that drafted the email (its lineage), not the
	// thread: email:step-<24 hex>:<16 hex of the draft>:send.
	if !emailKey.MatchString(key) {
		t.Errorf("idempotency_key %q, want email:step-<24 hex>:<16 hex>:send", key)
	}
	var preview, args email.EmailDraft
	if err := json.Unmarshal(op.Preview, &preview); err != nil || preview.To != to || preview.Subject == "" || preview.Body == "" {
		t.Errorf("preview %s (%v), want to %s with a subject and a body", op.Preview, err, to)
	}
	if err := json.Unmarshal(op.Args, &args); err != nil || args != preview {
		t.Errorf("args %s, preview %s: the preview must show what will be sent", op.Args, op.Preview)
	}
}

// askEmail starts a run asking for an email and waits until it waits for
// the decision; it returns the run, the prepared operation and the events.
func (h *toolHarness) askEmail(s *sseStream, threadID, to, text string) (chat.RunStartAck, chat.Operation, []*wireEvent) {
	h.t.Helper()
	t := h.t
	ack := h.startRun(threadID, h.snapshot(threadID).StateVersion, text)
	evs := s.waitFor("run.waiting_confirmation "+ack.RunID, func(e *wireEvent) bool {
		if e.RunID == ack.RunID && (e.Type == chat.EventRunFailed || e.Type == chat.EventRunCompleted || e.Type == chat.EventRunCancelled) {
			t.Fatalf("run ended before asking for a confirmation: %v", e)
		}
		return e.Type == chat.EventRunWaitingConfirmation && e.RunID == ack.RunID
	})
	prep := filter(evs, func(e *wireEvent) bool { return e.Type == chat.EventToolPrepared })
	if len(prep) != 1 {
		t.Fatalf("%d tool.prepared events before run.waiting_confirmation, want 1", len(prep))
	}
	op := eventOp(t, prep[0])
	wantEmailOp(t, op, threadID, ack.RunID, to)
	if prep[0].RunID != ack.RunID {
		t.Errorf("tool.prepared carries run %s, want %s", prep[0].RunID, ack.RunID)
	}
	if id := eventOpID(evs[len(evs)-1]); id != op.OperationID {
		t.Errorf("run.waiting_confirmation names %q, want %s", id, op.OperationID)
	}
	return ack, op, evs
}

// waitRunEnd reads until the run ends with want (completed or cancelled),
// failing on any other end.
// completedRun creates a thread titled title and runs userMessage on it to
// the end; it returns the thread, the run's ack and the thread's events
// from seq 0 to the run's run.completed.
func (h *harness) completedRun(t *testing.T, title, userMessage string) (string, chat.RunStartAck, []*wireEvent) {
	t.Helper()
	snap := h.createThread(title)
	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, userMessage)
	return snap.ThreadID, ack, waitRunEnd(t, s, ack.RunID, chat.EventRunCompleted)
}

func waitRunEnd(t *testing.T, s *sseStream, runID, want string) []*wireEvent {
	t.Helper()
	return s.waitFor(want+" "+runID, func(e *wireEvent) bool {
		if e.RunID != runID || !strings.HasPrefix(e.Type, "run.") {
			return false
		}
		switch e.Type {
		case chat.EventRunCompleted, chat.EventRunFailed, chat.EventRunCancelled:
			if e.Type != want {
				t.Fatalf("run %s ended %v, want %s", runID, e, want)
			}
			return true
		}
		return false
	})
}
