package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
)

// Fuzz targets for the two places untrusted bytes enter the gateway: a
// WebSocket command frame and an HTTP request body. Run them with
// `make fuzz` (or `go test -run '^$' -fuzz '^FuzzWSCommand$' ./gateway`);
// under plain `go test` they run their seed corpus (f.Add and
// testdata/fuzz/<name>/).

// fuzzFake is the Store, Runs and Feed of a fuzzed server. It records every
// call with its arguments and answers not_found, so a test can check that
// whatever reached it had passed validation, and that nothing refused as
// invalid_request reached it at all.
type fuzzFake struct {
	mu    sync.Mutex
	calls []fuzzCall
}

type fuzzCall struct {
	method string
	args   []any
}

func (f *fuzzFake) record(method string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fuzzCall{method, args})
}

func (f *fuzzFake) take() []fuzzCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

var errFuzzNotFound = chat.NotFound("thread", "fuzz")

func (f *fuzzFake) CreateThread(_ context.Context, userID, title string) (chat.Snapshot, error) {
	f.record("CreateThread", userID, title)
	return chat.Snapshot{}, errFuzzNotFound
}

func (f *fuzzFake) ListThreads(_ context.Context, userID string, limit int, cursor, search string) ([]chat.Thread, string, error) {
	f.record("ListThreads", userID, limit, cursor, search)
	return nil, "", errFuzzNotFound
}

func (f *fuzzFake) Snapshot(_ context.Context, userID, threadID string) (chat.Snapshot, error) {
	f.record("Snapshot", userID, threadID)
	return chat.Snapshot{}, errFuzzNotFound
}

func (f *fuzzFake) History(_ context.Context, userID, threadID, _ string, _ int, _ int64) (chat.HistoryPage, error) {
	f.record("History", userID, threadID)
	return chat.HistoryPage{}, errFuzzNotFound
}

func (f *fuzzFake) Run(_ context.Context, userID, runID string) (chat.Run, error) {
	f.record("Run", userID, runID)
	return chat.Run{}, errFuzzNotFound
}

func (f *fuzzFake) MessagesByID(_ context.Context, userID, threadID string, _ []string, _ int64) ([]chat.Message, error) {
	f.record("MessagesByID", userID, threadID)
	return nil, errFuzzNotFound
}

func (f *fuzzFake) Checkpoints(_ context.Context, userID, threadID string) (string, []chat.Checkpoint, error) {
	f.record("Checkpoints", userID, threadID)
	return "", nil, errFuzzNotFound
}

func (f *fuzzFake) CheckpointDeltas(_ context.Context, userID, threadID string) (string, []chat.CheckpointDelta, error) {
	f.record("CheckpointDeltas", userID, threadID)
	return "", nil, errFuzzNotFound
}

func (f *fuzzFake) Operations(_ context.Context, userID, threadID string) ([]chat.Operation, error) {
	f.record("Operations", userID, threadID)
	return nil, errFuzzNotFound
}

func (f *fuzzFake) Fork(_ context.Context, p chat.Fork) (chat.Thread, error) {
	f.record("Fork", p.UserID, p.ThreadID, p.FromCheckpointID)
	return chat.Thread{}, errFuzzNotFound
}

func (f *fuzzFake) SaveFragment(_ context.Context, p chat.SaveFragment) (chat.FragmentSaved, error) {
	f.record("SaveFragment", p)
	return chat.FragmentSaved{}, errFuzzNotFound
}

func (f *fuzzFake) StreamedText(_ context.Context, q chat.StreamedTextQuery) (chat.StreamedText, error) {
	f.record("StreamedText", q)
	return chat.StreamedText{}, errFuzzNotFound
}

func (f *fuzzFake) Checkout(_ context.Context, p chat.Checkout) (chat.CheckoutAck, error) {
	f.record("Checkout", p.UserID, p.ThreadID, p.CheckpointID, p.ExpectedStateVersion)
	return chat.CheckoutAck{}, errFuzzNotFound
}

func (f *fuzzFake) DeleteDraft(_ context.Context, p chat.DeleteDraft) (chat.DraftDeleted, error) {
	f.record("DeleteDraft", p.UserID, p.ThreadID, p.MessageID, p.ExpectedStateVersion)
	return chat.DraftDeleted{}, errFuzzNotFound
}

func (f *fuzzFake) Events(_ context.Context, userID, threadID string, afterSeq int64) (chat.Replay, error) {
	f.record("Events", userID, threadID, afterSeq)
	return chat.Replay{}, errFuzzNotFound
}

func (f *fuzzFake) Response(_ context.Context, userID, runID string) (chat.Response, error) {
	f.record("Response", userID, runID)
	return chat.Response{}, errFuzzNotFound
}

func (f *fuzzFake) StartRun(_ context.Context, p chat.StartRun) (chat.RunStartAck, error) {
	f.record("StartRun", p)
	return chat.RunStartAck{}, errFuzzNotFound
}

func (f *fuzzFake) CancelRun(_ context.Context, p chat.CancelRun) (chat.CancelAck, error) {
	f.record("CancelRun", p)
	return chat.CancelAck{}, errFuzzNotFound
}

func (f *fuzzFake) DecideOperation(_ context.Context, p chat.Decide) (chat.ConfirmAck, error) {
	f.record("DecideOperation", p.UserID, p.OperationID, p.ExpectedStateVersion, p.Confirm)
	return chat.ConfirmAck{}, errFuzzNotFound
}

func (f *fuzzFake) DeleteThread(_ context.Context, p chat.DeleteThread) (chat.ThreadDeletedAck, error) {
	f.record("DeleteThread", p)
	return chat.ThreadDeletedAck{}, errFuzzNotFound
}

func (f *fuzzFake) QueueAdd(_ context.Context, p chat.QueueAdd) (chat.QueueAddAck, error) {
	f.record("QueueAdd", p)
	return chat.QueueAddAck{}, errFuzzNotFound
}

func (f *fuzzFake) QueueUpdate(_ context.Context, p chat.QueueUpdate) (chat.QueueItemAck, error) {
	f.record("QueueUpdate", p)
	return chat.QueueItemAck{}, errFuzzNotFound
}

func (f *fuzzFake) QueueRemove(_ context.Context, p chat.QueueRemove) (chat.QueueItemAck, error) {
	f.record("QueueRemove", p)
	return chat.QueueItemAck{}, errFuzzNotFound
}

func (f *fuzzFake) QueueResume(_ context.Context, p chat.QueueResume) (chat.QueueResumeAck, error) {
	f.record("QueueResume", p)
	return chat.QueueResumeAck{}, errFuzzNotFound
}

func (f *fuzzFake) Add(threadID string, _ chat.EventSink)    { f.record("Feed.Add", threadID) }
func (f *fuzzFake) Remove(threadID string, _ chat.EventSink) { f.record("Feed.Remove", threadID) }

func newFuzzServer() (*Server, *fuzzFake) {
	fake := &fuzzFake{}
	s := New(Config{Store: fake, Runs: fake, Feed: fake,
		// No rate limit: every frame must reach the decoder.
		WS: WSConfig{CommandRate: 1e12, CommandBurst: 1 << 40,
			UserCommandRate: 1e12, UserCommandBurst: 1 << 40, CancelRate: 1e12, CancelBurst: 1 << 40}})
	return s, fake
}

// textOK reports whether v passes checkText's rule.
func textOK(v string, maxBytes int) bool {
	return len(v) >= 1 && len(v) <= maxBytes && utf8.ValidString(v)
}

// checkReached fails when a call that reached the store or the engine
// carries what validation must have refused.
func checkReached(t *testing.T, c fuzzCall) {
	t.Helper()
	bad := func(why string) { t.Fatalf("%s reached the fake with %s: %+v", c.method, why, c.args) }
	nonEmpty := func(i int, name string) {
		if c.args[i].(string) == "" {
			bad("an empty " + name)
		}
	}
	switch c.method {
	case "StartRun":
		p := c.args[0].(chat.StartRun)
		if p.ThreadID == "" {
			bad("no thread_id")
		}
		if p.ExpectedStateVersion < 0 {
			bad("a negative expected_state_version")
		}
		if p.UserMessage != nil && !textOK(*p.UserMessage, chat.MaxUserMessageBytes) {
			bad(fmt.Sprintf("a user_message of %d bytes (valid UTF-8: %v)", len(*p.UserMessage), utf8.ValidString(*p.UserMessage)))
		}
		if p.ClientRequestID != "" && !textOK(p.ClientRequestID, chat.MaxClientRequestIDBytes) {
			bad("a bad client_request_id")
		}
	case "CancelRun":
		p := c.args[0].(chat.CancelRun)
		if p.RunID == "" || p.RequestedBy == "" || !textOK(p.Reason, chat.MaxReasonBytes) {
			bad("a bad run_id, reason or requested_by")
		}
	case "SaveFragment":
		p := c.args[0].(chat.SaveFragment)
		if p.ThreadID == "" || p.MessageID == "" || p.LastSeq < 1 || p.ExpectedStateVersion < 0 {
			bad("a bad fragment")
		}
	case "DeleteDraft":
		nonEmpty(1, "thread_id")
		nonEmpty(2, "message_id")
		if c.args[3].(int64) < 0 {
			bad("a negative expected_state_version")
		}
	case "DecideOperation":
		nonEmpty(1, "operation_id")
		if c.args[2].(int64) < 0 {
			bad("a negative expected_state_version")
		}
	case "Fork":
		nonEmpty(1, "thread_id")
		nonEmpty(2, "from_checkpoint_id")
	case "Checkout":
		nonEmpty(1, "thread_id")
		nonEmpty(2, "checkpoint_id")
		if c.args[3].(int64) < 0 {
			bad("a negative expected_state_version")
		}
	case "DeleteThread":
		p := c.args[0].(chat.DeleteThread)
		if p.ThreadID == "" || p.RequestedBy == "" || (p.ExpectedStateVersion != nil && *p.ExpectedStateVersion < 0) {
			bad("a bad thread_id, requested_by or expected_state_version")
		}
	case "CreateThread":
		if title := c.args[1].(string); !textOK(title, chat.MaxTitleBytes) || strings.IndexFunc(title, chat.IsControl) >= 0 {
			bad("a bad title")
		}
	case "Events":
		nonEmpty(1, "thread_id")
		if c.args[2].(int64) < 0 {
			bad("a negative after_seq")
		}
	case "Snapshot":
		nonEmpty(1, "thread_id")
	case "Feed.Add", "Feed.Remove":
		nonEmpty(0, "thread_id")
	default:
		t.Fatalf("unexpected call %s", c.method)
	}
}

// wantInvalid fails unless err is a *chat.Error with code invalid_request.
func wantInvalid(t *testing.T, what string, err error) {
	t.Helper()
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != chat.CodeInvalidRequest {
		t.Fatalf("%s: error %v (%T), want invalid_request", what, err, err)
	}
	if ce.Message == "" {
		t.Fatalf("%s: invalid_request without a message", what)
	}
}

// roundTrip decodes data into a new value of dst's type with decodeJSON; on
// success the value must encode to JSON that decodes (as strictly) to the
// same value.
func roundTrip(t *testing.T, data []byte, dst any) bool {
	t.Helper()
	name := reflect.TypeOf(dst).Elem().Name()
	if err := decodeJSON(data, dst); err != nil {
		wantInvalid(t, name, err)
		return false
	}
	enc, err := json.Marshal(dst)
	if err != nil {
		t.Fatalf("%s: re-encoding a decoded value: %v", name, err)
	}
	again := reflect.New(reflect.TypeOf(dst).Elem()).Interface()
	if err := decodeJSON(enc, again); err != nil {
		t.Fatalf("%s: re-encoded %s does not decode: %v", name, enc, err)
	}
	if !reflect.DeepEqual(dst, again) {
		t.Fatalf("%s: round trip changed the value: %+v -> %s -> %+v", name, dst, enc, again)
	}
	return true
}

// wsCommandTypes are the command structs of the WebSocket protocol, by type.
func wsCommandTypes() map[string]func() any {
	return map[string]func() any{
		"hello":           func() any { return new(wsHello) },
		"subscribe":       func() any { return new(wsSubscribe) },
		"unsubscribe":     func() any { return new(wsUnsubscribe) },
		"run.start":       func() any { return new(wsRunStart) },
		"run.cancel":      func() any { return new(wsRunCancel) },
		"fragment.save":   func() any { return new(wsFragmentSave) },
		"draft.delete":    func() any { return new(wsDraftDelete) },
		"thread.fork":     func() any { return new(wsFork) },
		"thread.checkout": func() any { return new(wsCheckout) },
		"thread.delete":   func() any { return new(wsDeleteThread) },
		"tool.confirm":    func() any { return new(wsDecide) },
		"tool.reject":     func() any { return new(wsDecide) },
	}
}

var wsSeeds = []string{
	`{"type":"hello","id":"1","tab_id":"tab-1"}`,
	`{"type":"hello","id":"1","tab_id":"bad tab id"}`,
	`{"type":"subscribe","id":"2","thread_id":"thr_1","after_seq":0}`,
	`{"type":"subscribe","id":"2","thread_id":"thr_1","after_seq":-1}`,
	`{"type":"subscribe","id":"2","thread_id":"thr_1"}`,
	`{"type":"unsubscribe","id":"3","thread_id":"thr_1"}`,
	`{"type":"run.start","id":"4","thread_id":"thr_1","expected_state_version":3,"user_message":"hi","client_request_id":"r1"}`,
	`{"type":"run.start","id":"4","thread_id":"thr_1","expected_state_version":-1,"user_message":"hi"}`,
	`{"type":"run.start","id":"4","thread_id":"thr_1","expected_state_version":1,"resume_from_checkpoint_id":"chk_1"}`,
	`{"type":"run.start","id":"4","thread_id":"thr_1","Expected_State_Version":1}`,
	`{"type":"run.cancel","id":"5","run_id":"run_1","reason":"stop"}`,
	`{"type":"run.cancel","id":"5","run_id":"run_1","expected_state_version":"x"}`,
	`{"type":"fragment.save","id":"6","thread_id":"thr_1","message_id":"msg_1","last_seq":4,"expected_state_version":2}`,
	`{"type":"draft.delete","id":"7","thread_id":"thr_1","message_id":"msg_1","expected_state_version":2}`,
	`{"type":"thread.fork","id":"8","thread_id":"thr_1","from_checkpoint_id":"chk_1"}`,
	`{"type":"thread.checkout","id":"8","thread_id":"thr_1","checkpoint_id":"chk_1","expected_state_version":3}`,
	`{"type":"thread.delete","id":"8","thread_id":"thr_1"}`,
	`{"type":"thread.delete","id":"8","thread_id":"thr_1","expected_state_version":-2}`,
	`{"type":"tool.confirm","id":"9","operation_id":"op_1","expected_state_version":5}`,
	`{"type":"tool.reject","id":"9","operation_id":"op_1","expected_state_version":5}`,
	`{"type":"nope","id":"10"}`,
	`{"type":"hello","id":""}`,
	`{"type":1,"id":"x"}`,
	`{"id":7}`,
	`{"type":"hello","id":"1","tab_id":"t"}{}`,
	`{"type":"hello","id":"1","tab_id":"t","tab_id":"u"}`,
	`{"type":"hello","id":"1","id":"2","tab_id":"t"}`,
	`{"type":"hello","id":"1","tab_id":"t"}]`,
	`null`,
	`[]`,
	`"hello"`,
	`{"type":"run.start","id":"4","thread_id":"thr_1","expected_state_version":1e3}`,
	`{"type":"run.start","id":"4","thread_id":"thr_1","expected_state_version":9223372036854775808}`,
	`{"type":"run.start","id":"4","thread_id":"thr_1","expected_state_version":1,"user_message":"\ud800"}`,
	"{\"type\":\"run.start\",\"id\":\"4\",\"thread_id\":\"thr_1\",\"expected_state_version\":1,\"user_message\":\"\xff\"}",
}

// FuzzWSCommand feeds arbitrary bytes to the WebSocket command path: the
// envelope reading of wsConn.command and the dispatch to each command, with
// a fake store and engine. Invariants: no panic; exactly one answer frame,
// ack or error, naming the frame's id when it had a readable one; every
// invalid_request reaches neither store nor engine, and whatever reaches
// them passed validation; and each command struct's strict decode either
// fails with invalid_request or round-trips through JSON unchanged.
func FuzzWSCommand(f *testing.F) {
	for _, s := range wsSeeds {
		f.Add([]byte(s))
	}
	big := `{"type":"run.start","id":"4","thread_id":"thr_1","expected_state_version":1,"user_message":"` + strings.Repeat("x", chat.MaxUserMessageBytes+1) + `"}`
	f.Add([]byte(big))
	s, fake := newFuzzServer()
	types := wsCommandTypes()
	f.Fuzz(func(t *testing.T, data []byte) {
		// Each command struct, decoded on its own.
		for _, mk := range types {
			roundTrip(t, data, mk())
		}
		var env wsEnvelope
		roundTrip(t, data, &env)

		// The whole command path of one connection.
		c := newWSConn(s.ws, nil, chat.Principal{UserID: chat.LocalUserID, Method: chat.AuthLocal})
		defer c.cancel()
		fake.take()
		c.command(data)
		calls := fake.take()
		c.mu.Lock()
		frames, holding := c.queue, c.holding
		c.mu.Unlock()
		if holding {
			t.Fatal("the connection still holds events after the command")
		}
		if len(frames) != 1 {
			t.Fatalf("%d frames queued for one command, want exactly 1: %q", len(frames), frames)
		}
		var answer map[string]any
		if err := json.Unmarshal(frames[0], &answer); err != nil {
			t.Fatalf("answer %q is not a JSON object: %v", frames[0], err)
		}
		var head map[string]json.RawMessage
		var id, typ string
		if json.Unmarshal(data, &head) == nil && head != nil {
			if raw, ok := head["id"]; ok {
				_ = json.Unmarshal(raw, &id)
			}
			if raw, ok := head["type"]; ok {
				_ = json.Unmarshal(raw, &typ)
			}
		}
		if len(id) > MaxCommandIDBytes {
			id = "" // refused without echoing it
		}
		if re, _ := answer["re"].(string); re != id {
			t.Fatalf("answer re = %q, want the frame's id %q: %s", re, id, frames[0])
		}
		switch answer["type"] {
		case "ack":
			// Only hello and unsubscribe can succeed against the fake.
			if typ != "hello" && typ != "unsubscribe" {
				t.Fatalf("ack for a command the fake refuses: %s", frames[0])
			}
		case "error":
			switch code := answer["error"]; code {
			case chat.CodeInvalidRequest:
				if len(calls) > 0 {
					t.Fatalf("refused as invalid, yet %d calls reached the fake: %+v", len(calls), calls)
				}
				return
			case chat.CodeNotFound:
				if len(calls) == 0 {
					t.Fatalf("not_found without a store call: %s", frames[0])
				}
			default:
				t.Fatalf("error code %v for a fuzzed frame: %s", code, frames[0])
			}
		default:
			t.Fatalf("answer of type %v: %s", answer["type"], frames[0])
		}
		for _, call := range calls {
			checkReached(t, call)
		}
	})
}

// httpBodies lists each HTTP request struct with the route that decodes it
// and whether that route accepts an empty body.
var httpBodies = []struct {
	method, path string
	allowEmpty   bool
	mk           func() any
}{
	{"POST", "/api/threads/thr_1/runs", false, func() any { return new(startRunRequest) }},
	{"POST", "/api/runs/run_1/cancel", true, func() any { return new(cancelRequest) }},
	{"POST", "/api/threads/thr_1/fragments", false, func() any { return new(saveFragmentRequest) }},
	{"POST", "/api/threads/thr_1/drafts/msg_1/delete", false, func() any { return new(deleteDraftRequest) }},
	{"POST", "/api/threads/thr_1/fork", false, func() any { return new(forkRequest) }},
	{"POST", "/api/threads/thr_1/head", false, func() any { return new(checkoutRequest) }},
	{"DELETE", "/api/threads/thr_1", true, func() any { return new(deleteThreadRequest) }},
	{"POST", "/api/threads", true, func() any { return new(createThreadRequest) }},
	{"POST", "/api/operations/op_1/confirm", false, func() any { return new(decideRequest) }},
	{"POST", "/api/operations/op_1/reject", false, func() any { return new(decideRequest) }},
}

// validated runs the handler's validator on a decoded request: it returns
// whether the request was accepted, and fails when an accepted one breaks
// a documented limit or a refusal is not invalid_request.
func validated(t *testing.T, v any) bool {
	t.Helper()
	var err error
	switch req := v.(type) {
	case *startRunRequest:
		var p chat.StartRun
		p, err = req.command(chat.LocalUserID, "thr_1")
		if err == nil {
			if p.ExpectedStateVersion < 0 || req.ExpectedStateVersion == nil || *req.ExpectedStateVersion < 0 {
				t.Fatalf("run.start accepted expected_state_version %v", req.ExpectedStateVersion)
			}
			if p.UserMessage != nil && !textOK(*p.UserMessage, chat.MaxUserMessageBytes) {
				t.Fatalf("run.start accepted a user_message of %d bytes", len(*p.UserMessage))
			}
		}
	case *cancelRequest:
		var p chat.CancelRun
		p, err = req.command(chat.LocalUserID, "run_1", "api:http")
		if err == nil && !textOK(p.Reason, chat.MaxReasonBytes) {
			t.Fatalf("run.cancel accepted reason %q", p.Reason)
		}
	case *saveFragmentRequest:
		var p chat.SaveFragment
		p, err = req.command(chat.LocalUserID, "thr_1")
		if err == nil && (p.LastSeq < 1 || p.ExpectedStateVersion < 0 || p.MessageID == "") {
			t.Fatalf("fragment.save accepted %+v", p)
		}
	case *deleteDraftRequest:
		var p chat.DeleteDraft
		p, err = req.command(chat.LocalUserID, "thr_1", "msg_1")
		if err == nil && (req.ExpectedStateVersion == nil || *req.ExpectedStateVersion < 0 || p.ExpectedStateVersion < 0) {
			t.Fatal("draft.delete accepted a missing or negative expected_state_version")
		}
	case *decideRequest:
		var p chat.Decide
		p, err = req.command(chat.LocalUserID, "op_1", true)
		if err == nil && (req.ExpectedStateVersion == nil || *req.ExpectedStateVersion < 0 || p.ExpectedStateVersion < 0) {
			t.Fatal("decide accepted a missing or negative expected_state_version")
		}
	case *forkRequest:
		var p chat.Fork
		p, err = req.command(chat.LocalUserID, "thr_1")
		if err == nil && (p.FromCheckpointID == "" || len(p.FromCheckpointID) > chat.MaxIDBytes) {
			t.Fatalf("fork accepted from_checkpoint_id %q", p.FromCheckpointID)
		}
	case *checkoutRequest:
		var p chat.Checkout
		p, err = req.command(chat.LocalUserID, "thr_1")
		if err == nil && (p.CheckpointID == "" || len(p.CheckpointID) > chat.MaxIDBytes || p.ExpectedStateVersion < 0) {
			t.Fatalf("checkout accepted %+v", p)
		}
	case *deleteThreadRequest:
		_, err = req.command(chat.LocalUserID, "thr_1", "api:http")
		if err == nil && req.ExpectedStateVersion != nil && *req.ExpectedStateVersion < 0 {
			t.Fatal("thread.delete accepted a negative expected_state_version")
		}
	case *createThreadRequest:
		if req.Title != nil {
			err = chat.CheckTitle("title", *req.Title)
		}
	default:
		t.Fatalf("no validator for %T", v)
	}
	if err != nil {
		wantInvalid(t, fmt.Sprintf("%T", v), err)
		return false
	}
	return true
}

var httpSeeds = []string{
	``,
	`{}`,
	`{"expected_state_version":3,"user_message":"hello","client_request_id":"req-1"}`,
	`{"expected_state_version":-1,"user_message":"hello"}`,
	`{"expected_state_version":1,"resume_from_checkpoint_id":""}`,
	`{"expected_state_version":1,"user_message":""}`,
	`{"reason":"changed my mind","expected_state_version":2}`,
	`{"message_id":"msg_1","last_seq":3,"expected_state_version":2}`,
	`{"message_id":"msg_1","last_seq":0,"expected_state_version":2}`,
	`{"from_checkpoint_id":"chk_1"}`,
	`{"title":"My thread"}`,
	`{"title":""}`,
	`{"title":"a\nb"}`,
	`{"title":"a","title":"b"}`,
	`{"expected_state_version":1,"expected_state_version":2}`,
	`{"expected_state_version":"1"}`,
	`{"expected_state_version":1.5}`,
	`{"expected_state_version":null}`,
	`{"Expected_State_Version":1}`,
	`{"expected_state_version":1,"extra":true}`,
	`{"expected_state_version":1} {"expected_state_version":2}`,
	`{"expected_state_version":1}}`,
	`[1,2]`,
	`null`,
	`   `,
	`{"user_message":"\udc00","expected_state_version":0}`,
	"{\"user_message\":\"\xc3\x28\",\"expected_state_version\":0}",
}

// FuzzHTTPBody runs arbitrary bytes through decode for every HTTP request
// struct, then through its validator, then through the real handler with a
// fake store and engine. Invariants: no panic; decode and validation errors
// are invalid_request; no accepted run.start has a user_message over 32768
// bytes or a negative expected_state_version (nor any other command a value
// its validator refuses); a 400 reaches neither store nor engine.
func FuzzHTTPBody(f *testing.F) {
	for _, s := range httpSeeds {
		f.Add([]byte(s))
	}
	for _, n := range []int{chat.MaxUserMessageBytes, chat.MaxUserMessageBytes + 1} {
		f.Add([]byte(`{"expected_state_version":0,"user_message":"` + strings.Repeat("é", n/2) + strings.Repeat("x", n%2) + `"}`))
	}
	s, fake := newFuzzServer()
	mux := http.NewServeMux()
	s.Routes(mux)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, b := range httpBodies {
			v := b.mk()
			r := httptest.NewRequest(b.method, b.path, bytes.NewReader(data))
			if err := decode(httptest.NewRecorder(), r, v, b.allowEmpty); err != nil {
				wantInvalid(t, fmt.Sprintf("decode %T", v), err)
			} else {
				validated(t, v)
			}

			fake.take()
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, httptest.NewRequest(b.method, b.path, bytes.NewReader(data)))
			calls := fake.take()
			var body struct {
				Type, Error, Message string
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Type != "error" || body.Message == "" {
				t.Fatalf("%s %s answered %d %q", b.method, b.path, w.Code, w.Body.Bytes())
			}
			switch {
			case w.Code == http.StatusBadRequest && body.Error == chat.CodeInvalidRequest:
				if len(calls) > 0 {
					t.Fatalf("%s %s: 400, yet %d calls reached the fake: %+v", b.method, b.path, len(calls), calls)
				}
			case w.Code == http.StatusNotFound && body.Error == chat.CodeNotFound:
				if len(calls) != 1 {
					t.Fatalf("%s %s: not_found after %d calls", b.method, b.path, len(calls))
				}
				checkReached(t, calls[0])
			default:
				t.Fatalf("%s %s answered %d %s", b.method, b.path, w.Code, w.Body.Bytes())
			}
		}
	})
}
