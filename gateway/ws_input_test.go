package gateway_test

// What a WebSocket client may send: bad frames, frames over the read
// limit, the rate limit, the Origin check; and the close on shutdown.

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
)

// TestWSBadInput: every malformed or refused command gets the protocol's
// error (re only when the frame had a readable id), changes nothing, and
// leaves the connection usable.
func TestWSBadInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{CommandRate: 1000, CommandBurst: 1000}))
	snap := h.createThread("")
	th := snap.ThreadID
	runAck, reply := h.runToEnd(th, 1, "short question")
	cur := h.snapshot(th)
	userMsg := cur.Messages[0].MessageID
	c := h.dial(t)
	c.subscribe(th, nil)
	c.untilEvent(th, chat.EventThreadSnapshot, "")

	const inv, nf = chat.CodeInvalidRequest, chat.CodeNotFound
	v := cur.StateVersion
	q := func(format string, args ...any) string { return fmt.Sprintf(format, args...) }
	cases := []struct {
		name, frame, re, code string
	}{
		{"malformed JSON", `{"type":"hello","id":"b1",`, "", inv},
		{"not JSON", `hello`, "", inv},
		{"JSON array", `[{"type":"hello","id":"b2","tab_id":"x"}]`, "", inv},
		{"empty array", `[]`, "", inv},
		{"JSON string", `"hello"`, "", inv},
		{"JSON null", `null`, "", inv},
		{"JSON number", `42`, "", inv},
		{"two objects", `{"type":"hello","id":"b3","tab_id":"x"} {"type":"hello","id":"b4","tab_id":"y"}`, "", inv},
		{"trailing garbage", `{"type":"hello","id":"b5","tab_id":"x"}}`, "", inv},
		{"empty frame", ``, "", inv},
		{"missing id", `{"type":"hello","tab_id":"x"}`, "", inv},
		{"empty id", `{"type":"hello","id":"","tab_id":"x"}`, "", inv},
		{"numeric id", `{"type":"hello","id":5,"tab_id":"x"}`, "", inv},
		{"object id", `{"type":"hello","id":{"n":1},"tab_id":"x"}`, "", inv},
		{"missing type", `{"id":"b6"}`, "b6", inv},
		{"numeric type", `{"type":7,"id":"b7"}`, "b7", inv},
		{"unknown type", q(`{"type":"thread.archive","id":"b8","thread_id":%q}`, th), "b8", inv},
		{"type in another case", q(`{"type":"Subscribe","id":"b9","thread_id":%q}`, th), "b9", inv},
		{"unknown field", q(`{"type":"subscribe","id":"b10","thread_id":%q,"after":0}`, th), "b10", inv},
		{"field name in another case", q(`{"type":"run.start","id":"b11","Thread_Id":%q,"expected_state_version":%d,"user_message":"hi"}`, th, v), "b11", inv},
		{"hello without tab_id", `{"type":"hello","id":"b12"}`, "b12", inv},
		{"hello with a space in tab_id", `{"type":"hello","id":"b13","tab_id":"two words"}`, "b13", inv},
		{"hello with a long tab_id", q(`{"type":"hello","id":"b14","tab_id":%q}`, strings.Repeat("t", 65)), "b14", inv},
		{"hello with tab_id as number", `{"type":"hello","id":"b15","tab_id":3}`, "b15", inv},
		{"subscribe without thread_id", `{"type":"subscribe","id":"b16"}`, "b16", inv},
		{"subscribe with thread_id as number", `{"type":"subscribe","id":"b17","thread_id":1}`, "b17", inv},
		{"subscribe with negative after_seq", q(`{"type":"subscribe","id":"b18","thread_id":%q,"after_seq":-1}`, th), "b18", inv},
		{"subscribe with after_seq as string", q(`{"type":"subscribe","id":"b19","thread_id":%q,"after_seq":"3"}`, th), "b19", inv},
		{"subscribe with fractional after_seq", q(`{"type":"subscribe","id":"b20","thread_id":%q,"after_seq":1.5}`, th), "b20", inv},
		{"subscribe to an unknown thread", `{"type":"subscribe","id":"b21","thread_id":"thr_00000000000000000000000000","after_seq":0}`, "b21", nf},
		{"subscribe to an unknown thread from a snapshot", `{"type":"subscribe","id":"b22","thread_id":"thr_00000000000000000000000000"}`, "b22", nf},
		{"subscribe to a run id", q(`{"type":"subscribe","id":"b23","thread_id":%q}`, runAck.RunID), "b23", nf},
		{"unsubscribe without thread_id", `{"type":"unsubscribe","id":"b24"}`, "b24", inv},
		{"run.start without thread_id", q(`{"type":"run.start","id":"b25","expected_state_version":%d,"user_message":"hi"}`, v), "b25", inv},
		{"run.start without expected_state_version", q(`{"type":"run.start","id":"b26","thread_id":%q,"user_message":"hi"}`, th), "b26", inv},
		{"run.start with expected_state_version as string", q(`{"type":"run.start","id":"b27","thread_id":%q,"expected_state_version":"%d","user_message":"hi"}`, th, v), "b27", inv},
		{"run.start with an empty user_message", q(`{"type":"run.start","id":"b28","thread_id":%q,"expected_state_version":%d,"user_message":""}`, th, v), "b28", inv},
		{"run.start with a user_message over 32768 bytes", q(`{"type":"run.start","id":"b29","thread_id":%q,"expected_state_version":%d,"user_message":%q}`, th, v, strings.Repeat("w", 32769)), "b29", inv},
		{"run.start with user_message as number", q(`{"type":"run.start","id":"b30","thread_id":%q,"expected_state_version":%d,"user_message":5}`, th, v), "b30", inv},
		{"run.start on an unknown thread", q(`{"type":"run.start","id":"b31","thread_id":"thr_00000000000000000000000000","expected_state_version":%d,"user_message":"hi"}`, v), "b31", nf},
		{"run.start from an unknown checkpoint", q(`{"type":"run.start","id":"b32","thread_id":%q,"expected_state_version":%d,"resume_from_checkpoint_id":"cp_00000000000000000000000000"}`, th, v), "b32", chat.CodeCheckpointNotFound},
		{"run.start with a stale version", q(`{"type":"run.start","id":"b33","thread_id":%q,"expected_state_version":1,"user_message":"hi"}`, th), "b33", chat.CodeStateVersionConflict},
		{"run.cancel without run_id", `{"type":"run.cancel","id":"b34"}`, "b34", inv},
		{"run.cancel of an unknown run", `{"type":"run.cancel","id":"b35","run_id":"run_00000000000000000000000000"}`, "b35", nf},
		{"run.cancel with an empty reason", q(`{"type":"run.cancel","id":"b36","run_id":%q,"reason":""}`, runAck.RunID), "b36", inv},
		{"run.cancel with version as string", q(`{"type":"run.cancel","id":"b37","run_id":%q,"expected_state_version":"2"}`, runAck.RunID), "b37", inv},
		{"run.cancel of a completed run", q(`{"type":"run.cancel","id":"b38","run_id":%q}`, runAck.RunID), "b38", chat.CodeRunNotActive},
		{"fragment.save without last_seq", q(`{"type":"fragment.save","id":"b39","thread_id":%q,"message_id":%q,"expected_state_version":%d}`, th, reply.MessageID, v), "b39", inv},
		{"fragment.save with last_seq as string", q(`{"type":"fragment.save","id":"b40","thread_id":%q,"message_id":%q,"last_seq":"4","expected_state_version":%d}`, th, reply.MessageID, v), "b40", inv},
		{"fragment.save of a user message", q(`{"type":"fragment.save","id":"b41","thread_id":%q,"message_id":%q,"last_seq":2,"expected_state_version":%d}`, th, userMsg, v), "b41", nf},
		{"draft.delete without message_id", q(`{"type":"draft.delete","id":"b42","thread_id":%q,"expected_state_version":%d}`, th, v), "b42", inv},
		{"draft.delete without expected_state_version", q(`{"type":"draft.delete","id":"b43","thread_id":%q,"message_id":%q}`, th, reply.MessageID), "b43", inv},
		{"draft.delete of a published text message", q(`{"type":"draft.delete","id":"b44","thread_id":%q,"message_id":%q,"expected_state_version":%d}`, th, reply.MessageID, v), "b44", inv},
		{"thread.fork without from_checkpoint_id", q(`{"type":"thread.fork","id":"b45","thread_id":%q}`, th), "b45", inv},
		{"thread.fork from an unknown checkpoint", q(`{"type":"thread.fork","id":"b46","thread_id":%q,"from_checkpoint_id":"cp_00000000000000000000000000"}`, th), "b46", chat.CodeCheckpointNotFound},
		{"thread.fork of an unknown thread", q(`{"type":"thread.fork","id":"b47","thread_id":"thr_00000000000000000000000000","from_checkpoint_id":%q}`, cur.HeadCheckpointID), "b47", nf},
		{"thread.checkout without checkpoint_id", q(`{"type":"thread.checkout","id":"b48","thread_id":%q,"expected_state_version":%d}`, th, v), "b48", inv},
		{"thread.checkout without expected_state_version", q(`{"type":"thread.checkout","id":"b49","thread_id":%q,"checkpoint_id":%q}`, th, cur.HeadCheckpointID), "b49", inv},
		{"thread.checkout of an unknown checkpoint", q(`{"type":"thread.checkout","id":"b50","thread_id":%q,"checkpoint_id":"cp_00000000000000000000000000","expected_state_version":%d}`, th, v), "b50", chat.CodeCheckpointNotFound},
	}
	nThreads, before := h.threadCount(""), h.snapshotBytes(th)
	runBefore := string(h.call(http.MethodGet, "/api/runs/"+runAck.RunID, nil, http.StatusOK, nil).body)
	check := func(name string, m map[string]any, re, code string) {
		t.Helper()
		got, hasRe := m["re"]
		if m["type"] != "error" || m["error"] != code || (re == "" && hasRe) || (re != "" && got != re) {
			t.Errorf("%s: answered %v, want error %s with re %q", name, m, code, re)
		}
		if s := h.snapshotBytes(th); s != before {
			t.Errorf("%s: the thread changed: %.200s", name, s)
			before = s
		}
	}
	for _, tc := range cases {
		c.sendRaw(websocket.MessageText, []byte(tc.frame))
		check(tc.name, c.read(time.Now().Add(waitTimeout)), tc.re, tc.code)
	}
	c.sendRaw(websocket.MessageBinary, []byte(`{"type":"hello","id":"bin","tab_id":"x"}`))
	check("binary frame", c.read(time.Now().Add(waitTimeout)), "", inv)

	if n := h.threadCount(""); n != nThreads {
		t.Errorf("%d threads, want %d", n, nThreads)
	}
	if got := string(h.call(http.MethodGet, "/api/runs/"+runAck.RunID, nil, http.StatusOK, nil).body); got != runBefore {
		t.Errorf("the run changed:\n%s\n%s", runBefore, got)
	}
	// Still usable: a valid command is answered, and nothing was emitted.
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("bad input emitted %v", extra)
	}
	c.ack(map[string]any{"type": "hello", "tab_id": "after-bad-input"})
	next := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v, "user_message": "short valid"}), "run_id")
	c.untilEvent(th, chat.EventRunCompleted, next)
}

// padded is a hello command padded with spaces to n bytes.
func wsPadded(id string, n int) []byte {
	b := []byte(fmt.Sprintf(`{"type":"hello","id":%q,"tab_id":"big"}`, id))
	return append(b, []byte(strings.Repeat(" ", n-len(b)))...)
}

// TestWSFrameOverReadLimit: a frame at the limit is served; one over it
// closes the connection with 1009 and changes nothing.
func TestWSFrameOverReadLimit(t *testing.T) {
	t.Parallel()
	const limit = 4 << 10
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{ReadLimit: limit}))
	th := h.createThread("").ThreadID
	c := h.dial(t)
	c.subscribe(th, nil)
	c.untilEvent(th, chat.EventThreadSnapshot, "")
	before := h.snapshotBytes(th)
	c.sendRaw(websocket.MessageText, wsPadded("at-limit", limit))
	if a := c.answer("at-limit"); a["type"] != "ack" {
		t.Errorf("a frame of exactly the limit: %v", a)
	}
	c.sendRaw(websocket.MessageText, wsPadded("over", limit+1024))
	if ce := c.closed(); ce.Code != websocket.StatusMessageTooBig {
		t.Errorf("frame over the limit: closed with %d %q, want 1009", ce.Code, ce.Reason)
	}
	if _, ok := c.answered["over"]; ok {
		t.Errorf("the oversized frame was answered")
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("the thread changed")
	}
	h.dial(t).ack(map[string]any{"type": "hello", "tab_id": "next"})
}

// TestWSDefaultReadLimit: by default a frame of 1 MiB is served and a larger
// one closes the connection with 1009.
func TestWSDefaultReadLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	c := h.dial(t)
	c.sendRaw(websocket.MessageText, wsPadded("one-mib", 1<<20))
	if a := c.answer("one-mib"); a["type"] != "ack" {
		t.Errorf("a frame of 1 MiB: %v", a)
	}
	c.sendRaw(websocket.MessageText, wsPadded("over", 1<<20+1))
	if ce := c.closed(); ce.Code != websocket.StatusMessageTooBig {
		t.Errorf("frame over 1 MiB: closed with %d %q, want 1009", ce.Code, ce.Reason)
	}
}

// TestWSRateLimited: a flood of commands is answered in order, one answer
// each with its re, the excess rate_limited and not executed; the
// connection serves commands again once the rate allows.
func TestWSRateLimited(t *testing.T) {
	t.Parallel()
	ml := newMetricsLog()
	h := newHarness(t, 20*time.Millisecond, withWS(gateway.WSConfig{CommandRate: 100, CommandBurst: 5}), withMetrics(ml))
	th := h.createThread("").ThreadID
	c := h.dial(t)
	c.subscribe(th, nil)
	c.untilEvent(th, chat.EventThreadSnapshot, "")
	before := h.snapshotBytes(th)
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = c.post(map[string]any{"type": "hello", "tab_id": fmt.Sprintf("flood-%d", i)})
	}
	acked, limited, lastTab := 0, 0, ""
	for i, id := range ids {
		m := c.read(time.Now().Add(waitTimeout))
		switch {
		case m["re"] != id:
			t.Fatalf("answer %d is %v, want the answer to %s", i, m, id)
		case m["type"] == "ack":
			acked++
			lastTab = fmt.Sprintf("flood-%d", i)
		case m["error"] == chat.CodeRateLimited:
			limited++
		default:
			t.Errorf("flood answer %v", m)
		}
	}
	if acked < 4 || limited == 0 {
		t.Errorf("flood of %d: %d acked, %d rate_limited", len(ids), acked, limited)
	}
	if got := ml.count("limited:connection_commands"); got != limited {
		t.Errorf("%d rate_limited answers counted as connection_commands, want %d", got, limited)
	}
	if in := ml.count("frames_in"); in < len(ids)+1 || ml.count("bytes_in") < in*20 {
		t.Errorf("%d frames of %d bytes counted in, want at least %d", in, ml.count("bytes_in"), len(ids)+1)
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("the flood changed the thread")
	}
	// Usable again; what was refused was not executed: the tab is the one
	// the last accepted hello named.
	retry := func(fields map[string]any) map[string]any {
		t.Helper()
		deadline := time.Now().Add(waitTimeout)
		for time.Now().Before(deadline) {
			f := maps.Clone(fields)
			if m := c.cmd(f); m["error"] != chat.CodeRateLimited {
				if m["type"] != "ack" {
					t.Fatalf("%v answered %v", fields, m)
				}
				return m
			}
		}
		t.Fatalf("%v still rate limited after %v", fields, waitTimeout)
		return nil
	}
	runID := wsStr(retry(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "Explain token buckets"}), "run_id")
	c.untilDeltas(th, runID, 1)
	retry(map[string]any{"type": "run.cancel", "run_id": runID})
	ev := c.untilEvent(th, chat.EventRunCancelRequested, runID)
	if ev["requested_by"] != "tab:"+lastTab {
		t.Errorf("requested_by %v, want tab:%s (the last hello accepted)", ev["requested_by"], lastTab)
	}
	c.untilEvent(th, chat.EventRunCancelled, runID)
	if got := ml.count("ack:websocket"); got != 1 {
		t.Errorf("%d cancel acks measured, want 1", got)
	}
	if ml.count("frames_out") == 0 || ml.count("bytes_out") == 0 {
		t.Errorf("no frames counted out")
	}
	c.conn.CloseNow()
	if got := ml.waitCount("open:websocket", 0); got != 0 {
		t.Errorf("%d WebSocket connections counted open after the last closed", got)
	}
}

// TestWSShutdownClosesGoingAway: shutting the endpoint down closes every
// connection with 1001 and a reason to reconnect, refuses new ones, and
// never cancels a run.
func TestWSShutdownClosesGoingAway(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5*time.Millisecond)
	th, s := h.threadWithStream("")
	a, b := h.dial(t), h.dial(t)
	a.subscribe(th, wsAfter(0))
	b.subscribe(th, nil)
	runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "Explain graceful shutdown"}), "run_id")
	a.untilDeltas(th, runID, 2)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	shut := make(chan struct{})
	go func() { // it waits for the close handshakes, which need the clients reading
		defer close(shut)
		h.api.CloseWebSockets(ctx) // the harness calls it again at cleanup
	}()
	for _, c := range []*wsClient{a, b} {
		if ce := c.closed(); ce.Code != websocket.StatusGoingAway || !strings.Contains(ce.Reason, "reconnect") {
			t.Errorf("%s closed with %d %q, want 1001 and a reason to reconnect", c.name, ce.Code, ce.Reason)
		}
	}
	<-shut // bounded by ctx
	conn, _, err := websocket.Dial(ctx, h.wsURL(), nil)
	if err == nil {
		conn.CloseNow()
		t.Errorf("a connection was accepted after shutdown")
	}
	s.waitType(chat.EventRunCompleted, runID)
	for _, e := range s.events {
		if strings.HasPrefix(e.Type, "run.cancel") {
			t.Errorf("shutting the WebSockets down cancelled the run: %v", e)
		}
	}
	if run := h.run(runID); run.Status != chat.RunCompleted || run.CancelRequestedAt != nil {
		t.Errorf("run after shutdown: %+v", run)
	}
}

// TestWSOrigin: no Origin (a program), the server's own origin and a
// configured one connect; a foreign origin gets 403 in the protocol's error
// shape.
func TestWSOrigin(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{OriginPatterns: []string{"app.example.com"}}))
	dial := func(origin string) (*http.Response, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		hdr := http.Header{}
		if origin != "" {
			hdr.Set("Origin", origin)
		}
		conn, resp, err := websocket.Dial(ctx, h.wsURL(), &websocket.DialOptions{HTTPHeader: hdr})
		if err == nil {
			conn.CloseNow()
		}
		return resp, err
	}
	for _, origin := range []string{"", h.srv.URL, "https://app.example.com", "https://APP.example.com"} {
		if _, err := dial(origin); err != nil {
			t.Errorf("Origin %q refused: %v", origin, err)
		}
	}
	for _, origin := range []string{"https://evil.example", "https://app.example.com.evil.example", "null"} {
		resp, err := dial(origin)
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("Origin %q: %v, want 403", origin, err)
			continue
		}
		// The same check over plain HTTP shows the body.
		r := h.do(http.MethodGet, "/ws", nil, "Origin", origin, "Connection", "Upgrade", "Upgrade", "websocket",
			"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		h.wantError(t, r, http.StatusForbidden, chat.CodeForbidden)
	}
}
