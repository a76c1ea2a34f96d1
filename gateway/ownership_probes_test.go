package gateway_test

// The ownership tests' probes: Alice's world (one id of every kind), a
// request naming each on every route and command, the state that must not
// move, and the attack that sends them as another user.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
)

// ---- Alice's world ----

// aliceWorld is one of every kind of id Alice owns, and the versions at which a
// command on them would succeed for her.
type aliceWorld struct {
	t1, t2, t3 string // the main thread; the email thread; a fork of t1
	r1, r2, r3 string // completed (with a client_request_id); cancelled; waiting for a confirmation
	crid       string // r1's client_request_id
	u1, a1     string // t1's first user and assistant messages
	draft      string // a saved fragment in t1's history
	streamed   string // r2's streamed message (never published)
	deltaSeq   int64  // the seq of a delta of it
	cpRoot     string // t1's first checkpoint
	op         string // t2's prepared send_email operation
	qi         string // a message queued on t2, waiting behind the confirmation
	version    map[string]int64
	head       map[string]string
	runThread  map[string]string
}

func (w *aliceWorld) threads() []string { return []string{w.t1, w.t2, w.t3} }
func (w *aliceWorld) runs() []string    { return []string{w.r1, w.r2, w.r3} }
func (w *aliceWorld) checkpoints() []string {
	return []string{w.cpRoot, w.head[w.t1], w.head[w.t2], w.head[w.t3]}
}

// buildWorld has alice (through her proxy) make a thread with a completed
// run, a run cancelled mid-stream with a fragment saved from it, an email
// thread whose run waits for a confirmation, and a fork.
func buildWorld(t *testing.T, h *authHarness, alice *toolHarness) *aliceWorld {
	t.Helper()
	w := &aliceWorld{crid: "alice-request-1", version: map[string]int64{}, head: map[string]string{}, runThread: map[string]string{}}
	snap := alice.createThread("alice: lighthouses")
	w.t1, w.cpRoot = snap.ThreadID, snap.HeadCheckpointID
	s := alice.openSSE(w.t1, "after_seq=0", "")
	var r1 chat.RunStartAck
	alice.call(http.MethodPost, "/api/threads/"+w.t1+"/runs", map[string]any{
		"expected_state_version": 1, "user_message": "short question about lighthouses", "client_request_id": w.crid,
	}, http.StatusCreated, &r1)
	w.r1 = r1.RunID
	waitRunEnd(t, s, w.r1, chat.EventRunCompleted)

	h.model.setPace(20 * time.Millisecond)
	r2 := alice.startRun(w.t1, alice.snapshot(w.t1).StateVersion, "Explain how the old lighthouses were kept lit at night")
	w.r2 = r2.RunID
	deltas := s.waitDeltas(w.r2, 3)
	w.streamed, w.deltaSeq = deltas[0].MessageID, deltas[1].Seq
	var saved chat.FragmentSaved
	alice.call(http.MethodPost, "/api/threads/"+w.t1+"/fragments", map[string]any{
		"message_id": w.streamed, "last_seq": w.deltaSeq, "expected_state_version": s.lastVersion,
	}, http.StatusCreated, &saved)
	w.draft = saved.MessageID
	alice.cancel(w.r2, nil)
	waitRunEnd(t, s, w.r2, chat.EventRunCancelled)
	h.model.setPace(time.Millisecond)
	s.close()

	hist := alice.snapshot(w.t1).Messages
	if len(hist) != 4 || hist[0].Role != chat.RoleUser || hist[1].Role != chat.RoleAssistant || hist[3].MessageID != w.draft {
		t.Fatalf("alice's main thread: %+v", hist)
	}
	w.u1, w.a1 = hist[0].MessageID, hist[1].MessageID

	w.t2 = alice.createThread("alice: email").ThreadID
	s2 := alice.openSSE(w.t2, "after_seq=0", "")
	r3, op, _ := alice.askEmail(s2, w.t2, "ann@example.com", "Send an email to ann@example.com about the quote")
	w.r3, w.op = r3.RunID, op.OperationID
	var queued chat.QueueAddAck
	alice.call(http.MethodPost, "/api/threads/"+w.t2+"/queue", map[string]any{"user_message": "alice's follow-up"},
		http.StatusCreated, &queued)
	if queued.Position != 1 {
		t.Fatalf("alice's queued message: %+v (it must wait behind the confirmation)", queued)
	}
	w.qi = queued.ItemID
	s2.close()

	var fork chat.ForkAck
	alice.call(http.MethodPost, "/api/threads/"+w.t1+"/fork", map[string]any{"from_checkpoint_id": alice.snapshot(w.t1).HeadCheckpointID}, http.StatusCreated, &fork)
	w.t3 = fork.NewThreadID

	for _, th := range w.threads() {
		snap := alice.snapshot(th)
		w.version[th], w.head[th] = snap.StateVersion, snap.HeadCheckpointID
	}
	w.runThread = map[string]string{w.r1: w.t1, w.r2: w.t1, w.r3: w.t2}
	return w
}

// fakeWorld has well-formed ids that exist nowhere (routing checks).
func fakeWorld() *aliceWorld {
	w := &aliceWorld{
		t1: chat.NewID(chat.PrefixThread), t2: chat.NewID(chat.PrefixThread), t3: chat.NewID(chat.PrefixThread),
		r1: chat.NewID(chat.PrefixRun), r2: chat.NewID(chat.PrefixRun), r3: chat.NewID(chat.PrefixRun),
		crid: "x", u1: chat.NewID(chat.PrefixMessage), a1: chat.NewID(chat.PrefixMessage),
		draft: chat.NewID(chat.PrefixMessage), streamed: chat.NewID(chat.PrefixMessage), deltaSeq: 3,
		cpRoot: chat.NewID(chat.PrefixCheckpoint), op: chat.NewID(chat.PrefixOperation), qi: chat.NewID(chat.PrefixQueueItem),
		version: map[string]int64{}, head: map[string]string{},
	}
	for _, th := range w.threads() {
		w.version[th], w.head[th] = 1, chat.NewID(chat.PrefixCheckpoint)
	}
	w.runThread = map[string]string{w.r1: w.t1, w.r2: w.t1, w.r3: w.t2}
	return w
}

// ---- requests and probes ----

// probeRequest is one command in its HTTP form (route: the registered pattern
// it must reach) and its WebSocket form (ws), either may be absent.
type probeRequest struct {
	route, method, path string
	body                any
	hdr                 []string
	ws                  map[string]any
	wsAck               bool // the WebSocket form is acknowledged whatever the id
}

func withFields(a, b map[string]any) map[string]any {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]any{}
	}
	maps.Copy(out, b)
	return out
}

func reqSnapshot(th string) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}", method: http.MethodGet, path: "/api/threads/" + th}
}

func reqCheckpoints(th string) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}/checkpoints", method: http.MethodGet, path: "/api/threads/" + th + "/checkpoints"}
}

func reqHistory(th, before string) probeRequest {
	r := probeRequest{route: "GET /api/threads/{id}/messages", method: http.MethodGet, path: "/api/threads/" + th + "/messages"}
	if before != "" {
		r.path += "?before=" + before
	}
	return r
}

// reqLookup asks for messages of thread th by id (…/messages?ids=).
func reqLookup(th string, ids ...string) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}/messages", method: http.MethodGet, path: "/api/threads/" + th + "/messages?ids=" + strings.Join(ids, ",")}
}

func reqOperations(th string) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}/operations", method: http.MethodGet, path: "/api/threads/" + th + "/operations"}
}

func reqEvents(th, query, lastEventID string) probeRequest {
	r := probeRequest{route: "GET /api/threads/{id}/events", method: http.MethodGet, path: "/api/threads/" + th + "/events"}
	if query != "" {
		r.path += "?" + query
	}
	if lastEventID != "" {
		r.hdr = []string{"Last-Event-ID", lastEventID}
	}
	return r
}

func reqSubscribe(th string, after *int64) probeRequest {
	f := map[string]any{"type": "subscribe", "thread_id": th}
	if after != nil {
		f["after_seq"] = *after
	}
	return probeRequest{ws: f}
}

func reqUnsubscribe(th string) probeRequest {
	return probeRequest{ws: map[string]any{"type": "unsubscribe", "thread_id": th}, wsAck: true}
}

func reqRunStart(th string, f map[string]any) probeRequest {
	return probeRequest{route: "POST /api/threads/{id}/runs", method: http.MethodPost, path: "/api/threads/" + th + "/runs",
		body: f, ws: withFields(map[string]any{"type": "run.start", "thread_id": th}, f)}
}

func reqRun(run string) probeRequest {
	return probeRequest{route: "GET /api/runs/{id}", method: http.MethodGet, path: "/api/runs/" + run}
}

// reqCancel: f nil sends no body (allowed for a cancel).
func reqCancel(run string, f map[string]any) probeRequest {
	r := probeRequest{route: "POST /api/runs/{id}/cancel", method: http.MethodPost, path: "/api/runs/" + run + "/cancel",
		ws: withFields(map[string]any{"type": "run.cancel", "run_id": run}, f)}
	if f != nil {
		r.body = f
	}
	return r
}

func reqFragment(th, msg string, lastSeq, version int64) probeRequest {
	f := map[string]any{"message_id": msg, "last_seq": lastSeq, "expected_state_version": version}
	return probeRequest{route: "POST /api/threads/{id}/fragments", method: http.MethodPost, path: "/api/threads/" + th + "/fragments",
		body: f, ws: withFields(map[string]any{"type": "fragment.save", "thread_id": th}, f)}
}

func reqStreamed(th, msg string, lastSeq int64) probeRequest {
	return probeRequest{route: "GET /api/threads/{id}/streamed/{message_id}", method: http.MethodGet,
		path: fmt.Sprintf("/api/threads/%s/streamed/%s?last_seq=%d", th, msg, lastSeq)}
}

func reqDraftDelete(th, msg string, version int64) probeRequest {
	f := map[string]any{"expected_state_version": version}
	return probeRequest{route: "POST /api/threads/{id}/drafts/{message_id}/delete", method: http.MethodPost,
		path: "/api/threads/" + th + "/drafts/" + msg + "/delete", body: f,
		ws: withFields(map[string]any{"type": "draft.delete", "thread_id": th, "message_id": msg}, f)}
}

func reqFork(th, cp string) probeRequest {
	f := map[string]any{"from_checkpoint_id": cp}
	return probeRequest{route: "POST /api/threads/{id}/fork", method: http.MethodPost, path: "/api/threads/" + th + "/fork",
		body: f, ws: withFields(map[string]any{"type": "thread.fork", "thread_id": th}, f)}
}

func reqCheckout(th, cp string, version int64) probeRequest {
	f := map[string]any{"checkpoint_id": cp, "expected_state_version": version}
	return probeRequest{route: "POST /api/threads/{id}/head", method: http.MethodPost, path: "/api/threads/" + th + "/head",
		body: f, ws: withFields(map[string]any{"type": "thread.checkout", "thread_id": th}, f)}
}

// reqDeleteThread: f nil sends no body (allowed).
func reqDeleteThread(th string, f map[string]any) probeRequest {
	r := probeRequest{route: "DELETE /api/threads/{id}", method: http.MethodDelete, path: "/api/threads/" + th,
		ws: withFields(map[string]any{"type": "thread.delete", "thread_id": th}, f)}
	if f != nil {
		r.body = f
	}
	return r
}

func reqDecide(op string, confirm bool, version int64) probeRequest {
	verb, typ := "reject", "tool.reject"
	if confirm {
		verb, typ = "confirm", "tool.confirm"
	}
	f := map[string]any{"expected_state_version": version}
	return probeRequest{route: "POST /api/operations/{id}/" + verb, method: http.MethodPost, path: "/api/operations/" + op + "/" + verb,
		body: f, ws: withFields(map[string]any{"type": typ, "operation_id": op}, f)}
}

func reqQueueAdd(th string, f map[string]any) probeRequest {
	return probeRequest{route: "POST /api/threads/{id}/queue", method: http.MethodPost, path: "/api/threads/" + th + "/queue",
		body: f, ws: withFields(map[string]any{"type": "queue.add", "thread_id": th}, f)}
}

func reqQueueUpdate(th, item string, f map[string]any) probeRequest {
	return probeRequest{route: "PATCH /api/threads/{id}/queue/{item_id}", method: http.MethodPatch,
		path: "/api/threads/" + th + "/queue/" + item, body: f,
		ws: withFields(map[string]any{"type": "queue.update", "thread_id": th, "item_id": item}, f)}
}

func reqQueueRemove(th, item string, version int64) probeRequest {
	f := map[string]any{"expected_state_version": version}
	return probeRequest{route: "DELETE /api/threads/{id}/queue/{item_id}", method: http.MethodDelete,
		path: "/api/threads/" + th + "/queue/" + item, body: f,
		ws: withFields(map[string]any{"type": "queue.remove", "thread_id": th, "item_id": item}, f)}
}

func reqQueueResume(th string, version int64) probeRequest {
	f := map[string]any{"expected_state_version": version}
	return probeRequest{route: "POST /api/threads/{id}/queue/resume", method: http.MethodPost,
		path: "/api/threads/" + th + "/queue/resume", body: f,
		ws: withFields(map[string]any{"type": "queue.resume", "thread_id": th}, f)}
}

func reqUnknownEndpoint(method, path string) probeRequest {
	return probeRequest{route: "/api/", method: method, path: path}
}

// The OpenAI Responses API's requests name a run through its response id.
func respID(run string) string { return chat.ResponseID(run) }

func reqResponse(run, query string) probeRequest {
	path := "/v1/responses/" + respID(run)
	if query != "" {
		path += "?" + query
	}
	return probeRequest{route: "GET /v1/responses/{id}", method: http.MethodGet, path: path}
}

func reqResponseCancel(run string) probeRequest {
	return probeRequest{route: "POST /v1/responses/{id}/cancel", method: http.MethodPost, path: "/v1/responses/" + respID(run) + "/cancel"}
}

// reqResponseCreate continues run's response; input "" continues its
// pending step.
func reqResponseCreate(run, input string) probeRequest {
	body := map[string]any{"model": "demo", "background": true, "previous_response_id": respID(run)}
	if input != "" {
		body["input"] = input
	}
	return probeRequest{route: "POST /v1/responses", method: http.MethodPost, path: "/v1/responses", body: body}
}

// ownershipProbe is a command naming an id of somebody else. build makes it for a
// given id, so the same command can be sent with an id that exists nowhere
// and the answers compared.
type ownershipProbe struct {
	name    string
	foreign string
	want    string // the error code: not_found, or checkpoint_not_found on the caller's own thread
	// replay: Alice must not get not_found for the same command (it names
	// objects she can see); false for unknown endpoints and for commands
	// on the caller's own thread.
	replay bool
	build  func(id string) probeRequest
}

// ownershipProbes names each of Alice's ids in every command that takes an
// id of its kind, with values that would succeed for Alice (her current
// versions, a buffered delta, a pending operation); own is the caller's
// thread at ownVersion, for commands naming Alice's checkpoints and
// messages on the caller's own thread.
func ownershipProbes(w *aliceWorld, own string, ownVersion int64) []ownershipProbe {
	const nf, cpnf = chat.CodeNotFound, chat.CodeCheckpointNotFound
	var ps []ownershipProbe
	add := func(name, foreign, want string, replay bool, build func(string) probeRequest) {
		ps = append(ps, ownershipProbe{name: name, foreign: foreign, want: want, replay: replay, build: build})
	}
	zero := int64(0)
	for _, th := range w.threads() {
		v, head := w.version[th], w.head[th]
		add("snapshot", th, nf, true, reqSnapshot)
		add("checkpoints", th, nf, true, reqCheckpoints)
		add("history", th, nf, true, func(id string) probeRequest { return reqHistory(id, "") })
		add("messages by id", th, nf, true, func(id string) probeRequest { return reqLookup(id, w.u1, w.a1) })
		add("operations", th, nf, true, reqOperations)
		add("events from a snapshot", th, nf, true, func(id string) probeRequest { return reqEvents(id, "", "") })
		add("events after_seq=0", th, nf, true, func(id string) probeRequest { return reqEvents(id, "after_seq=0", "") })
		add("events after Last-Event-ID", th, nf, true, func(id string) probeRequest { return reqEvents(id, "", "1") })
		add("subscribe", th, nf, true, func(id string) probeRequest { return reqSubscribe(id, nil) })
		add("subscribe after_seq 0", th, nf, true, func(id string) probeRequest { return reqSubscribe(id, &zero) })
		add("unsubscribe", th, "", true, reqUnsubscribe)
		add("run.start with a message", th, nf, true, func(id string) probeRequest {
			return reqRunStart(id, map[string]any{"expected_state_version": v, "user_message": "short: what did you tell alice?"})
		})
		add("run.start from a checkpoint", th, nf, true, func(id string) probeRequest {
			return reqRunStart(id, map[string]any{"expected_state_version": v, "user_message": "short: branch", "resume_from_checkpoint_id": head})
		})
		add("queue.add", th, nf, true, func(id string) probeRequest {
			return reqQueueAdd(id, map[string]any{"user_message": "short: queued for alice?", "expected_state_version": v})
		})
		add("queue.add as an interrupt", th, nf, true, func(id string) probeRequest {
			return reqQueueAdd(id, map[string]any{"user_message": "short: stop alice", "mode": "interrupt", "expected_state_version": v})
		})
		add("queue.resume", th, nf, true, func(id string) probeRequest { return reqQueueResume(id, v) })
		add("fork", th, nf, true, func(id string) probeRequest { return reqFork(id, head) })
		add("checkout", th, nf, true, func(id string) probeRequest { return reqCheckout(id, head, v) })
		add("unknown endpoint under the thread", th, nf, false, func(id string) probeRequest {
			return reqUnknownEndpoint(http.MethodGet, "/api/threads/"+id+"/archive")
		})
		add("unregistered method on the thread", th, nf, false, func(id string) probeRequest {
			return reqUnknownEndpoint(http.MethodPut, "/api/threads/"+id)
		})
		// Not replayed as alice: it would delete her thread for the probes
		// after it (TestWSThreadDelete shows that the owner can).
		add("delete", th, nf, false, func(id string) probeRequest { return reqDeleteThread(id, nil) })
		add("delete at a version", th, nf, false, func(id string) probeRequest {
			return reqDeleteThread(id, map[string]any{"expected_state_version": v})
		})
	}
	v1 := w.version[w.t1]
	add("run.start continuing the saved point", w.t1, nf, true, func(id string) probeRequest {
		return reqRunStart(id, map[string]any{"expected_state_version": v1})
	})
	add("run.start from the root checkpoint", w.t1, nf, true, func(id string) probeRequest {
		return reqRunStart(id, map[string]any{"expected_state_version": v1, "user_message": "short: again", "resume_from_checkpoint_id": w.cpRoot})
	})
	add("run.start with alice's client_request_id", w.t1, nf, true, func(id string) probeRequest {
		return reqRunStart(id, map[string]any{"expected_state_version": v1, "user_message": "short: same id", "client_request_id": w.crid})
	})
	add("fragment.save of the streamed message", w.t1, nf, true, func(id string) probeRequest {
		return reqFragment(id, w.streamed, w.deltaSeq, v1)
	})
	add("streamed text of the streamed message", w.t1, nf, true, func(id string) probeRequest {
		return reqStreamed(id, w.streamed, w.deltaSeq)
	})
	add("draft.delete of the draft", w.t1, nf, true, func(id string) probeRequest { return reqDraftDelete(id, w.draft, v1) })
	add("draft.delete of a published message", w.t1, nf, true, func(id string) probeRequest { return reqDraftDelete(id, w.a1, v1) })
	for _, run := range w.runs() {
		v := w.version[w.runThread[run]]
		add("run", run, nf, true, reqRun)
		add("cancel", run, nf, true, func(id string) probeRequest { return reqCancel(id, nil) })
		add("cancel with reason and version", run, nf, true, func(id string) probeRequest {
			return reqCancel(id, map[string]any{"reason": "not yours", "expected_state_version": v})
		})
		add("response", run, nf, true, func(id string) probeRequest { return reqResponse(id, "") })
		add("response stream", run, nf, true, func(id string) probeRequest { return reqResponse(id, "stream=true&starting_after=0") })
		add("response cancel", run, nf, true, reqResponseCancel)
		// Not replayed by alice: they would start runs.
		add("response continuing it", run, nf, false, func(id string) probeRequest { return reqResponseCreate(id, "short: mine now") })
		add("response continuing its saved point", run, nf, false, func(id string) probeRequest { return reqResponseCreate(id, "") })
		add("unknown endpoint under the response", run, nf, false, func(id string) probeRequest {
			return probeRequest{route: "/v1/", method: http.MethodDelete, path: "/v1/responses/" + respID(id)}
		})
	}
	v2 := w.version[w.t2]
	add("queue.update of alice's item", w.t2, nf, true, func(id string) probeRequest {
		return reqQueueUpdate(id, w.qi, map[string]any{"user_message": "mine now", "expected_state_version": v2})
	})
	add("queue.remove of alice's item", w.t2, nf, true, func(id string) probeRequest { return reqQueueRemove(id, w.qi, v2) })
	add("queue.update on own thread of alice's item", w.qi, nf, false, func(id string) probeRequest {
		return reqQueueUpdate(own, id, map[string]any{"position": 1, "expected_state_version": ownVersion})
	})
	add("queue.remove on own thread of alice's item", w.qi, nf, false, func(id string) probeRequest {
		return reqQueueRemove(own, id, ownVersion)
	})
	add("confirm", w.op, nf, true, func(id string) probeRequest { return reqDecide(id, true, v2) })
	add("reject", w.op, nf, true, func(id string) probeRequest { return reqDecide(id, false, v2) })
	add("unknown endpoint under the operation", w.op, nf, false, func(id string) probeRequest {
		return reqUnknownEndpoint(http.MethodPost, "/api/operations/"+id+"/retry")
	})

	// Alice's checkpoints and messages named on the caller's own thread.
	for _, cp := range w.checkpoints() {
		add("run.start on own thread from alice's checkpoint", cp, cpnf, false, func(id string) probeRequest {
			return reqRunStart(own, map[string]any{"expected_state_version": ownVersion, "user_message": "short: steal", "resume_from_checkpoint_id": id})
		})
		add("fork own thread from alice's checkpoint", cp, cpnf, false, func(id string) probeRequest { return reqFork(own, id) })
		add("checkout of alice's checkpoint on own thread", cp, cpnf, false, func(id string) probeRequest { return reqCheckout(own, id, ownVersion) })
	}
	add("fragment.save on own thread of alice's streamed message", w.streamed, nf, false, func(id string) probeRequest {
		return reqFragment(own, id, w.deltaSeq, ownVersion)
	})
	add("streamed text on own thread of alice's streamed message", w.streamed, nf, false, func(id string) probeRequest {
		return reqStreamed(own, id, w.deltaSeq)
	})
	for _, m := range []string{w.draft, w.a1, w.u1} {
		add("draft.delete on own thread of alice's message", m, nf, false, func(id string) probeRequest {
			return reqDraftDelete(own, id, ownVersion)
		})
		add("history of own thread before alice's message", m, nf, false, func(id string) probeRequest { return reqHistory(own, id) })
	}
	add("history of alice's thread before her message", w.a1, nf, true, func(id string) probeRequest { return reqHistory(w.t1, id) })
	return ps
}

// sampleRequest is one request per registered pattern, naming Alice's ids
// with values that would succeed for her (used where every route must
// refuse before anything runs). A pattern without a case fails.
func sampleRequest(t *testing.T, pattern string, w *aliceWorld) (probeRequest, bool) {
	t.Helper()
	switch pattern {
	case "GET /livez":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/livez"}, true
	case "GET /readyz":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/readyz"}, true
	case "GET /ws":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/ws", hdr: upgradeHeaders}, true
	case "POST /api/threads":
		return probeRequest{route: pattern, method: http.MethodPost, path: "/api/threads", body: map[string]any{"title": "sneaky"}}, true
	case "GET /api/threads":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/api/threads"}, true
	case "GET /api/threads/{id}":
		return reqSnapshot(w.t1), true
	case "POST /api/threads/{id}/runs":
		return reqRunStart(w.t1, map[string]any{"expected_state_version": w.version[w.t1], "user_message": "short: hi"}), true
	case "GET /api/runs/{id}":
		return reqRun(w.r1), true
	case "POST /api/runs/{id}/cancel":
		return reqCancel(w.r3, nil), true
	case "POST /api/threads/{id}/fragments":
		return reqFragment(w.t1, w.streamed, w.deltaSeq, w.version[w.t1]), true
	case "GET /api/threads/{id}/streamed/{message_id}":
		return reqStreamed(w.t1, w.streamed, w.deltaSeq), true
	case "POST /api/threads/{id}/drafts/{message_id}/delete":
		return reqDraftDelete(w.t1, w.draft, w.version[w.t1]), true
	case "POST /api/threads/{id}/fork":
		return reqFork(w.t1, w.head[w.t1]), true
	case "POST /api/threads/{id}/head":
		return reqCheckout(w.t1, w.cpRoot, w.version[w.t1]), true
	case "DELETE /api/threads/{id}":
		return reqDeleteThread(w.t1, nil), true
	case "GET /api/threads/{id}/operations":
		return reqOperations(w.t2), true
	case "POST /api/operations/{id}/confirm":
		return reqDecide(w.op, true, w.version[w.t2]), true
	case "POST /api/operations/{id}/reject":
		return reqDecide(w.op, false, w.version[w.t2]), true
	case "GET /api/threads/{id}/checkpoints":
		return reqCheckpoints(w.t1), true
	case "GET /api/threads/{id}/messages":
		return reqHistory(w.t1, w.a1), true
	case "GET /api/threads/{id}/events":
		return reqEvents(w.t1, "after_seq=0", ""), true
	case "POST /api/threads/{id}/queue":
		return reqQueueAdd(w.t2, map[string]any{"user_message": "short: hi"}), true
	case "PATCH /api/threads/{id}/queue/{item_id}":
		return reqQueueUpdate(w.t2, w.qi, map[string]any{"position": 1}), true
	case "DELETE /api/threads/{id}/queue/{item_id}":
		return reqQueueRemove(w.t2, w.qi, w.version[w.t2]), true
	case "POST /api/threads/{id}/queue/resume":
		return reqQueueResume(w.t2, w.version[w.t2]), true
	case "/api/":
		return reqUnknownEndpoint(http.MethodPost, "/api/threads/"+w.t1+"/archive"), true
	case "GET /v1/models":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/v1/models"}, true
	case "GET /v1/models/{model}":
		return probeRequest{route: pattern, method: http.MethodGet, path: "/v1/models/demo"}, true
	case "POST /v1/responses":
		return reqResponseCreate(w.r1, "short: hi"), true
	case "GET /v1/responses/{id}":
		return reqResponse(w.r1, ""), true
	case "POST /v1/responses/{id}/cancel":
		return reqResponseCancel(w.r3), true
	case "/v1/":
		return probeRequest{route: pattern, method: http.MethodDelete, path: "/v1/responses/" + respID(w.r1)}, true
	}
	t.Errorf("route %q has no sample request: add a case to sampleRequest (and ownership probes if it names ids)", pattern)
	return probeRequest{}, false
}

// routedTo is the pattern the mux picks for the request's HTTP form.
func routedTo(mux *http.ServeMux, r probeRequest) string {
	req := httptest.NewRequest(r.method, r.path, nil)
	_, pattern := mux.Handler(req)
	return pattern
}

// ---- state that must not move ----

// stateOf is everything a refused command could have changed, as bytes:
// Alice's snapshots, checkpoints, operations, runs and thread list (read as
// Alice), the callers' own threads (read from the store), the email
// provider's calls, the accounts, and the threads of nobody.
func stateOf(t *testing.T, h *authHarness, alice *toolHarness, w *aliceWorld, own map[string]string) map[string]string {
	t.Helper()
	ctx := context.Background()
	m := map[string]string{}
	get := func(path string) {
		m["alice GET "+path] = string(alice.call(http.MethodGet, path, nil, http.StatusOK, nil).body)
	}
	for _, th := range w.threads() {
		get("/api/threads/" + th)
		get("/api/threads/" + th + "/checkpoints")
		get("/api/threads/" + th + "/operations")
	}
	for _, r := range w.runs() {
		get("/api/runs/" + r)
	}
	get("/api/threads?limit=200")
	for th, user := range own {
		snap, err := h.st.Snapshot(ctx, user, th)
		if err != nil {
			t.Fatal(err)
		}
		head, cps, err := h.st.Checkpoints(ctx, user, th)
		if err != nil {
			t.Fatal(err)
		}
		m["own thread "+th] = string(jsonOf(t, snap)) + string(jsonOf(t, cps)) + head
	}
	m["outbox calls"] = fmt.Sprint(len(h.attempts("")))
	m["outbox accepted"] = fmt.Sprint(h.accepted())
	users, err := h.st.Accounts().Users(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m["accounts"] = string(jsonOf(t, users))
	for _, user := range []string{chat.LocalUserID, ""} {
		ths, _, err := h.st.ListThreads(ctx, user, 200, "", "")
		if err != nil {
			t.Fatal(err)
		}
		m[fmt.Sprintf("threads of user %q", user)] = string(jsonOf(t, ths))
	}
	return m
}

func wantSameState(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if before[k] != after[k] {
			t.Errorf("%s changed %s:\nbefore %s\nafter  %s", what, k, before[k], after[k])
		}
	}
}

func wantNoViolations(t *testing.T, h *authHarness) {
	t.Helper()
	vs, err := h.st.Check(context.Background())
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	for _, v := range vs {
		t.Errorf("check: %v", v)
	}
}

// ---- the attacks ----

// probeTally counts what one caller tried.
type probeTally struct {
	probes, http, sse, ws int
	routes, commands      map[string]int
}

func (c probeTally) String() string {
	return fmt.Sprintf("%d probes: %d HTTP requests (%d of them SSE) over %d routes, %d WebSocket commands over %d types; each also sent with an unknown id",
		c.probes, c.http, c.sse, len(c.routes), c.ws, len(c.commands))
}

// attack sends every probe as who, over HTTP and over one WebSocket, and
// the same with an id that exists nowhere: each must be refused with the
// probe's code (unsubscribe: acknowledged) and answered exactly as for the
// unknown id but for the id itself. ownThread is subscribed first: the
// connection must never receive anything but that thread's events.
func attack(t *testing.T, h *authHarness, who apiCaller, createOwnThread string, ps []ownershipProbe) probeTally {
	t.Helper()
	n := probeTally{routes: map[string]int{}, commands: map[string]int{}}
	c := who.dial(t, h.harness)
	c.ack(map[string]any{"type": "hello", "tab_id": who.name + "-tab"})
	c.subscribe(createOwnThread, wsAfter(0))
	for _, p := range ps {
		unknown := chat.NewID(idPrefix(p.foreign))
		f, u := p.build(p.foreign), p.build(unknown)
		label := fmt.Sprintf("%s: %s %s", who.name, p.name, p.foreign)
		n.probes++
		if f.route != "" {
			if got := routedTo(h.mux, f); got != f.route {
				t.Errorf("%s: %s %s reaches route %q, want %q", label, f.method, f.path, got, f.route)
			}
			rf := who.send(t, f.method, f.path, f.body, f.hdr...)
			ru := who.send(t, u.method, u.path, u.body, u.hdr...)
			if wantRefusal(t, label, rf, p.want) && rf.status == ru.status {
				if a, b := normalizedAnswer(t, rf.body, p.foreign), normalizedAnswer(t, ru.body, unknown); !reflect.DeepEqual(a, b) {
					t.Errorf("%s: the answer for a foreign id differs from the one for an unknown id:\n%s\n%s", label, rf.body, ru.body)
				}
			} else if rf.status != ru.status {
				t.Errorf("%s: status %d for the foreign id, %d for an unknown one", label, rf.status, ru.status)
			}
			n.http++
			n.routes[f.route]++
			if f.route == "GET /api/threads/{id}/events" {
				n.sse++
			}
		}
		if f.ws != nil {
			typ := f.ws["type"].(string)
			mf := c.cmd(f.ws)
			mu := c.cmd(u.ws)
			switch {
			case f.wsAck && mf["type"] != "ack":
				t.Errorf("%s over WebSocket: %v, want an ack (as for any id)", label, mf)
			case !f.wsAck && (mf["type"] != "error" || mf["error"] != p.want):
				t.Errorf("%s over WebSocket: %v, want error %s", label, mf, p.want)
			}
			if a, b := normalizedAnswer(t, jsonOf(t, mf), p.foreign), normalizedAnswer(t, jsonOf(t, mu), unknown); !reflect.DeepEqual(a, b) {
				t.Errorf("%s over WebSocket: the answer for a foreign id differs from the one for an unknown id:\n%v\n%v", label, mf, mu)
			}
			n.ws++
			n.commands[typ]++
		}
	}
	// Nothing of anybody else's arrived (observe fails any event of a
	// thread this connection does not watch), and nothing at all since.
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("%s: the probes sent %d objects to the connection: %v", who.name, len(extra), extra)
	}
	c.conn.Close(websocket.StatusNormalClosure, "")
	return n
}

// wantOnlyOwnThreads lists who's threads in several ways, Alice's cursor
// included: every thread listed is one of own, none is Alice's.
func wantOnlyOwnThreads(t *testing.T, who apiCaller, own []string, w *aliceWorld, aliceCursor string) {
	t.Helper()
	for _, q := range []string{"", "?limit=200", "?limit=1", "?cursor=" + aliceCursor, "?limit=1&cursor=" + aliceCursor, "?q=short", "?q=alice", "?q=a"} {
		r := who.send(t, http.MethodGet, "/api/threads"+q, nil)
		if strings.Contains(q, "cursor") && r.status == http.StatusBadRequest {
			continue // a cursor it cannot use is refused: fine, it shows nothing
		}
		var page threadPage
		if r.status != http.StatusOK || json.Unmarshal(r.body, &page) != nil {
			t.Errorf("%s lists threads: %v", who.name, r)
			continue
		}
		for _, th := range page.Threads {
			if slices.Contains(w.threads(), th.ThreadID) {
				t.Errorf("%s's list (%s) shows alice's thread %s", who.name, q, th.ThreadID)
			} else if !slices.Contains(own, th.ThreadID) {
				t.Errorf("%s's list (%s) shows thread %s, which is not theirs", who.name, q, th.ThreadID)
			}
		}
		if q == "" && len(page.Threads) != len(own) {
			t.Errorf("%s's list has %d threads, want their %d", who.name, len(page.Threads), len(own))
		}
	}
}
